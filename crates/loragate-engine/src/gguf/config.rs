//! A GGUF file's hyper-parameters (`general.architecture` and the `{arch}.*` keys llama.cpp writes), described as the
//! Hugging Face `config.json` they came from and checked by the same parser.

use serde_json::json;

use super::Metadata;
use crate::error::EngineLoadError;
use crate::model::ModelConfig;

/// The GGUF architectures served, with the Hugging Face `model_type` each is converted from.
const ARCHITECTURES: [(&str, &str); 2] = [("llama", "llama"), ("qwen2", "qwen2")];

/// The architecture named by `general.architecture`, if it is served.
pub(super) fn architecture(metadata: &Metadata<'_>) -> Result<&'static str, EngineLoadError> {
    let arch = metadata.string("general.architecture", metadata.required("general.architecture")?)?;
    ARCHITECTURES.iter().find(|(name, _)| *name == arch).map(|(name, _)| *name).ok_or_else(|| {
        let served: Vec<&str> = ARCHITECTURES.iter().map(|(name, _)| *name).collect();
        EngineLoadError::config(format!(
            "general.architecture {arch:?} is not a LLaMA-family decoder this engine serves (served: {served:?})"
        ))
    })
}

/// The model's configuration; `tied` when the file has no `output.weight` (the LM head is the embedding). The
/// vocabulary size is the token list's length when `{arch}.vocab_size` is absent
/// (llama.cpp does the same); the end-of-sequence tokens are `tokenizer.ggml.eos_token_id` and, where present,
/// the end-of-turn and end-of-message tokens (`eot_token_id`, `eom_token_id`), as llama.cpp stops on all of them.
pub(super) fn model_config(metadata: &Metadata<'_>, tied: bool) -> Result<ModelConfig, EngineLoadError> {
    let arch = architecture(metadata)?;
    let model_type = ARCHITECTURES.iter().find(|(name, _)| *name == arch).map_or(arch, |(_, hf)| *hf);
    let key = |name: &str| format!("{arch}.{name}");
    let required = |name: &str| metadata.required_u64(&key(name));
    let optional = |name: &str| metadata.optional_u64(&key(name));

    let hidden_size = required("embedding_length")?;
    let num_heads = required("attention.head_count")?;
    let head_dim = optional("attention.key_length")?;
    if let (Some(key_length), Some(value_length)) = (head_dim, optional("attention.value_length")?)
        && key_length != value_length
    {
        return Err(EngineLoadError::config(format!(
            "{arch}.attention.key_length ({key_length}) differs from value_length ({value_length})"
        )));
    }
    if let Some(rope_dims) = optional("rope.dimension_count")? {
        let full = head_dim.unwrap_or(hidden_size.checked_div(num_heads).unwrap_or(0));
        if rope_dims != full {
            return Err(EngineLoadError::config(format!(
                "{arch}.rope.dimension_count ({rope_dims}) rotates part of each head ({full}); partial RoPE is not \
                 supported"
            )));
        }
    }
    let vocab_size = match optional("vocab_size")? {
        Some(size) => size,
        None => metadata.array("tokenizer.ggml.tokens", metadata.required("tokenizer.ggml.tokens")?)?.len() as u64,
    };
    let mut eos_token_ids = Vec::new();
    for name in ["eos_token_id", "eot_token_id", "eom_token_id"] {
        if let Some(id) = metadata.optional_u64(&format!("tokenizer.ggml.{name}"))? {
            eos_token_ids.push(id);
        }
    }
    let mut config = json!({
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": required("feed_forward_length")?,
        "num_hidden_layers": required("block_count")?,
        "num_attention_heads": num_heads,
        "num_key_value_heads": optional("attention.head_count_kv")?.unwrap_or(num_heads),
        "max_position_embeddings": required("context_length")?,
        "eos_token_id": eos_token_ids,
        "tie_word_embeddings": tied,
    });
    if let Some(head_dim) = head_dim {
        config["head_dim"] = head_dim.into();
    }
    if let Some(eps) = metadata.optional_f64(&key("attention.layer_norm_rms_epsilon"))? {
        config["rms_norm_eps"] = eps.into();
    }
    if let Some(theta) = metadata.optional_f64(&key("rope.freq_base"))? {
        config["rope_theta"] = theta.into();
    }
    if let Some(scaling) = rope_scaling(metadata, arch)? {
        config["rope_scaling"] = scaling;
    }
    ModelConfig::from_config_json(config)
}

/// `{arch}.rope.scaling.type` as a `rope_scaling` object: none and linear are served; YaRN and the others are
/// refused by the config parser with their name.
fn rope_scaling(metadata: &Metadata<'_>, arch: &str) -> Result<Option<serde_json::Value>, EngineLoadError> {
    let kind = metadata.optional_string(&format!("{arch}.rope.scaling.type"))?;
    match kind {
        None | Some("none") => Ok(None),
        Some(kind) => {
            let factor = metadata.optional_f64(&format!("{arch}.rope.scaling.factor"))?;
            Ok(Some(json!({ "rope_type": kind, "factor": factor })))
        }
    }
}
