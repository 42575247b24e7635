use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::error::EngineLoadError;
use crate::lora::{AdapterWeights, LoraPair, LoraTarget};
use crate::model::{DecodeRow, PackedInput, PrefillChunk, SequenceBlocks};
use crate::test_support::{TempDir, max_abs_diff, tiny_adapter, tiny_config, tiny_model, tiny_weights};

/// The next-token logits after `tokens`, computed from scratch.
fn full_logits(model: &Llama, tokens: &[u32], adapter: Option<&Arc<AdapterWeights>>) -> Tensor {
    let input = Tensor::from_slice(tokens, (1, tokens.len()), &Device::Cpu).expect("tokens");
    let lora = LoraBatch::uniform(adapter).expect("lora");
    let hidden = model.forward_sequences(&input, &lora).expect("forward");
    model.logits(&hidden.narrow(1, tokens.len() - 1, 1).expect("last")).expect("logits").flatten_all().expect("flat")
}

fn random_tokens(rng: &mut StdRng, len: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|_| rng.random_range(0..vocab as u32)).collect()
}

/// A sequence in a hand-driven decode batch: its tokens (the last one fed at its next step) and its blocks.
struct Row {
    tokens: Vec<u32>,
    adapter: Option<Arc<AdapterWeights>>,
    blocks: SequenceBlocks,
}

/// Both ways of reading the blocks: in place (the CPU kernels) and gathered (what devices do), `blocks` each.
fn caches(model: &Llama, blocks: usize) -> [KvCache; 2] {
    [model.kv_cache(blocks, false).expect("cache"), model.kv_cache(blocks, false).expect("cache").gathering()]
}

/// Runs `tokens` as one chunk of `blocks`, under `adapter`.
fn run_chunk(
    model: &Llama,
    cache: &KvCache,
    blocks: &mut SequenceBlocks,
    tokens: &[u32],
    adapter: Option<&Arc<AdapterWeights>>,
) {
    cache.reserve(blocks, tokens.len()).expect("room");
    let lora = LoraBatch::uniform(adapter).expect("lora");
    let input = PackedInput { decode: Vec::new(), chunks: vec![PrefillChunk { tokens, blocks }] };
    model.forward_packed(input, &lora, cache).expect("prefill");
}

/// A row whose every token but the last is prefilled (in one chunk, alone).
fn prefilled(model: &Llama, cache: &KvCache, tokens: Vec<u32>, adapter: Option<Arc<AdapterWeights>>) -> Row {
    let mut blocks = SequenceBlocks::new(cache.pool(), None);
    run_chunk(model, cache, &mut blocks, &tokens[..tokens.len() - 1], adapter.as_ref());
    Row { tokens, adapter, blocks }
}

/// Runs one decode step over `rows` (each feeding its last token) and checks every row's logits against a full
/// recomputation of its own sequence, alone. Then appends a random token to each row.
fn step_and_compare(model: &Llama, cache: &KvCache, rows: &mut [Row], rng: &mut StdRng) {
    for row in rows.iter_mut() {
        assert_eq!(row.blocks.len(), row.tokens.len() - 1, "each row's next position is its cached length");
        cache.reserve(&mut row.blocks, 1).expect("room");
    }
    let adapters: Vec<_> = rows.iter().map(|row| row.adapter.clone()).collect();
    let adapters: Vec<_> = adapters.iter().map(Option::as_ref).collect();
    let lora = LoraBatch::for_rows(&adapters, None, &Device::Cpu).expect("lora");
    let decode = rows
        .iter_mut()
        .map(|row| DecodeRow { token: row.tokens[row.tokens.len() - 1], blocks: &mut row.blocks })
        .collect();
    let input = PackedInput { decode, chunks: Vec::new() };
    let logits = model.logits(&model.forward_packed(input, &lora, cache).expect("step")).expect("logits");
    for (index, row) in rows.iter_mut().enumerate() {
        let expected = full_logits(model, &row.tokens, row.adapter.as_ref());
        let got = logits.get(index).expect("row");
        let diff = max_abs_diff(&got, &expected);
        assert!(diff < 1e-4, "row {index} (len {}) differs by {diff}", row.tokens.len());
        row.tokens.push(rng.random_range(0..model.config().vocab_size as u32));
    }
}

#[test]
fn cached_mixed_adapter_decode_equals_full_recomputation_through_membership_changes() {
    let config = tiny_config(vec![]);
    let (meow, woof) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    let model = tiny_model(config);
    let vocab = model.config().vocab_size;
    for cache in caches(&model, 64) {
        let mut rng = StdRng::seed_from_u64(3);
        let mut rows = vec![
            prefilled(&model, &cache, random_tokens(&mut rng, 6, vocab), None),
            prefilled(&model, &cache, random_tokens(&mut rng, 10, vocab), Some(meow.clone())),
            prefilled(&model, &cache, random_tokens(&mut rng, 3, vocab), Some(woof.clone())),
        ];
        for _ in 0..4 {
            step_and_compare(&model, &cache, &mut rows, &mut rng);
        }
        // The longest row leaves: the others keep their blocks.
        rows.remove(1);
        step_and_compare(&model, &cache, &mut rows, &mut rng);
        // A longer newcomer joins.
        rows.push(prefilled(&model, &cache, random_tokens(&mut rng, 30, vocab), Some(meow.clone())));
        for _ in 0..3 {
            step_and_compare(&model, &cache, &mut rows, &mut rng);
        }
        drop(rows);
        assert_eq!(cache.pool().usage().used, 0, "every block given back");
        cache.pool().check();
    }
}

/// A sequence being prefilled chunk by chunk in packed passes.
struct Prefilling {
    prompt: Vec<u32>,
    adapter: Option<Arc<AdapterWeights>>,
    chunks: Vec<usize>,
    blocks: SequenceBlocks,
}

#[test]
fn packed_chunks_and_decode_rows_equal_full_recomputation() {
    let config = tiny_config(vec![]);
    let (meow, woof) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    let model = tiny_model(config);
    let vocab = model.config().vocab_size;
    for cache in caches(&model, 64) {
        let mut rng = StdRng::seed_from_u64(5);
        let mut rows = vec![
            prefilled(&model, &cache, random_tokens(&mut rng, 9, vocab), Some(woof.clone())),
            prefilled(&model, &cache, random_tokens(&mut rng, 4, vocab), None),
        ];
        let mut prefilling = vec![
            Prefilling {
                prompt: random_tokens(&mut rng, 37, vocab),
                adapter: Some(meow.clone()),
                chunks: vec![5, 20, 12],
                blocks: SequenceBlocks::new(cache.pool(), None),
            },
            Prefilling {
                prompt: random_tokens(&mut rng, 7, vocab),
                adapter: Some(woof.clone()),
                chunks: vec![3, 4, 0],
                blocks: SequenceBlocks::new(cache.pool(), None),
            },
            Prefilling {
                prompt: random_tokens(&mut rng, 2, vocab),
                adapter: None,
                chunks: vec![0, 2, 0],
                blocks: SequenceBlocks::new(cache.pool(), None),
            },
        ];
        for pass in 0..3 {
            for row in &mut rows {
                cache.reserve(&mut row.blocks, 1).expect("room");
            }
            for sequence in &mut prefilling {
                cache.reserve(&mut sequence.blocks, sequence.chunks[pass]).expect("room");
            }
            let mut adapters: Vec<Option<&Arc<AdapterWeights>>> = rows.iter().map(|row| row.adapter.as_ref()).collect();
            let mut spans = Vec::new();
            for sequence in &prefilling {
                let start = sequence.blocks.len();
                let len = sequence.chunks[pass];
                if len > 0 {
                    adapters.extend(std::iter::repeat_n(sequence.adapter.as_ref(), len));
                    spans.push((start, len));
                }
            }
            let lora = LoraBatch::for_rows(&adapters, None, &Device::Cpu).expect("lora");
            let decode = rows
                .iter_mut()
                .map(|row| DecodeRow { token: row.tokens[row.tokens.len() - 1], blocks: &mut row.blocks })
                .collect();
            let chunks = prefilling
                .iter_mut()
                .filter(|sequence| sequence.chunks[pass] > 0)
                .map(|sequence| {
                    let start = sequence.blocks.len();
                    PrefillChunk {
                        tokens: &sequence.prompt[start..start + sequence.chunks[pass]],
                        blocks: &mut sequence.blocks,
                    }
                })
                .collect();
            let hidden = model.forward_packed(PackedInput { decode, chunks }, &lora, &cache).expect("pass");
            let logits = model.logits(&hidden).expect("logits");
            for (index, row) in rows.iter_mut().enumerate() {
                let expected = full_logits(&model, &row.tokens, row.adapter.as_ref());
                let diff = max_abs_diff(&logits.get(index).expect("row"), &expected);
                assert!(diff < 1e-4, "pass {pass}: decode row {index} differs by {diff}");
                row.tokens.push(rng.random_range(0..vocab as u32));
            }
            let mut offset = rows.len();
            let active = prefilling.iter().filter(|sequence| sequence.chunks[pass] > 0);
            for (sequence, (start, len)) in active.zip(spans) {
                for position in start..start + len {
                    let expected = full_logits(&model, &sequence.prompt[..=position], sequence.adapter.as_ref());
                    let diff = max_abs_diff(&logits.get(offset).expect("token"), &expected);
                    assert!(diff < 1e-4, "pass {pass}: position {position} of a chunk differs by {diff}");
                    offset += 1;
                }
            }
            assert_eq!(offset, logits.dim(0).expect("tokens"));
        }
        // A prefilled sequence joins the decode rows with its blocks and decodes on like the others.
        for sequence in prefilling.drain(..2) {
            assert_eq!(sequence.blocks.len(), sequence.prompt.len());
            let mut tokens = sequence.prompt;
            tokens.push(rng.random_range(0..vocab as u32));
            rows.push(Row { tokens, adapter: sequence.adapter, blocks: sequence.blocks });
        }
        for _ in 0..2 {
            step_and_compare(&model, &cache, &mut rows, &mut rng);
        }
    }
}

#[test]
fn a_row_taken_out_of_the_decode_rows_rejoins_without_any_prefill() {
    let config = tiny_config(vec![]);
    let meow = tiny_adapter(&config, 1);
    let model = tiny_model(config);
    let mut rng = StdRng::seed_from_u64(6);
    let cache = model.kv_cache(16, false).expect("cache");
    let mut rows = vec![
        prefilled(&model, &cache, random_tokens(&mut rng, 5, 64), None),
        prefilled(&model, &cache, random_tokens(&mut rng, 8, 64), Some(meow)),
    ];
    step_and_compare(&model, &cache, &mut rows, &mut rng);
    let parked = rows.remove(1);
    let used = cache.pool().usage().used;
    step_and_compare(&model, &cache, &mut rows, &mut rng);
    assert_eq!(cache.pool().usage().used, used, "the parked row kept its blocks; the other needed no new one");
    rows.push(parked);
    for _ in 0..2 {
        step_and_compare(&model, &cache, &mut rows, &mut rng);
    }
}

#[test]
fn cached_decode_grows_past_many_blocks() {
    let model = tiny_model(tiny_config(vec![]));
    let mut rng = StdRng::seed_from_u64(4);
    for cache in caches(&model, 16) {
        let mut rows = vec![prefilled(&model, &cache, random_tokens(&mut rng, 60, 64), None)];
        for _ in 0..8 {
            step_and_compare(&model, &cache, &mut rows, &mut rng);
        }
        assert_eq!(rows[0].blocks.blocks().len(), 68usize.div_ceil(BLOCK_SIZE));
    }
}

#[test]
fn a_lora_with_zero_b_is_the_base_model() {
    let config = tiny_config(vec![]);
    let zero_b = Arc::new(AdapterWeights::new(
        (0..config.num_layers)
            .map(|_| {
                LoraTarget::ALL.map(|target| {
                    let (fan_in, fan_out) = target.features(&config);
                    let a = Tensor::ones((4, fan_in), DType::F32, &Device::Cpu).expect("A");
                    let b = Tensor::zeros((fan_out, 4), DType::F32, &Device::Cpu).expect("B");
                    Some(LoraPair::new(&a, &b, 2.0).expect("pair"))
                })
            })
            .collect(),
    ));
    let model = tiny_model(config);
    let tokens = [1, 5, 9, 2, 33];
    let diff = max_abs_diff(&full_logits(&model, &tokens, Some(&zero_b)), &full_logits(&model, &tokens, None));
    assert!(diff < 1e-6, "{diff}");
}

#[test]
fn unmerged_lora_equals_the_merged_weights() {
    let config = tiny_config(vec![]);
    let adapter = tiny_adapter(&config, 5);
    let base_weights = tiny_weights(&config, 7);
    let mut merged = base_weights.clone();
    for layer in 0..config.num_layers {
        for target in LoraTarget::ALL {
            let name = format!("{}.weight", target.module_path(layer));
            let delta = adapter.pair(layer, target).expect("pair").delta_weight().expect("delta");
            let weight = (&merged[&name] + delta).expect("merge");
            merged.insert(name, weight);
        }
    }
    let base = Llama::from_weights(config.clone(), base_weights, &Device::Cpu, DType::F32, None).expect("base");
    let merged = Llama::from_weights(config, merged, &Device::Cpu, DType::F32, None).expect("merged");
    let tokens = [3, 1, 4, 1, 5, 9, 2, 6];
    let unmerged = full_logits(&base, &tokens, Some(&adapter));
    let diff = max_abs_diff(&unmerged, &full_logits(&merged, &tokens, None));
    assert!(diff < 1e-4, "{diff}");
    let changed = max_abs_diff(&unmerged, &full_logits(&base, &tokens, None));
    assert!(changed > 1e-2, "the adapter must change the logits (by {changed})");
}

/// Writes `weights` as a Hugging Face directory with two shards and their index.
fn write_sharded(dir: &std::path::Path, config: serde_json::Value, weights: &WeightMap) {
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let mut shards: [BTreeMap<String, Tensor>; 2] = Default::default();
    let mut index = serde_json::Map::new();
    for (position, (name, tensor)) in weights.iter().enumerate() {
        shards[position % 2].insert(name.clone(), tensor.clone());
        index.insert(name.clone(), format!("model-0000{}-of-00002.safetensors", position % 2 + 1).into());
    }
    for (shard, tensors) in shards.iter().enumerate() {
        let tensors: std::collections::HashMap<_, _> = tensors.clone().into_iter().collect();
        candle_core::safetensors::save(&tensors, dir.join(format!("model-0000{}-of-00002.safetensors", shard + 1)))
            .expect("shard");
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": index });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
}

#[test]
fn sharded_qwen2_checkpoints_with_biases_and_tied_embeddings_load_and_decode_consistently() {
    let mut config = tiny_config(vec![]);
    config.tie_word_embeddings = true;
    let mut weights = tiny_weights(&config, 11);
    let mut rng = StdRng::seed_from_u64(12);
    for layer in 0..config.num_layers {
        for target in [LoraTarget::Q, LoraTarget::K, LoraTarget::V] {
            let out = target.features(&config).1;
            let bias = crate::model::random_tensor(&mut rng, out, 0.5, &Device::Cpu).expect("bias");
            weights.insert(format!("{}.bias", target.module_path(layer)), bias);
        }
    }
    let json = serde_json::json!({
        "model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "tie_word_embeddings": true, "eos_token_id": [5, 6]
    });
    let dir = TempDir::new("sharded");
    write_sharded(dir.path(), json, &weights);
    let model = Llama::load(dir.path(), &Device::Cpu, DType::F32, Some(128)).expect("load");
    assert_eq!(model.context_length(), 128, "the served context is capped");
    assert_eq!(model.config().eos_token_ids, vec![5, 6]);

    let without_biases: WeightMap = weights.into_iter().filter(|(name, _)| !name.ends_with(".bias")).collect();
    let plain = Llama::from_weights(model.config().clone(), without_biases, &Device::Cpu, DType::F32, None)
        .expect("without biases");
    let tokens = [7, 8, 9, 10];
    assert!(max_abs_diff(&full_logits(&model, &tokens, None), &full_logits(&plain, &tokens, None)) > 1e-3);

    let mut rng = StdRng::seed_from_u64(13);
    let cache = model.kv_cache(8, false).expect("cache");
    let mut rows = vec![prefilled(&model, &cache, random_tokens(&mut rng, 5, 64), None)];
    for _ in 0..3 {
        step_and_compare(&model, &cache, &mut rows, &mut rng);
    }
}

#[test]
fn missing_and_misshapen_tensors_are_load_errors() {
    let config = tiny_config(vec![]);
    let mut missing = tiny_weights(&config, 1);
    missing.remove("model.layers.1.mlp.down_proj.weight");
    let mut misshapen = tiny_weights(&config, 1);
    misshapen.insert("model.norm.weight".into(), Tensor::ones(31, DType::F32, &Device::Cpu).expect("norm"));
    for (weights, needle) in
        [(missing, "missing model.layers.1.mlp.down_proj.weight"), (misshapen, "model.norm.weight")]
    {
        match Llama::from_weights(config.clone(), weights, &Device::Cpu, DType::F32, None) {
            Err(EngineLoadError::Weights(reason)) => assert!(reason.contains(needle), "{reason}"),
            other => panic!("expected a weights error, got {other:?}"),
        }
    }
}

/// Rows joining, leaving and forking (sharing their blocks, the shared partly filled one copied on the next write)
/// in random order, in a pool small enough that blocks are reused, never change what any row computes: every step's
/// logits equal a full recomputation of each row's own sequence, and every block comes back.
#[test]
fn random_joins_leaves_and_forks_keep_every_row_equal_to_full_recomputation() {
    let config = tiny_config(vec![]);
    let meow = tiny_adapter(&config, 1);
    let model = tiny_model(config);
    let vocab = model.config().vocab_size;
    for seed in 0..4u64 {
        let mut rng = StdRng::seed_from_u64(100 + seed);
        let cache = model.kv_cache(96, false).expect("cache");
        let cache = if seed % 2 == 0 { cache } else { cache.gathering() };
        let mut rows: Vec<Row> = Vec::new();
        for _ in 0..24 {
            match rng.random_range(0..5) {
                0 | 1 if rows.len() < 20 => {
                    for _ in 0..rng.random_range(1..4) {
                        let len = rng.random_range(2..48);
                        let adapter = rng.random_bool(0.5).then(|| meow.clone());
                        rows.push(prefilled(&model, &cache, random_tokens(&mut rng, len, vocab), adapter));
                    }
                }
                2 if !rows.is_empty() => {
                    let kept: Vec<bool> = rows.iter().map(|_| rng.random_bool(0.6)).collect();
                    let mut index = 0;
                    rows.retain(|_| {
                        index += 1;
                        kept[index - 1]
                    });
                }
                3 if !rows.is_empty() && rows.len() < 20 => {
                    // Another sequence continuing from the same keys and values, with another next token.
                    let original = &rows[rng.random_range(0..rows.len())];
                    let mut tokens = original.tokens.clone();
                    *tokens.last_mut().expect("a token") = rng.random_range(0..vocab as u32);
                    let fork = Row { tokens, adapter: original.adapter.clone(), blocks: original.blocks.fork() };
                    rows.push(fork);
                }
                _ => {}
            }
            if !rows.is_empty() {
                step_and_compare(&model, &cache, &mut rows, &mut rng);
            }
            cache.pool().check();
        }
        drop(rows);
        assert_eq!(cache.pool().usage().used, 0, "seed {seed}: every block given back");
    }
}
