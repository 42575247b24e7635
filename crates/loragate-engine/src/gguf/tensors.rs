//! A GGUF file's tensors under their Hugging Face names and in the Hugging Face layout, still in their GGUF block
//! formats ([`QTensor`]s: quantized, or `F32`/`F16`/`BF16`).
//!
//! llama.cpp's converter permutes the rows of every head of the query and key projections of `llama` models so that
//! its RoPE can rotate adjacent pairs: Hugging Face row `h·d + j·d/2 + i` (head `h`, half `j`, index `i`) becomes GGUF
//! row `h·d + 2i + j`. Reading undoes it row by row on the raw bytes — GGUF blocks never span rows — so the weights,
//! quantized or not, are exactly the converter's input order, and the model's rotate-half RoPE and PEFT adapters
//! (whose `lora_B` rows are in the Hugging Face order) apply unchanged. Qwen2 files are not permuted (llama.cpp
//! rotates them in the Hugging Face layout).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};

use candle_core::Device;
use candle_core::quantized::{QStorage, QTensor};

use super::GgufFile;
use crate::error::EngineLoadError;
use crate::lora::LoraTarget;
use crate::model::ModelConfig;

/// The LM head's name in GGUF files (absent when it is tied to the embedding).
pub(super) const OUTPUT: &str = "output.weight";

/// A GGUF file's tensors, by Hugging Face name, on the CPU in their GGUF formats.
pub(crate) type GgufWeights = HashMap<String, QTensor>;

/// The GGUF name of each projection, by [`LoraTarget::index`].
const PROJECTIONS: [&str; 7] = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];

/// The Hugging Face name of a GGUF tensor, and for the query and key rows of `llama` files the number of heads
/// whose rows were permuted.
fn hugging_face_name(name: &str, config: &ModelConfig, permuted: bool) -> Option<(String, Option<usize>)> {
    match name {
        "token_embd.weight" => return Some(("model.embed_tokens.weight".into(), None)),
        "output_norm.weight" => return Some(("model.norm.weight".into(), None)),
        OUTPUT => return Some(("lm_head.weight".into(), None)),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tensor) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, suffix) = tensor.rsplit_once('.')?;
    match module {
        "attn_norm" => return Some((format!("model.layers.{layer}.input_layernorm.{suffix}"), None)),
        "ffn_norm" => return Some((format!("model.layers.{layer}.post_attention_layernorm.{suffix}"), None)),
        _ => {}
    }
    let target = LoraTarget::ALL[PROJECTIONS.iter().position(|projection| *projection == module)?];
    let heads = match target {
        LoraTarget::Q if permuted => Some(config.num_heads),
        LoraTarget::K if permuted => Some(config.num_kv_heads),
        _ => None,
    };
    Some((format!("{}.{suffix}", target.module_path(layer)), heads))
}

/// Reads every tensor the model uses (others are ignored, as in Hugging Face checkpoints), one at a time.
pub(crate) fn read_weights(file: &GgufFile, config: &ModelConfig) -> Result<GgufWeights, EngineLoadError> {
    let arch = super::config::architecture(&file.metadata())?;
    if file.content.tensor_infos.contains_key("rope_freqs.weight") {
        return Err(EngineLoadError::weights(format!(
            "{}: rope_freqs.weight (per-frequency RoPE scaling, as in LLaMA 3.1 files) is not supported yet",
            file.path.display()
        )));
    }
    let permuted = arch == "llama";
    let handle = File::open(&file.path).map_err(|source| EngineLoadError::io(&file.path, source))?;
    let mut reader = BufReader::new(handle);
    let mut weights = GgufWeights::new();
    let mut names: Vec<&String> = file.content.tensor_infos.keys().collect();
    names.sort_by_key(|name| file.content.tensor_infos[*name].offset);
    for name in names {
        let Some((hf_name, heads)) = hugging_face_name(name, config, permuted) else { continue };
        let info = &file.content.tensor_infos[name];
        let error = |reason: String| EngineLoadError::weights(format!("{name} ({hf_name}): {reason}"));
        let (block, type_size) = (info.ggml_dtype.block_size(), info.ggml_dtype.type_size());
        let elements = info.shape.elem_count();
        if !elements.is_multiple_of(block) {
            return Err(error(format!("{elements} values do not fill {:?} blocks of {block}", info.ggml_dtype)));
        }
        let mut bytes = vec![0u8; elements / block * type_size];
        let start = file.content.tensor_data_offset.checked_add(info.offset).ok_or_else(|| error("offset".into()))?;
        reader
            .seek(SeekFrom::Start(start))
            .and_then(|_| reader.read_exact(&mut bytes))
            .map_err(|err| error(format!("cannot read {} bytes at {start}: {err}", bytes.len())))?;
        if let Some(heads) = heads {
            bytes = unpermute_rows(&bytes, info.shape.dims()[0], heads).map_err(error)?;
        }
        let tensor = QStorage::from_data(Cow::Owned(bytes), &Device::Cpu, info.ggml_dtype)
            .and_then(|storage| QTensor::new(storage, info.shape.clone()))
            .map_err(|err| error(err.to_string()))?;
        weights.insert(hf_name, tensor);
    }
    Ok(weights)
}

/// Undoes llama.cpp's permutation of a query or key projection: `bytes` holds `rows` rows of `heads` heads in the
/// GGUF order; the result holds them in the Hugging Face order (see the module's documentation).
pub(super) fn unpermute_rows(bytes: &[u8], rows: usize, heads: usize) -> Result<Vec<u8>, String> {
    if heads == 0
        || !rows.is_multiple_of(heads)
        || !(rows / heads).is_multiple_of(2)
        || rows == 0
        || !bytes.len().is_multiple_of(rows)
    {
        return Err(format!("{rows} rows of {} bytes cannot be {heads} heads of pairs", bytes.len()));
    }
    let (row_bytes, head_dim) = (bytes.len() / rows, rows / heads);
    let half = head_dim / 2;
    let mut out = Vec::with_capacity(bytes.len());
    for head in 0..heads {
        for pair_member in 0..2 {
            for index in 0..half {
                let source = head * head_dim + 2 * index + pair_member;
                out.extend_from_slice(&bytes[source * row_bytes..(source + 1) * row_bytes]);
            }
        }
    }
    Ok(out)
}
