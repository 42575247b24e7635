//! `adapter_config.json`: read (a regular file inside the adapter root, at most [`MAX_CONFIG_BYTES`]), parsed, and
//! checked against the engine's limits: the rank at most `--max-lora-rank`, and the scale `lora_alpha / r` (or
//! `lora_alpha / √r`), as the engine's dtype holds it, finite and at most [`MAX_LORA_SCALE`] in magnitude.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;

use candle_core::{DType, Device, Tensor};
use loragate_core::{AdapterSource, EngineError};
use serde::Deserialize;

use super::{CONFIG_FILE, incompatible};
use crate::lora::LoraTarget;

/// The largest `adapter_config.json` read (real ones are about a kilobyte).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The largest scale magnitude accepted. PEFT's defaults give 1 or 2, rsLoRA with `lora_alpha = 2r` at rank 64 gives
/// 16; 256 leaves a wide margin, while values past it (like `lora_alpha: 1e25`) only serve to overflow activations.
pub(crate) const MAX_LORA_SCALE: f32 = 256.0;

/// A validated `adapter_config.json`.
#[derive(Debug)]
pub(super) struct AdapterConfig {
    pub(super) rank: usize,
    /// `lora_alpha / r`, or `lora_alpha / √r` with rsLoRA, as the engine's dtype represents it.
    pub(super) scale: f64,
    pub(super) targets: BTreeSet<LoraTarget>,
}

impl AdapterConfig {
    /// Reads and validates the config of `source` for an engine running `dtype` that accepts ranks up to `max_rank`.
    pub(super) fn read(source: &AdapterSource, max_rank: usize, dtype: DType) -> Result<Self, EngineError> {
        let (file, _) = source.open_file(CONFIG_FILE).map_err(|err| EngineError::AdapterFiles(err.to_string()))?;
        let mut text = Vec::new();
        file.take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|err| EngineError::AdapterFiles(format!("cannot read {CONFIG_FILE}: {err}")))?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(EngineError::AdapterFiles(format!("{CONFIG_FILE} is over {MAX_CONFIG_BYTES} bytes")));
        }
        let raw: RawAdapterConfig = serde_json::from_slice(&text).map_err(|err| {
            EngineError::AdapterFiles(format!("{CONFIG_FILE} is not a valid PEFT LoRA config: {err}"))
        })?;
        Self::parse(raw, max_rank, dtype)
    }

    /// Validates a config given as parsed JSON (a pushed adapter's `adapter_config.json`).
    pub(super) fn from_json(
        json: serde_json::Map<String, serde_json::Value>,
        max_rank: usize,
        dtype: DType,
    ) -> Result<Self, EngineError> {
        let raw: RawAdapterConfig = serde_json::from_value(serde_json::Value::Object(json)).map_err(|err| {
            EngineError::AdapterFiles(format!("{CONFIG_FILE} is not a valid PEFT LoRA config: {err}"))
        })?;
        Self::parse(raw, max_rank, dtype)
    }

    pub(super) fn parse(raw: RawAdapterConfig, max_rank: usize, dtype: DType) -> Result<Self, EngineError> {
        if let Some(peft_type) = &raw.peft_type
            && peft_type != "LORA"
        {
            return Err(incompatible(format!("peft_type is {peft_type:?}; only LORA adapters are supported")));
        }
        let unsupported = [
            (raw.fan_in_fan_out, "fan_in_fan_out"),
            (raw.use_dora, "use_dora"),
            (raw.layers_to_transform.as_ref().is_some_and(|v| !v.is_null()), "layers_to_transform"),
            (raw.rank_pattern.as_ref().is_some_and(|p| !p.is_empty()), "rank_pattern"),
            (raw.alpha_pattern.as_ref().is_some_and(|p| !p.is_empty()), "alpha_pattern"),
            (raw.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()), "modules_to_save"),
            (raw.bias.as_deref().is_some_and(|bias| bias != "none"), "bias other than \"none\""),
        ];
        if let Some((_, feature)) = unsupported.iter().find(|(used, _)| *used) {
            return Err(incompatible(format!("the adapter uses {feature}, which loragate does not support")));
        }
        if raw.r == 0 {
            return Err(incompatible("r must be positive"));
        }
        if raw.r > max_rank {
            return Err(incompatible(format!(
                "r is {}, over this server's limit of {max_rank} (--max-lora-rank)",
                raw.r
            )));
        }
        let names = match raw.target_modules {
            TargetModules::List(names) => names,
            TargetModules::One(name) if name == "all-linear" => {
                LoraTarget::ALL.iter().map(|target| target.module_name().to_owned()).collect()
            }
            TargetModules::One(name) => vec![name],
        };
        let targets = names
            .iter()
            .map(|name| {
                LoraTarget::from_module_name(name).ok_or_else(|| {
                    incompatible(format!(
                        "target module {name:?} is not one loragate can adapt (supported: {}; a regular \
                         expression is not supported)",
                        LoraTarget::ALL.map(LoraTarget::module_name).join(", ")
                    ))
                })
            })
            .collect::<Result<BTreeSet<_>, _>>()?;
        if targets.is_empty() {
            return Err(incompatible("target_modules is empty"));
        }
        let rank = raw.r as f64;
        let scale = if raw.use_rslora { raw.lora_alpha / rank.sqrt() } else { raw.lora_alpha / rank };
        let formula = if raw.use_rslora { "lora_alpha / √r" } else { "lora_alpha / r" };
        let scale = scale_in(dtype, scale).ok_or_else(|| {
            incompatible(format!(
                "the scale {formula} = {} / {} is {scale:e} in {dtype:?}; it must be finite and at most \
                 {MAX_LORA_SCALE} in magnitude",
                raw.lora_alpha, raw.r
            ))
        })?;
        Ok(Self { rank: raw.r, scale, targets })
    }

    pub(super) fn target_names(&self) -> Vec<&'static str> {
        self.targets.iter().map(|target| target.module_name()).collect()
    }
}

/// `scale` as `dtype` holds it, if that is finite and within [`MAX_LORA_SCALE`].
fn scale_in(dtype: DType, scale: f64) -> Option<f64> {
    let held = Tensor::new(scale as f32, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .and_then(|t| t.to_dtype(DType::F32))
        .and_then(|t| t.to_scalar::<f32>())
        .ok()?;
    (held.is_finite() && held.abs() <= MAX_LORA_SCALE).then_some(f64::from(held))
}

#[derive(Deserialize)]
pub(super) struct RawAdapterConfig {
    r: usize,
    lora_alpha: f64,
    target_modules: TargetModules,
    #[serde(default)]
    use_rslora: bool,
    peft_type: Option<String>,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    use_dora: bool,
    layers_to_transform: Option<serde_json::Value>,
    rank_pattern: Option<HashMap<String, serde_json::Value>>,
    alpha_pattern: Option<HashMap<String, serde_json::Value>>,
    modules_to_save: Option<Vec<String>>,
    bias: Option<String>,
}

/// `target_modules`: a list of module names, or one string (a module name or `"all-linear"`).
#[derive(Deserialize)]
#[serde(untagged)]
enum TargetModules {
    List(Vec<String>),
    One(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(config: serde_json::Value, dtype: DType) -> Result<AdapterConfig, EngineError> {
        AdapterConfig::parse(serde_json::from_value(config).expect("well-formed"), 64, dtype)
    }

    fn config(alpha: f64, r: usize, rslora: bool) -> serde_json::Value {
        serde_json::json!({ "r": r, "lora_alpha": alpha, "target_modules": "q_proj", "use_rslora": rslora })
    }

    #[test]
    fn scales_must_be_finite_and_bounded_as_the_engine_dtype_holds_them() {
        assert_eq!(parse(config(16.0, 8, false), DType::F32).expect("alpha 16, r 8").scale, 2.0);
        assert_eq!(parse(config(16.0, 4, true), DType::BF16).expect("rsLoRA").scale, 8.0);
        assert_eq!(parse(config(-2048.0, 8, false), DType::F32).expect("negative, within bounds").scale, -256.0);
        for (alpha, r, dtype) in [
            (1e40, 8, DType::F32),
            (1e25, 8, DType::F32),
            (1e25, 8, DType::F16),
            (2056.0, 8, DType::F32),
            (-1e30, 1, DType::BF16),
        ] {
            let err = parse(config(alpha, r, false), dtype).expect_err("out of bounds");
            assert_eq!(err.kind(), "adapter_incompatible", "{alpha}/{r} in {dtype:?}: {err}");
            assert!(err.to_string().contains("lora_alpha / r"), "{err}");
        }
    }

    #[test]
    fn ranks_over_the_limit_are_refused_naming_the_flag() {
        let config = serde_json::json!({ "r": 65, "lora_alpha": 8, "target_modules": "q_proj" });
        let err = parse(config.clone(), DType::F32).expect_err("over 64");
        assert!(err.to_string().contains("--max-lora-rank"), "{err}");
        let raw: RawAdapterConfig = serde_json::from_value(config).expect("well-formed");
        assert_eq!(AdapterConfig::parse(raw, 128, DType::F32).expect("within 128").rank, 65);
    }
}
