//! GGUF files written here the way llama.cpp's converter writes them (its tensor names, its q/k row permutation,
//! its metadata keys) from tiny random Hugging Face models, read back and compared with the Hugging Face model.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::*;
use crate::config::QuantizedWeights;
use crate::lora::{LoraBatch, LoraTarget};
use crate::model::{Llama, PackedInput, PrefillChunk, SequenceBlocks, WeightMap};
use crate::test_support::{TempDir, max_abs_diff, tiny_adapter, tiny_config, tiny_weights};

/// llama.cpp's `permute` (convert_hf_to_gguf.py) of a query or key projection `(rows, in)` for its RoPE, written
/// with tensor ops: `w.reshape(heads, 2, rows / heads / 2, in).swapaxes(1, 2).reshape(rows, in)`.
fn llama_cpp_permute(weight: &Tensor, heads: usize) -> Tensor {
    let (rows, columns) = weight.dims2().expect("2-D");
    weight
        .reshape((heads, 2, rows / heads / 2, columns))
        .and_then(|w| w.transpose(1, 2))
        .and_then(|w| w.contiguous())
        .and_then(|w| w.reshape((rows, columns)))
        .expect("permute")
}

const GGUF_PROJECTIONS: [&str; 7] = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];

/// A tiny byte-level BPE vocabulary: three control tokens, letters, digits, `Ġ` (space), and merged tokens.
fn vocabulary(size: usize) -> (Vec<String>, Vec<String>) {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from).into();
    tokens.extend(('a'..='z').chain('0'..='9').map(String::from));
    tokens.push("Ġ".into());
    let merges = ["a b", "1 2", "Ġ a"];
    tokens.extend(merges.iter().map(|merge| merge.replace(' ', "")));
    let mut filler = 0;
    while tokens.len() < size {
        tokens.push(format!("<unused{filler}>"));
        filler += 1;
    }
    (tokens, merges.map(String::from).into())
}

/// Writes `weights` (a Hugging Face model of `config`) as a `llama` GGUF file, tensors quantized to `dtype`.
fn write_gguf(path: &Path, config: &ModelConfig, weights: &WeightMap, dtype: GgmlDType, pre: &str) {
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut add = |name: String, tensor: &Tensor, quantize: bool| {
        let kind = if quantize { dtype } else { GgmlDType::F32 };
        tensors.push((name, QTensor::quantize(tensor, kind).expect("quantize")));
    };
    add("token_embd.weight".into(), &weights["model.embed_tokens.weight"], true);
    add("output_norm.weight".into(), &weights["model.norm.weight"], false);
    if let Some(head) = weights.get("lm_head.weight") {
        add("output.weight".into(), head, true);
    }
    for layer in 0..config.num_layers {
        add(
            format!("blk.{layer}.attn_norm.weight"),
            &weights[&format!("model.layers.{layer}.input_layernorm.weight")],
            false,
        );
        add(
            format!("blk.{layer}.ffn_norm.weight"),
            &weights[&format!("model.layers.{layer}.post_attention_layernorm.weight")],
            false,
        );
        for (target, gguf_name) in LoraTarget::ALL.iter().zip(GGUF_PROJECTIONS) {
            let weight = &weights[&format!("{}.weight", target.module_path(layer))];
            let weight = match target {
                LoraTarget::Q => llama_cpp_permute(weight, config.num_heads),
                LoraTarget::K => llama_cpp_permute(weight, config.num_kv_heads),
                _ => weight.clone(),
            };
            add(format!("blk.{layer}.{gguf_name}.weight"), &weight, true);
        }
    }
    let (tokens, merges) = vocabulary(config.vocab_size);
    let strings = |values: &[String]| Value::Array(values.iter().cloned().map(Value::String).collect());
    let types: Vec<Value> = (0..tokens.len()).map(|id| Value::I32(if id < 3 { 3 } else { 1 })).collect();
    let metadata: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(config.num_layers as u32)),
        ("llama.context_length", Value::U32(config.max_position_embeddings as u32)),
        ("llama.embedding_length", Value::U32(config.hidden_size as u32)),
        ("llama.feed_forward_length", Value::U32(config.intermediate_size as u32)),
        ("llama.attention.head_count", Value::U32(config.num_heads as u32)),
        ("llama.attention.head_count_kv", Value::U32(config.num_kv_heads as u32)),
        ("llama.rope.freq_base", Value::F32(config.rope_theta as f32)),
        ("llama.rope.dimension_count", Value::U32(config.head_dim as u32)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(config.rms_norm_eps as f32)),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.merges", strings(&merges)),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        ("tokenizer.chat_template", Value::String("{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}".into())),
    ];
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(key, value)| (*key, value)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(name, tensor)| (name.as_str(), tensor)).collect();
    let mut file = std::fs::File::create(path).expect("create gguf");
    gguf_file::write(&mut file, &metadata, &tensors).expect("write gguf");
}

/// The last position's logits of `model` after `tokens`.
fn logits(model: &Llama, tokens: &[u32]) -> Tensor {
    let input = Tensor::from_slice(tokens, (1, tokens.len()), &Device::Cpu).expect("tokens");
    let lora = LoraBatch::uniform(None).expect("lora");
    let hidden = model.forward_sequences(&input, &lora).expect("forward");
    model.logits(&hidden).expect("logits").flatten_to(1).expect("flat")
}

/// `weights` after a round trip through `dtype` (quantization works on rows, so it commutes with llama.cpp's row
/// permutation): what a GGUF file of that type holds, in the Hugging Face layout.
fn round_trip(weights: &WeightMap, dtype: GgmlDType) -> WeightMap {
    weights
        .iter()
        .map(|(name, tensor)| {
            let kept = if tensor.rank() == 2 {
                QTensor::quantize(tensor, dtype).and_then(|q| q.dequantize(&Device::Cpu)).expect("round trip")
            } else {
                tensor.clone()
            };
            (name.clone(), kept)
        })
        .collect()
}

fn assert_same_model(mut config: ModelConfig, weights: &WeightMap, dtype: GgmlDType, label: &str) {
    // GGUF stores the epsilon as an f32.
    config.rms_norm_eps = f64::from(config.rms_norm_eps as f32);
    let dir = TempDir::new(label);
    let path = dir.path().join("model.gguf");
    write_gguf(&path, &config, weights, dtype, "smollm");
    let file = GgufFile::open(&path).expect("open");
    let read = file.model_config().expect("config");
    assert_eq!(read, config, "the metadata describes the same model");
    let from_gguf =
        Llama::load_gguf(&file, &Device::Cpu, DType::F32, None, QuantizedWeights::Dequantized).expect("load gguf");
    let expected = Llama::from_weights(config, round_trip(weights, dtype), &Device::Cpu, DType::F32, None).expect("hf");
    let tokens: Vec<u32> = (0..24).map(|i| (i * 7 + 3) % 64).collect();
    let diff = max_abs_diff(&logits(&from_gguf, &tokens), &logits(&expected, &tokens));
    assert!(diff < 1e-4, "{label}: the GGUF model's logits differ by {diff}");
}

#[test]
fn a_llama_cpp_f32_file_is_the_hugging_face_model_with_q_and_k_rows_restored() {
    let mut config = tiny_config(vec![2]);
    config.tie_word_embeddings = true;
    let weights = tiny_weights(&config, 11);
    assert!(!weights.contains_key("lm_head.weight"));
    assert_same_model(config, &weights, GgmlDType::F32, "gguf-f32");
}

#[test]
fn a_quantized_file_is_its_dequantized_weights_in_the_hugging_face_layout() {
    let mut config = tiny_config(vec![2]);
    config.intermediate_size = 64;
    let weights = tiny_weights(&config, 12);
    assert_same_model(config.clone(), &weights, GgmlDType::Q8_0, "gguf-q8");
    assert_same_model(config, &weights, GgmlDType::Q4_1, "gguf-q4-1");
}

#[test]
fn unpermuting_restores_every_head_of_every_row_count() {
    for (heads, head_dim) in [(1, 2), (3, 4), (9, 64)] {
        let rows = heads * head_dim;
        let original: Vec<f32> = (0..rows * 3).map(|i| i as f32).collect();
        let tensor = Tensor::from_vec(original.clone(), (rows, 3), &Device::Cpu).expect("tensor");
        let permuted: Vec<f32> =
            llama_cpp_permute(&tensor, heads).flatten_all().and_then(|t| t.to_vec1()).expect("values");
        let bytes: Vec<u8> = permuted.iter().flat_map(|v| v.to_le_bytes()).collect();
        let restored = tensors::unpermute_rows(&bytes, rows, heads).expect("unpermute");
        let restored: Vec<f32> =
            restored.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(restored, original, "{heads} heads of {head_dim}");
    }
    assert!(tensors::unpermute_rows(&[0; 12], 3, 1).is_err(), "odd head dimension");
}

#[test]
fn the_tokenizer_splits_digits_as_its_pre_tokenizer_says_and_matches_control_tokens() {
    let config = tiny_config(vec![2]);
    let weights = tiny_weights(&config, 13);
    let dir = TempDir::new("gguf-tokenizer");
    let encode = |pre: &str, text: &str| -> Vec<u32> {
        let path = dir.path().join(format!("{pre}.gguf"));
        write_gguf(&path, &config, &weights, GgmlDType::F32, pre);
        let tokenizer = GgufFile::open(&path).and_then(|file| file.tokenizer()).expect("tokenizer");
        tokenizer.encode(text, true).expect("encode").get_ids().to_vec()
    };
    let id = |token: &str| vocabulary(64).0.iter().position(|t| t == token).expect("token") as u32;
    // SmolLM's rule isolates every digit; GPT-2's keeps " 12" together, so the `1 2` merge applies.
    assert_eq!(encode("smollm", "ab 12"), vec![id("ab"), id("Ġ"), id("1"), id("2")]);
    assert_eq!(encode("default", "ab 12"), vec![id("ab"), id("Ġ"), id("12")]);
    assert_eq!(encode("smollm", "<|im_start|>ab a<|im_end|>"), vec![1, id("ab"), id("Ġa"), 2]);

    let path = dir.path().join("smollm.gguf");
    let file = GgufFile::open(&path).expect("open");
    let tokenizer = file.tokenizer().expect("tokenizer");
    let text = tokenizer.decode(&[1, id("ab"), id("Ġa"), 2], true).expect("decode");
    assert_eq!(text, "ab a", "control tokens are skipped");
    let template = file.chat_template().expect("template").expect("has one");
    assert_eq!(template.bos_token.as_deref(), Some("<|im_start|>"));
    assert_eq!(template.eos_token.as_deref(), Some("<|im_end|>"));
    assert!(template.template.contains("messages[0]"));

    let unknown = dir.path().join("unknown.gguf");
    write_gguf(&unknown, &config, &weights, GgmlDType::F32, "some-new-model");
    let err = GgufFile::open(&unknown).and_then(|file| file.tokenizer()).expect_err("unknown pre-tokenizer");
    assert!(err.to_string().contains("some-new-model"), "{err}");
}

#[test]
fn files_that_are_not_served_are_refused_by_name() {
    let dir = TempDir::new("gguf-refused");
    let not_gguf = dir.path().join("model.gguf");
    std::fs::write(&not_gguf, b"not a gguf file at all").expect("write");
    let err = GgufFile::open(&not_gguf).err().expect("garbage");
    assert!(err.to_string().contains("not a readable GGUF file"), "{err}");
    let missing = GgufFile::open(&dir.path().join("missing.gguf")).err().expect("missing");
    assert!(matches!(missing, EngineLoadError::Io { .. }), "{missing}");

    let config = tiny_config(vec![2]);
    let weights = tiny_weights(&config, 14);
    let path = dir.path().join("tiny.gguf");
    write_gguf(&path, &config, &weights, GgmlDType::F32, "smollm");
    let file = GgufFile::open(&path).expect("open");
    let mut metadata = file.content.metadata.clone();
    let mut check = |key: &str, value: Value, expected: &str| {
        let saved = metadata.insert(key.to_owned(), value);
        let err = config::model_config(&Metadata { values: &metadata, path: &path }, false).expect_err(key);
        assert!(err.to_string().contains(expected), "{key}: {err}");
        match saved {
            Some(saved) => metadata.insert(key.to_owned(), saved),
            None => metadata.remove(key),
        };
    };
    check("general.architecture", Value::String("gpt2".into()), "\"gpt2\"");
    check("llama.rope.dimension_count", Value::U32(4), "partial RoPE");
    check("llama.attention.head_count_kv", Value::U32(3), "num_key_value_heads");
    check("llama.rope.scaling.type", Value::String("yarn".into()), "yarn");
    check("llama.block_count", Value::String("two".into()), "llama.block_count");
}

#[test]
fn the_format_is_told_by_the_path() {
    let dir = TempDir::new("gguf-format");
    assert_eq!(ModelFormat::of(dir.path()), ModelFormat::HuggingFace);
    assert_eq!(ModelFormat::of(&dir.path().join("model.gguf")), ModelFormat::Gguf);
}

#[test]
fn quantized_matrices_compute_the_dequantized_model_up_to_the_inputs_8_bit_rounding() {
    let mut config = tiny_config(vec![2]);
    config.intermediate_size = 64;
    config.rms_norm_eps = f64::from(config.rms_norm_eps as f32);
    let weights = tiny_weights(&config, 15);
    let dir = TempDir::new("gguf-quantized");
    let path = dir.path().join("model.gguf");
    write_gguf(&path, &config, &weights, GgmlDType::Q4_1, "smollm");
    let file = GgufFile::open(&path).expect("open");
    let load = |mode| Llama::load_gguf(&file, &Device::Cpu, DType::F32, None, mode).expect("load");
    let tokens: Vec<u32> = (0..24).map(|i| (i * 5 + 1) % 64).collect();
    let dense = logits(&load(QuantizedWeights::Dequantized), &tokens);
    let scale = dense.abs().and_then(|t| t.max_all()).and_then(|t| t.to_scalar::<f32>()).expect("scale");

    let quantized = logits(&load(QuantizedWeights::Quantized), &tokens);
    let diff = max_abs_diff(&quantized, &dense);
    assert!(diff > 0.0, "the inputs really are quantized");
    assert!(diff < 0.05 * scale, "quantized logits differ by {diff} (largest logit {scale})");

    // 24 rows reach the hybrid's dense copy: the dequantized model's values.
    let hybrid = logits(&load(QuantizedWeights::Hybrid { dense_from_rows: 8 }), &tokens);
    assert!(max_abs_diff(&hybrid, &dense) < 1e-5);
    let below = logits(&load(QuantizedWeights::Hybrid { dense_from_rows: 25 }), &tokens);
    assert_eq!(max_abs_diff(&below, &quantized), 0.0, "fewer rows stay quantized");

    // What picks the CPU's default step budget.
    assert!(load(QuantizedWeights::Quantized).multiplies_quantized_only());
    assert!(!load(QuantizedWeights::Dequantized).multiplies_quantized_only());
    assert!(!load(QuantizedWeights::Hybrid { dense_from_rows: 25 }).multiplies_quantized_only());
}

#[test]
fn a_quantized_model_prefills_packed_chunks_with_per_row_lora_as_one_whole_pass_does() {
    let mut config = tiny_config(vec![2]);
    config.intermediate_size = 64;
    config.rms_norm_eps = f64::from(config.rms_norm_eps as f32);
    let weights = tiny_weights(&config, 16);
    let adapter = tiny_adapter(&config, 3);
    let dir = TempDir::new("gguf-packed");
    let path = dir.path().join("model.gguf");
    write_gguf(&path, &config, &weights, GgmlDType::Q4_1, "smollm");
    let file = GgufFile::open(&path).expect("open");
    let model = Llama::load_gguf(&file, &Device::Cpu, DType::F32, None, QuantizedWeights::Quantized).expect("load");
    let first: Vec<u32> = (0..24).map(|i| (i * 5 + 1) % 64).collect();
    let second: Vec<u32> = (0..11).map(|i| (i * 3 + 2) % 64).collect();
    // Every position's logits `(len, vocab)` of one sequence in one pass, all of it under `lora`.
    let whole = |tokens: &[u32], lora: &LoraBatch| {
        let input = Tensor::from_slice(tokens, (1, tokens.len()), &Device::Cpu).expect("tokens");
        let hidden = model.forward_sequences(&input, lora).expect("forward");
        model.logits(&hidden).expect("logits").squeeze(0).expect("one sequence")
    };
    let expected_first = whole(&first, &LoraBatch::uniform(Some(&adapter)).expect("lora"));
    let expected_second = whole(&second, &LoraBatch::uniform(None).expect("lora"));
    let cache = model.kv_cache(8, false).expect("cache");
    let (mut first_kv, mut second_kv) =
        (SequenceBlocks::new(cache.pool(), None), SequenceBlocks::new(cache.pool(), None));
    // Chunks of both prompts packed into each pass: the adapter's rows first, then the base model's.
    for (first_len, second_len) in [(7, 4), (9, 0), (8, 7)] {
        let (first_start, second_start) = (first_kv.len(), second_kv.len());
        let mut rows = vec![Some(&adapter); first_len];
        rows.extend(std::iter::repeat_n(None, second_len));
        let lora = LoraBatch::for_rows(&rows, None, &Device::Cpu).expect("lora");
        cache.reserve(&mut first_kv, first_len).expect("room");
        cache.reserve(&mut second_kv, second_len).expect("room");
        let mut chunks =
            vec![PrefillChunk { tokens: &first[first_start..first_start + first_len], blocks: &mut first_kv }];
        if second_len > 0 {
            chunks.push(PrefillChunk {
                tokens: &second[second_start..second_start + second_len],
                blocks: &mut second_kv,
            });
        }
        let input = PackedInput { decode: Vec::new(), chunks };
        let hidden = model.forward_packed(input, &lora, &cache).expect("packed pass");
        let logits = model.logits(&hidden).expect("logits");
        let packed_first = logits.narrow(0, 0, first_len).expect("first");
        let diff = max_abs_diff(&packed_first, &expected_first.narrow(0, first_start, first_len).expect("rows"));
        assert!(diff < 1e-4, "the adapter's chunk at {first_start} differs by {diff}");
        if second_len > 0 {
            let packed_second = logits.narrow(0, first_len, second_len).expect("second");
            let expected = expected_second.narrow(0, second_start, second_len).expect("rows");
            let diff = max_abs_diff(&packed_second, &expected);
            assert!(diff < 1e-4, "the base model's chunk at {second_start} differs by {diff}");
        }
    }
    assert_eq!((first_kv.len(), second_kv.len()), (24, 11));
}
