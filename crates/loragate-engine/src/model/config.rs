//! A Hugging Face `config.json` (and `generation_config.json`) of a LLaMA-family model, parsed into the validated
//! [`ModelConfig`] the rest of the engine uses.

use std::path::Path;

use serde::Deserialize;

use crate::error::EngineLoadError;

/// The shapes and constants of a LLaMA-family decoder (LLaMA, Qwen2, Mistral without sliding windows).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ModelConfig {
    pub(crate) vocab_size: usize,
    pub(crate) hidden_size: usize,
    pub(crate) intermediate_size: usize,
    pub(crate) num_layers: usize,
    pub(crate) num_heads: usize,
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) rms_norm_eps: f64,
    pub(crate) rope_theta: f64,
    pub(crate) rope_scaling: RopeScaling,
    pub(crate) max_position_embeddings: usize,
    pub(crate) tie_word_embeddings: bool,
    /// The end-of-sequence tokens named by `config.json` and `generation_config.json`, deduplicated.
    pub(crate) eos_token_ids: Vec<u32>,
}

/// How rotary frequencies are rescaled for long contexts.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor` (`"linear"`).
    Linear { factor: f64 },
    /// LLaMA 3.1's frequency-dependent scaling (`"llama3"`).
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: f64 },
}

impl ModelConfig {
    /// Reads `config.json` and, if present, `generation_config.json` from a model directory.
    pub(crate) fn from_model_dir(dir: &Path) -> Result<Self, EngineLoadError> {
        let raw: RawConfig = read_json(&dir.join("config.json"))?;
        let generation_path = dir.join("generation_config.json");
        let generation: Option<RawGenerationConfig> =
            if generation_path.exists() { Some(read_json(&generation_path)?) } else { None };
        Self::parse(raw, generation)
    }

    /// Parses a `config.json`-shaped value (how a GGUF file's metadata is described to the same checks).
    pub(crate) fn from_config_json(config: serde_json::Value) -> Result<Self, EngineLoadError> {
        let raw: RawConfig =
            serde_json::from_value(config).map_err(|err| EngineLoadError::config(format!("model config: {err}")))?;
        Self::parse(raw, None)
    }

    /// The positions served: the model's own length, capped at `max_context` if given.
    pub(crate) fn served_context(&self, max_context: Option<usize>) -> usize {
        max_context.map_or(self.max_position_embeddings, |max| max.min(self.max_position_embeddings))
    }

    fn parse(raw: RawConfig, generation: Option<RawGenerationConfig>) -> Result<Self, EngineLoadError> {
        if let Some(model_type) = &raw.model_type
            && !SUPPORTED_MODEL_TYPES.contains(&model_type.as_str())
        {
            return Err(EngineLoadError::config(format!(
                "model_type {model_type:?} is not a LLaMA-family decoder (supported: {SUPPORTED_MODEL_TYPES:?})"
            )));
        }
        let positive = |value: usize, field: &str| {
            if value == 0 { Err(EngineLoadError::config(format!("{field} must be positive"))) } else { Ok(value) }
        };
        let hidden_size = positive(raw.hidden_size, "hidden_size")?;
        let num_heads = positive(raw.num_attention_heads, "num_attention_heads")?;
        let num_kv_heads = positive(raw.num_key_value_heads.unwrap_or(num_heads), "num_key_value_heads")?;
        if num_heads % num_kv_heads != 0 {
            return Err(EngineLoadError::config(format!(
                "num_attention_heads ({num_heads}) is not a multiple of num_key_value_heads ({num_kv_heads})"
            )));
        }
        let head_dim = match raw.head_dim {
            Some(head_dim) => positive(head_dim, "head_dim")?,
            None if hidden_size % num_heads == 0 => hidden_size / num_heads,
            None => {
                return Err(EngineLoadError::config(format!(
                    "hidden_size ({hidden_size}) is not a multiple of num_attention_heads ({num_heads})"
                )));
            }
        };
        if head_dim % 2 != 0 {
            return Err(EngineLoadError::config(format!("head_dim ({head_dim}) must be even for RoPE")));
        }
        let mut eos_token_ids = raw.eos_token_id.map(TokenIds::into_vec).unwrap_or_default();
        if let Some(generation) = generation {
            eos_token_ids.extend(generation.eos_token_id.map(TokenIds::into_vec).unwrap_or_default());
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        let vocab_size = positive(raw.vocab_size, "vocab_size")?;
        if let Some(bad) = eos_token_ids.iter().find(|id| **id as usize >= vocab_size) {
            return Err(EngineLoadError::config(format!(
                "eos_token_id {bad} is outside the vocabulary ({vocab_size})"
            )));
        }
        let (rope_theta, rope_scaling) = rope(raw.rope_theta, raw.rope_scaling, raw.rope_parameters)?;
        Ok(Self {
            vocab_size,
            hidden_size,
            intermediate_size: positive(raw.intermediate_size, "intermediate_size")?,
            num_layers: positive(raw.num_hidden_layers, "num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings: positive(raw.max_position_embeddings, "max_position_embeddings")?,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            eos_token_ids,
        })
    }
}

const SUPPORTED_MODEL_TYPES: [&str; 3] = ["llama", "qwen2", "mistral"];

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, EngineLoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| EngineLoadError::io(path, source))?;
    serde_json::from_str(&text).map_err(|err| EngineLoadError::config(format!("{}: {err}", path.display())))
}

/// The RoPE base and scaling from the older keys (`rope_theta`, `rope_scaling`) or Transformers 5's
/// `rope_parameters`; where both are written they must agree (a base read from the wrong one would run the model with
/// the wrong positions, silently).
fn rope(
    theta: Option<f64>,
    scaling: Option<RawRopeScaling>,
    parameters: Option<RawRopeParameters>,
) -> Result<(f64, RopeScaling), EngineLoadError> {
    let Some(parameters) = parameters else {
        return Ok((theta.unwrap_or(10_000.0), parse_rope_scaling(scaling)?));
    };
    let theta = match (theta, parameters.rope_theta) {
        (Some(old), Some(new)) if old != new => {
            return Err(EngineLoadError::config(format!(
                "rope_theta ({old}) and rope_parameters.rope_theta ({new}) disagree"
            )));
        }
        (old, new) => new.or(old).unwrap_or(10_000.0),
    };
    let from_parameters = parse_rope_scaling(Some(parameters.scaling))?;
    let scaling = match scaling {
        Some(scaling) => {
            let old = parse_rope_scaling(Some(scaling))?;
            if old != from_parameters && from_parameters != RopeScaling::None {
                return Err(EngineLoadError::config("rope_scaling and rope_parameters disagree".to_owned()));
            }
            old
        }
        None => from_parameters,
    };
    Ok((theta, scaling))
}

fn parse_rope_scaling(raw: Option<RawRopeScaling>) -> Result<RopeScaling, EngineLoadError> {
    let Some(raw) = raw else { return Ok(RopeScaling::None) };
    let kind = raw.rope_type.or(raw.kind).unwrap_or_else(|| "default".to_owned());
    let factor = || raw.factor.ok_or_else(|| EngineLoadError::config(format!("rope_scaling {kind:?} needs factor")));
    match kind.as_str() {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: raw.low_freq_factor.unwrap_or(1.0),
            high_freq_factor: raw.high_freq_factor.unwrap_or(4.0),
            original_max_position_embeddings: raw.original_max_position_embeddings.unwrap_or(8192.0),
        }),
        other => Err(EngineLoadError::config(format!(
            "rope_scaling type {other:?} is not supported (supported: default, linear, llama3)"
        ))),
    }
}

#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRopeScaling>,
    /// Transformers 5 writes the RoPE base and scaling here instead (`rope_theta` and `rope_type` side by side).
    rope_parameters: Option<RawRopeParameters>,
    max_position_embeddings: usize,
    tie_word_embeddings: Option<bool>,
    eos_token_id: Option<TokenIds>,
}

#[derive(Deserialize)]
struct RawRopeParameters {
    rope_theta: Option<f64>,
    #[serde(flatten)]
    scaling: RawRopeScaling,
}

#[derive(Deserialize)]
struct RawGenerationConfig {
    eos_token_id: Option<TokenIds>,
}

#[derive(Deserialize)]
struct RawRopeScaling {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
}

/// `eos_token_id` is an int in some configs and a list in others.
#[derive(Deserialize)]
#[serde(untagged)]
enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    fn into_vec(self) -> Vec<u32> {
        match self {
            Self::One(id) => vec![id],
            Self::Many(ids) => ids,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(config: serde_json::Value, generation: Option<serde_json::Value>) -> Result<ModelConfig, EngineLoadError> {
        let raw = serde_json::from_value(config).expect("raw config");
        let generation = generation.map(|g| serde_json::from_value(g).expect("raw generation config"));
        ModelConfig::parse(raw, generation)
    }

    fn qwen_like() -> serde_json::Value {
        serde_json::json!({
            "model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "tie_word_embeddings": true, "eos_token_id": 7
        })
    }

    #[test]
    fn eos_ids_merge_ints_and_lists_from_both_files() {
        let config = parse(qwen_like(), Some(serde_json::json!({"eos_token_id": [9, 7]}))).expect("valid");
        assert_eq!(config.eos_token_ids, vec![7, 9]);
        assert_eq!(config.head_dim, 8);
        assert!(config.tie_word_embeddings);
    }

    #[test]
    fn inconsistent_shapes_and_unknown_architectures_are_refused() {
        let mut bad_heads = qwen_like();
        bad_heads["num_key_value_heads"] = 3.into();
        let mut bad_type = qwen_like();
        bad_type["model_type"] = "gpt2".into();
        let mut bad_eos = qwen_like();
        bad_eos["eos_token_id"] = 5000.into();
        let mut bad_rope = qwen_like();
        bad_rope["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
        for config in [bad_heads, bad_type, bad_eos, bad_rope] {
            assert!(matches!(parse(config.clone(), None), Err(EngineLoadError::Config(_))), "{config}");
        }
    }

    #[test]
    fn transformers_5_rope_parameters_are_read_and_must_agree_with_the_older_keys() {
        let mut config = qwen_like();
        config.as_object_mut().expect("object").remove("rope_theta");
        config["rope_parameters"] = serde_json::json!({"rope_theta": 100000.0, "rope_type": "default"});
        let parsed = parse(config.clone(), None).expect("valid");
        assert_eq!((parsed.rope_theta, parsed.rope_scaling), (100000.0, RopeScaling::None));
        config["rope_theta"] = 100000.0.into();
        assert_eq!(parse(config.clone(), None).expect("the same base twice").rope_theta, 100000.0);
        config["rope_theta"] = 10000.0.into();
        let err = parse(config, None).expect_err("two bases");
        assert!(err.to_string().contains("rope_parameters.rope_theta"), "{err}");
        let mut scaled = qwen_like();
        scaled["rope_parameters"] = serde_json::json!({
            "rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
        });
        scaled.as_object_mut().expect("object").remove("rope_theta");
        let parsed = parse(scaled, None).expect("valid");
        assert!(matches!(parsed.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        assert_eq!(parsed.rope_theta, 500000.0);
    }

    #[test]
    fn llama3_rope_scaling_is_read() {
        let mut config = qwen_like();
        config["model_type"] = "llama".into();
        config["rope_scaling"] = serde_json::json!({
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192
        });
        let parsed = parse(config, None).expect("valid");
        assert!(matches!(parsed.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
    }
}
