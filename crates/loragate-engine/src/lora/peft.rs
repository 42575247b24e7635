//! PEFT adapter directories: `adapter_config.json` + `adapter_model.safetensors`, parsed and checked against the
//! base model and the engine's limits before anything is installed.
//!
//! Files that are missing, unreadable, malformed, not regular files inside the adapter root, over the size limit,
//! or holding NaN or infinite values (as the engine's dtype holds them, after scaling) are
//! [`EngineError::AdapterFiles`]; well-formed files that do not fit the model or the limits (unknown or unsupported
//! targets, wrong shapes, ranks that disagree or exceed `--max-lora-rank`, an out-of-bounds scale, layers the model
//! lacks, a declared target without its tensors, PEFT features loragate does not implement) are
//! [`EngineError::AdapterIncompatible`].
//!
//! Order of work: config, then the weights file's header, then every tensor's name, dtype and shape from the header;
//! only then are tensors read, one at a time, in the file's order (so that a pushed file is read as it arrives:
//! [`AdapterReader::read_pushed`]).

mod config;
mod weights_file;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use loragate_core::{AdapterLayout, AdapterSource, EngineError, GrowingFile};
use safetensors::tensor::TensorInfo;

use super::{AdapterWeights, LoraPair, LoraTarget, factor};
use crate::model::ModelConfig;
use config::AdapterConfig;
use weights_file::{WeightsFile, tensor_of};

/// The PEFT config file's name.
pub(crate) const CONFIG_FILE: &str = "adapter_config.json";
/// The PEFT weights file's name.
pub(crate) const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// What an engine accepts of an adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AdapterLimits {
    /// The largest `r`.
    pub(crate) max_rank: usize,
    /// The largest `adapter_model.safetensors`, in bytes.
    pub(crate) max_bytes: u64,
}

/// What reading an adapter needs: the model it must fit, the device and dtype its weights go to, and the engine's
/// limits. Cheap to clone onto the thread that reads.
#[derive(Clone, Debug)]
pub(crate) struct AdapterReader {
    pub(crate) model: Arc<ModelConfig>,
    pub(crate) device: Device,
    pub(crate) dtype: DType,
    pub(crate) limits: AdapterLimits,
}

impl AdapterReader {
    /// Reads and validates the adapter of `source`, returning its weights on the reader's device as its dtype.
    /// Blocking (file reads, tensor conversion): call it off the async runtime.
    pub(crate) fn read(&self, source: &AdapterSource) -> Result<AdapterWeights, EngineError> {
        let config = AdapterConfig::read(source, self.limits.max_rank, self.dtype)?;
        let file = WeightsFile::open(source, self.limits.max_bytes)?;
        self.read_weights(&config, file)
    }

    /// Reads and validates a pushed adapter while its weights file is still being written (`file` grows as the push
    /// arrives), as [`AdapterReader::read`] would read the stored version once complete: its config is the push's own
    /// (`config`, the layout's, which the store writes as `adapter_config.json`). Blocking, and waiting on the push:
    /// call it off the async runtime.
    pub(crate) fn read_pushed(
        &self,
        config: serde_json::Map<String, serde_json::Value>,
        file: GrowingFile,
    ) -> Result<AdapterWeights, EngineError> {
        let config = AdapterConfig::from_json(config, self.limits.max_rank, self.dtype)?;
        let file = WeightsFile::open_growing(file, self.limits.max_bytes)?;
        self.read_weights(&config, file)
    }

    /// Checks every entry of `file` against `config` and the model, then reads the tensors in the file's order,
    /// building each target's pair once both its factors are read.
    fn read_weights(&self, config: &AdapterConfig, mut file: WeightsFile) -> Result<AdapterWeights, EngineError> {
        let (model, device, dtype) = (&*self.model, &self.device, self.dtype);
        // Every entry is checked against the config and the model before any tensor is read.
        let mut entries = HashMap::new();
        for (name, info) in file.entries() {
            let key = check_entry(&name, &info.dtype.to_string(), &info.shape, config, model)?;
            if entries.insert(key, (name.clone(), info)).is_some() {
                return Err(EngineError::AdapterFiles(format!("{name} appears twice (with and without `.default`)")));
            }
        }
        check_complete(|key| entries.contains_key(&key), config, model)?;

        let mut in_file_order: Vec<_> = entries.into_iter().collect();
        in_file_order.sort_by_key(|(_, (_, info))| info.data_offsets.0);
        let mut layers: Vec<[Option<LoraPair>; 7]> = (0..model.num_layers).map(|_| Default::default()).collect();
        // A factor read (and transposed) before its partner.
        let mut halves: HashMap<(usize, LoraTarget), (Factor, Tensor)> = HashMap::new();
        let mut bytes = Vec::new();
        for ((layer, target, factor), (name, info)) in in_file_order {
            file.read_into(&name, &info, &mut bytes)?;
            let scale = match factor {
                Factor::A => 1.0,
                Factor::B => config.scale,
            };
            let transposed = transposed_factor(&name, &info, &bytes, scale)?;
            let Some((_, partner)) = halves.remove(&(layer, target)) else {
                halves.insert((layer, target), (factor, transposed));
                continue;
            };
            let (a_t, b_t) = match factor {
                Factor::A => (transposed, partner),
                Factor::B => (partner, transposed),
            };
            let path = target.module_path(layer);
            let pair = LoraPair::from_transposed(a_t, b_t)
                .to_device(&Device::Cpu, dtype)
                .map_err(|err| internal(&path, err))?;
            if !pair.is_finite().map_err(|err| internal(&path, err))? {
                return Err(EngineError::AdapterFiles(format!(
                    "{path} holds NaN or infinite values (after scaling by {} as {dtype:?})",
                    config.scale
                )));
            }
            layers[layer][target.index()] = Some(pair.to_device(device, dtype).map_err(|err| internal(&path, err))?);
        }
        Ok(AdapterWeights::new(layers))
    }
}

/// The factor `bytes` hold (a 2-D tensor, as its header entry `info` describes it: [`check_entry`] checked that),
/// transposed, scaled by `scale` and as f32, as a [`LoraPair`] stores it. f32 (what PEFT writes) is transposed
/// straight from the file's bytes; other float dtypes are converted first.
fn transposed_factor(name: &str, info: &TensorInfo, bytes: &[u8], scale: f64) -> Result<Tensor, EngineError> {
    let &[rows, cols] = info.shape.as_slice() else {
        return Err(incompatible(format!("{name} has shape {:?}, expected a matrix", info.shape)));
    };
    let transposed = if info.dtype == safetensors::Dtype::F32 {
        if bytes.len() != rows * cols * 4 {
            return Err(EngineError::AdapterFiles(format!(
                "{WEIGHTS_FILE} is not valid safetensors: tensor {name} has {} bytes for its shape {:?} of f32",
                bytes.len(),
                info.shape
            )));
        }
        factor::scaled_transpose_of_f32_bytes(bytes, rows, cols, scale)
    } else {
        let tensor = tensor_of(name, info, bytes)?;
        tensor.to_dtype(DType::F32).and_then(|tensor| factor::scaled_transpose(&tensor, scale))
    };
    transposed.map_err(|err| internal(name, err))
}

/// Checks a pushed adapter's layout (its config and its tensors' names, dtypes and shapes, from the safetensors
/// header) as [`AdapterReader::read`] checks the files before reading any tensor.
pub(crate) fn check_peft_layout(
    layout: &AdapterLayout,
    model: &ModelConfig,
    dtype: DType,
    limits: AdapterLimits,
) -> Result<(), EngineError> {
    let config = AdapterConfig::from_json(layout.config.clone(), limits.max_rank, dtype)?;
    let mut keys = HashSet::new();
    for tensor in &layout.tensors {
        let key = check_entry(&tensor.name, tensor.dtype.as_str(), &tensor.shape, &config, model)?;
        if !keys.insert(key) {
            return Err(EngineError::AdapterFiles(format!(
                "{} appears twice (with and without `.default`)",
                tensor.name
            )));
        }
    }
    check_complete(|key| keys.contains(&key), &config, model)
}

/// Checks one tensor's name, dtype (its safetensors name) and shape against the config and the model; returns which
/// factor of which layer's target it is.
fn check_entry(
    name: &str,
    dtype: &str,
    shape: &[usize],
    config: &AdapterConfig,
    model: &ModelConfig,
) -> Result<(usize, LoraTarget, Factor), EngineError> {
    let (layer, target, factor) = parse_tensor_name(name, model.num_layers)?;
    if !config.targets.contains(&target) {
        return Err(incompatible(format!(
            "{name} adapts {}, which target_modules {:?} does not declare",
            target.module_name(),
            config.target_names()
        )));
    }
    if !matches!(dtype, "F16" | "BF16" | "F32" | "F64") {
        return Err(incompatible(format!("{name} has dtype {dtype}, expected floats")));
    }
    let expected = factor.shape(target, model, config.rank);
    if shape != expected {
        return Err(incompatible(format!(
            "{name} has shape {shape:?}, expected {expected:?} (rank {} from adapter_config.json, {} → {} features)",
            config.rank,
            target.features(model).0,
            target.features(model).1
        )));
    }
    Ok((layer, target, factor))
}

/// Every declared target of every layer has both factors (`present` says whether one was seen).
fn check_complete(
    present: impl Fn((usize, LoraTarget, Factor)) -> bool,
    config: &AdapterConfig,
    model: &ModelConfig,
) -> Result<(), EngineError> {
    for layer in 0..model.num_layers {
        for &target in &config.targets {
            for factor in [Factor::A, Factor::B] {
                if !present((layer, target, factor)) {
                    return Err(incompatible(format!(
                        "{} is a declared target but its {} tensor is missing",
                        target.module_path(layer),
                        factor.name()
                    )));
                }
            }
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{peft_tensors, tiny_config, write_peft};

    /// f32 factors are transposed straight from the file's bytes, other float dtypes after a conversion: the same
    /// values stored as F16, BF16, F64 or F32 give the same pairs, bit for bit.
    #[test]
    fn every_float_dtype_of_a_file_gives_the_same_pairs() {
        let model = tiny_config(vec![0]);
        let targets = [LoraTarget::Q, LoraTarget::Down];
        // Random factors rounded to multiples of 1/64 within ±2: exact in every dtype below.
        let exact: HashMap<String, Tensor> = peft_tensors(&model, 2, &targets, 5)
            .into_iter()
            .map(|(name, tensor)| {
                let rounded = ((tensor * 64.0).and_then(|t| t.round()).and_then(|t| t.clamp(-128.0, 128.0)))
                    .and_then(|t| t / 64.0)
                    .expect("rounded");
                (name, rounded)
            })
            .collect();
        let config = serde_json::json!({ "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "down_proj"] });
        let reader = AdapterReader {
            model: Arc::new(model.clone()),
            device: Device::Cpu,
            dtype: DType::F32,
            limits: AdapterLimits { max_rank: 8, max_bytes: 1 << 20 },
        };
        let root = tempfile::tempdir().expect("a temporary directory");
        let load = |dtype: DType| {
            let dir = root.path().join(format!("{dtype:?}"));
            let tensors = exact.iter().map(|(name, t)| (name.clone(), t.to_dtype(dtype).expect("cast"))).collect();
            write_peft(&dir, &config, &tensors);
            reader.read(&AdapterSource::trusted(dir)).expect("loads")
        };
        let values = |weights: &AdapterWeights| -> Vec<Vec<Vec<f32>>> {
            (0..model.num_layers)
                .flat_map(|layer| targets.map(|target| (layer, target)))
                .flat_map(|(layer, target)| {
                    let pair = weights.pair(layer, target).expect("an adapted target");
                    [pair.a_t.to_vec2::<f32>().expect("Aᵀ"), pair.b_t.to_vec2::<f32>().expect("(s·B)ᵀ")]
                })
                .collect()
        };
        let from_f32 = values(&load(DType::F32));
        assert!(from_f32.iter().flatten().flatten().any(|&value| value != 0.0), "nonzero factors");
        for dtype in [DType::F16, DType::BF16, DType::F64] {
            assert_eq!(values(&load(dtype)), from_f32, "{dtype:?} against F32");
        }
    }
}
