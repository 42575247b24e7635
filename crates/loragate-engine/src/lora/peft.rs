//! PEFT adapter directories: `adapter_config.json` + `adapter_model.safetensors`, parsed and checked against the
//! base model before anything is installed.
//!
//! Files that are missing, unreadable or malformed are [`EngineError::AdapterFiles`]; well-formed files that do not
//! fit the model (unknown or unsupported targets, wrong shapes, ranks that disagree, layers the model lacks, a
//! declared target without its tensors, PEFT features loragate does not implement) are
//! [`EngineError::AdapterIncompatible`].

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};
use loragate_core::EngineError;
use serde::Deserialize;

use super::{AdapterWeights, LoraPair, LoraTarget};
use crate::model::ModelConfig;

/// The PEFT config file's name.
pub(crate) const CONFIG_FILE: &str = "adapter_config.json";
/// The PEFT weights file's name.
pub(crate) const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// Reads and validates the adapter in `dir` for `model`, returning its weights on `device` as `dtype`. Blocking
/// (file reads, tensor conversion): call it off the async runtime.
pub(crate) fn load_peft_adapter(
    dir: &Path,
    model: &ModelConfig,
    device: &Device,
    dtype: DType,
) -> Result<AdapterWeights, EngineError> {
    let config = AdapterConfig::read(dir)?;
    let weights_path = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&weights_path)
        .map_err(|err| EngineError::AdapterFiles(format!("cannot read {}: {err}", weights_path.display())))?;
    let tensors = safetensors::SafeTensors::deserialize(&bytes).map_err(|err| {
        EngineError::AdapterFiles(format!("{} is not valid safetensors: {err}", weights_path.display()))
    })?;

    let mut factors: HashMap<(usize, LoraTarget, Factor), Tensor> = HashMap::new();
    for (name, view) in tensors.iter() {
        let (layer, target, factor) = parse_tensor_name(name, model.num_layers)?;
        if !config.targets.contains(&target) {
            return Err(incompatible(format!(
                "{name} adapts {}, which target_modules {:?} does not declare",
                target.module_name(),
                config.target_names()
            )));
        }
        let tensor = view
            .load(&Device::Cpu)
            .map_err(|err| EngineError::AdapterFiles(format!("cannot read tensor {name}: {err}")))?;
        let expected = factor.shape(target, model, config.rank);
        if tensor.dims() != expected {
            return Err(incompatible(format!(
                "{name} has shape {:?}, expected {expected:?} (rank {} from adapter_config.json, {} → {} features)",
                tensor.dims(),
                config.rank,
                target.features(model).0,
                target.features(model).1
            )));
        }
        if !tensor.dtype().is_float() {
            return Err(incompatible(format!("{name} has dtype {:?}, expected floats", tensor.dtype())));
        }
        if factors.insert((layer, target, factor), tensor).is_some() {
            return Err(EngineError::AdapterFiles(format!("{name} appears twice (with and without `.default`)")));
        }
    }

    let to_engine = |tensor: Tensor, name: &str| -> Result<Tensor, EngineError> {
        let tensor = tensor.to_dtype(DType::F32).map_err(|err| internal(name, err))?;
        let finite = tensor.abs().and_then(|t| t.sum_all()).and_then(|t| t.to_scalar::<f32>());
        match finite {
            Ok(sum) if sum.is_finite() => Ok(tensor),
            Ok(_) => Err(EngineError::AdapterFiles(format!("{name} holds NaN or infinite values"))),
            Err(err) => Err(internal(name, err)),
        }
    };
    let mut layers = Vec::with_capacity(model.num_layers);
    for layer in 0..model.num_layers {
        let mut pairs: [Option<LoraPair>; 7] = Default::default();
        for &target in &config.targets {
            let path = target.module_path(layer);
            let mut take = |factor: Factor| {
                factors.remove(&(layer, target, factor)).ok_or_else(|| {
                    incompatible(format!("{path} is a declared target but its {} tensor is missing", factor.name()))
                })
            };
            let (a, b) = (take(Factor::A)?, take(Factor::B)?);
            let (a, b) = (to_engine(a, &path)?, to_engine(b, &path)?);
            let pair = LoraPair::new(&a, &b, config.scale)
                .and_then(|pair| pair.to_device(device, dtype))
                .map_err(|err| internal(&path, err))?;
            pairs[target.index()] = Some(pair);
        }
        layers.push(pairs);
    }
    Ok(AdapterWeights::new(layers))
}

/// A validated `adapter_config.json`.
#[derive(Debug)]
struct AdapterConfig {
    rank: usize,
    /// `lora_alpha / r`, or `lora_alpha / √r` with rsLoRA.
    scale: f64,
    targets: BTreeSet<LoraTarget>,
}

impl AdapterConfig {
    fn read(dir: &Path) -> Result<Self, EngineError> {
        let path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path)
            .map_err(|err| EngineError::AdapterFiles(format!("cannot read {}: {err}", path.display())))?;
        let raw: RawAdapterConfig = serde_json::from_str(&text).map_err(|err| {
            EngineError::AdapterFiles(format!("{} is not a valid PEFT LoRA config: {err}", path.display()))
        })?;
        Self::parse(raw)
    }

    fn parse(raw: RawAdapterConfig) -> Result<Self, EngineError> {
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
        if !raw.lora_alpha.is_finite() {
            return Err(incompatible(format!("lora_alpha must be finite, got {}", raw.lora_alpha)));
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
        Ok(Self { rank: raw.r, scale, targets })
    }

    fn target_names(&self) -> Vec<&'static str> {
        self.targets.iter().map(|target| target.module_name()).collect()
    }
}

#[derive(Deserialize)]
struct RawAdapterConfig {
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Factor {
    A,
    B,
}

impl Factor {
    fn name(self) -> &'static str {
        match self {
            Self::A => "lora_A",
            Self::B => "lora_B",
        }
    }

    /// A is `(r, in)`, B is `(out, r)`.
    fn shape(self, target: LoraTarget, model: &ModelConfig, rank: usize) -> [usize; 2] {
        let (fan_in, fan_out) = target.features(model);
        match self {
            Self::A => [rank, fan_in],
            Self::B => [fan_out, rank],
        }
    }
}

/// Parses `base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}[.default].weight`.
fn parse_tensor_name(name: &str, num_layers: usize) -> Result<(usize, LoraTarget, Factor), EngineError> {
    let not_ours = || {
        incompatible(format!(
            "tensor {name:?} is not a LoRA factor of a decoder layer's attention or MLP projection \
             (expected base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight and the like)"
        ))
    };
    let path =
        name.strip_prefix("base_model.model.").and_then(|rest| rest.strip_suffix(".weight")).ok_or_else(not_ours)?;
    let path = path.strip_suffix(".default").unwrap_or(path);
    let (module_path, factor) = if let Some(module) = path.strip_suffix(".lora_A") {
        (module, Factor::A)
    } else if let Some(module) = path.strip_suffix(".lora_B") {
        (module, Factor::B)
    } else {
        return Err(not_ours());
    };
    let layer = module_path
        .strip_prefix("model.layers.")
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(layer, _)| layer.parse::<usize>().ok())
        .ok_or_else(not_ours)?;
    let target =
        LoraTarget::ALL.into_iter().find(|target| target.module_path(layer) == module_path).ok_or_else(not_ours)?;
    if layer >= num_layers {
        return Err(incompatible(format!("{name} adapts layer {layer}, but the model has {num_layers} layers")));
    }
    Ok((layer, target, factor))
}

fn incompatible(reason: impl Into<String>) -> EngineError {
    EngineError::AdapterIncompatible(reason.into())
}

fn internal(what: &str, err: candle_core::Error) -> EngineError {
    EngineError::Internal(format!("preparing {what}: {err}"))
}
