use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::error::EngineLoadError;
use crate::lora::{AdapterWeights, LoraPair, LoraTarget};
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

/// A sequence in a hand-driven decode batch.
struct Row {
    tokens: Vec<u32>,
    adapter: Option<Arc<AdapterWeights>>,
}

/// Prefills all of `row` but its last token (in one chunk, alone) and adds it to `cache`.
fn prefill(model: &Llama, cache: &mut BatchKvCache, row: &Row) {
    let prompt = &row.tokens[..row.tokens.len() - 1];
    let mut kv = model.sequence_kv(prompt.len()).expect("kv");
    let lora = LoraBatch::uniform(row.adapter.as_ref()).expect("lora");
    let input = PackedInput { decode: None, chunks: vec![PrefillChunk { tokens: prompt, cache: &mut kv }] };
    model.forward_packed(input, &lora).expect("prefill");
    cache.push(&[(&kv.layers().expect("layers"), 1)]).expect("push");
}

/// Runs one decode step over `rows` (each feeding its last token) and checks every row's logits against a full
/// recomputation of its own sequence, alone. Then appends a random token to each row.
fn step_and_compare(model: &Llama, cache: &mut BatchKvCache, rows: &mut [Row], rng: &mut StdRng) {
    let adapters: Vec<_> = rows.iter().map(|row| row.adapter.as_ref()).collect();
    let lora = LoraBatch::for_rows(&adapters, None, &Device::Cpu).expect("lora");
    let last: Vec<u32> = rows.iter().map(|row| row.tokens[row.tokens.len() - 1]).collect();
    let positions: Vec<u32> = rows.iter().map(|row| row.tokens.len() as u32 - 1).collect();
    assert_eq!(cache.positions(), positions, "each row's next position is its cached length");
    let input = PackedInput { decode: Some((&last, cache)), chunks: Vec::new() };
    let logits = model.logits(&model.forward_packed(input, &lora).expect("step")).expect("logits");
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
    let mut rng = StdRng::seed_from_u64(3);
    let mut cache = BatchKvCache::new(2, model.context_length(), &Device::Cpu, DType::F32);
    let mut rows = vec![
        Row { tokens: random_tokens(&mut rng, 6, vocab), adapter: None },
        Row { tokens: random_tokens(&mut rng, 10, vocab), adapter: Some(meow.clone()) },
        Row { tokens: random_tokens(&mut rng, 3, vocab), adapter: Some(woof.clone()) },
    ];
    for row in &rows {
        prefill(&model, &mut cache, row);
    }
    for _ in 0..4 {
        step_and_compare(&model, &mut cache, &mut rows, &mut rng);
    }
    // The longest row leaves: the others keep their caches (and shared padding is trimmed).
    rows.remove(1);
    cache.retain(&[0, 2]).expect("retain");
    step_and_compare(&model, &mut cache, &mut rows, &mut rng);
    // A longer newcomer joins: the others are shifted right.
    let newcomer = Row { tokens: random_tokens(&mut rng, 30, vocab), adapter: Some(meow) };
    prefill(&model, &mut cache, &newcomer);
    rows.push(newcomer);
    for _ in 0..3 {
        step_and_compare(&model, &mut cache, &mut rows, &mut rng);
    }
}

/// A sequence being prefilled chunk by chunk in packed passes.
struct Prefilling {
    prompt: Vec<u32>,
    adapter: Option<Arc<AdapterWeights>>,
    chunks: Vec<usize>,
    cache: SequenceKv,
}

#[test]
fn packed_chunks_and_decode_rows_equal_full_recomputation() {
    let config = tiny_config(vec![]);
    let (meow, woof) = (tiny_adapter(&config, 1), tiny_adapter(&config, 2));
    let model = tiny_model(config);
    let vocab = model.config().vocab_size;
    let mut rng = StdRng::seed_from_u64(5);
    let mut cache = BatchKvCache::new(2, model.context_length(), &Device::Cpu, DType::F32);
    let mut rows = vec![
        Row { tokens: random_tokens(&mut rng, 9, vocab), adapter: Some(woof.clone()) },
        Row { tokens: random_tokens(&mut rng, 4, vocab), adapter: None },
    ];
    for row in &rows {
        prefill(&model, &mut cache, row);
    }
    let mut prefilling = vec![
        Prefilling {
            prompt: random_tokens(&mut rng, 13, vocab),
            adapter: Some(meow),
            chunks: vec![5, 4, 4],
            cache: model.sequence_kv(13).expect("kv"),
        },
        Prefilling {
            prompt: random_tokens(&mut rng, 7, vocab),
            adapter: Some(woof),
            chunks: vec![3, 4, 0],
            cache: model.sequence_kv(7).expect("kv"),
        },
        Prefilling {
            prompt: random_tokens(&mut rng, 2, vocab),
            adapter: None,
            chunks: vec![0, 2, 0],
            cache: model.sequence_kv(2).expect("kv"),
        },
    ];
    for pass in 0..3 {
        let mut adapters: Vec<Option<&Arc<AdapterWeights>>> = rows.iter().map(|row| row.adapter.as_ref()).collect();
        let mut spans = Vec::new();
        for sequence in &prefilling {
            let start = sequence.cache.len();
            let len = sequence.chunks[pass];
            if len > 0 {
                adapters.extend(std::iter::repeat_n(sequence.adapter.as_ref(), len));
                spans.push((start, len));
            }
        }
        let lora = LoraBatch::for_rows(&adapters, None, &Device::Cpu).expect("lora");
        let last: Vec<u32> = rows.iter().map(|row| row.tokens[row.tokens.len() - 1]).collect();
        let chunks = prefilling
            .iter_mut()
            .filter(|sequence| sequence.chunks[pass] > 0)
            .map(|sequence| {
                let start = sequence.cache.len();
                PrefillChunk {
                    tokens: &sequence.prompt[start..start + sequence.chunks[pass]],
                    cache: &mut sequence.cache,
                }
            })
            .collect();
        let hidden =
            model.forward_packed(PackedInput { decode: Some((&last, &mut cache)), chunks }, &lora).expect("pass");
        let logits = model.logits(&hidden).expect("logits");
        for (index, row) in rows.iter_mut().enumerate() {
            let diff =
                max_abs_diff(&logits.get(index).expect("row"), &full_logits(&model, &row.tokens, row.adapter.as_ref()));
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
    // A prefilled sequence joins the batch with its own cache and decodes on like the others.
    for sequence in prefilling.drain(..2) {
        assert_eq!(sequence.cache.len(), sequence.prompt.len());
        let layers = sequence.cache.layers().expect("layers");
        cache.push(&[(&layers, 1)]).expect("join");
        let mut tokens = sequence.prompt;
        tokens.push(rng.random_range(0..vocab as u32));
        rows.push(Row { tokens, adapter: sequence.adapter });
    }
    for _ in 0..2 {
        step_and_compare(&model, &mut cache, &mut rows, &mut rng);
    }
}

#[test]
fn a_row_taken_out_of_the_batch_rejoins_without_any_prefill() {
    let config = tiny_config(vec![]);
    let meow = tiny_adapter(&config, 1);
    let model = tiny_model(config);
    let mut rng = StdRng::seed_from_u64(6);
    let mut cache = BatchKvCache::new(2, model.context_length(), &Device::Cpu, DType::F32);
    let mut rows = vec![
        Row { tokens: random_tokens(&mut rng, 5, 64), adapter: None },
        Row { tokens: random_tokens(&mut rng, 8, 64), adapter: Some(meow) },
    ];
    for row in &rows {
        prefill(&model, &mut cache, row);
    }
    step_and_compare(&model, &mut cache, &mut rows, &mut rng);
    let parked = cache.row(1).expect("row");
    let parked_row = rows.remove(1);
    cache.retain(&[0]).expect("retain");
    step_and_compare(&model, &mut cache, &mut rows, &mut rng);
    cache.push(&[(&parked, 1)]).expect("rejoin");
    rows.push(parked_row);
    for _ in 0..2 {
        step_and_compare(&model, &mut cache, &mut rows, &mut rng);
    }
}

#[test]
fn cached_decode_grows_past_its_first_capacity() {
    let model = tiny_model(tiny_config(vec![]));
    let mut rng = StdRng::seed_from_u64(4);
    let mut cache = BatchKvCache::new(2, model.context_length(), &Device::Cpu, DType::F32);
    let mut rows = vec![Row { tokens: random_tokens(&mut rng, 60, 64), adapter: None }];
    prefill(&model, &mut cache, &rows[0]);
    for _ in 0..8 {
        step_and_compare(&model, &mut cache, &mut rows, &mut rng);
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
    let mut cache = BatchKvCache::new(2, model.context_length(), &Device::Cpu, DType::F32);
    let mut rows = vec![Row { tokens: random_tokens(&mut rng, 5, 64), adapter: None }];
    prefill(&model, &mut cache, &rows[0]);
    for _ in 0..3 {
        step_and_compare(&model, &mut cache, &mut rows, &mut rng);
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

/// Membership changes in random order — rows joining (shorter and longer than the batch), leaving (holes filled
/// from the end, or the rows gathered anew), the batch shrinking and its padding trimmed — never change what any
/// row computes: every step's logits equal a full recomputation of each row's own sequence.
#[test]
fn random_joins_and_leaves_keep_every_row_equal_to_full_recomputation() {
    let config = tiny_config(vec![]);
    let meow = tiny_adapter(&config, 1);
    let model = tiny_model(config);
    let vocab = model.config().vocab_size;
    for seed in 0..4u64 {
        let mut rng = StdRng::seed_from_u64(100 + seed);
        let cache = BatchKvCache::new(2, model.context_length(), &Device::Cpu, DType::F32);
        // Half the runs reserve rows up front (as the CPU scheduler does), half grow them.
        let mut cache = if seed % 2 == 0 { cache.reserving_rows(24) } else { cache };
        let mut rows: Vec<Row> = Vec::new();
        for _ in 0..24 {
            match rng.random_range(0..4) {
                0 | 1 if rows.len() < 20 => {
                    for _ in 0..rng.random_range(1..4) {
                        let len = rng.random_range(2..48);
                        let adapter = rng.random_bool(0.5).then(|| meow.clone());
                        let row = Row { tokens: random_tokens(&mut rng, len, vocab), adapter };
                        prefill(&model, &mut cache, &row);
                        rows.push(row);
                    }
                }
                2 if !rows.is_empty() => {
                    let kept: Vec<bool> = rows.iter().map(|_| rng.random_bool(0.6)).collect();
                    // The scheduler's order (the last kept rows fill the holes), or the rows gathered in order.
                    let order = if rng.random_bool(0.5) {
                        fill_holes_from_the_end(&kept)
                    } else {
                        (0..rows.len()).filter(|&index| kept[index]).collect()
                    };
                    cache.retain(&order).expect("retain");
                    let mut taken: Vec<Option<Row>> = rows.drain(..).map(Some).collect();
                    rows = order.iter().map(|&index| taken[index].take().expect("kept once")).collect();
                }
                _ => {}
            }
            if !rows.is_empty() {
                step_and_compare(&model, &mut cache, &mut rows, &mut rng);
            }
        }
    }
}
