//! Hugging Face weights: reading `model.safetensors` (or the shards named by `model.safetensors.index.json`),
//! checking every tensor's shape, and assembling the [`Llama`].

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use candle_core::safetensors::Load;
use candle_core::{DType, Device, Shape, Tensor};
use rand::Rng;
use serde::Deserialize;

use super::Llama;
use super::config::ModelConfig;
use super::layer::{Attention, DecoderLayer, Mlp, Projection};
use super::linear::Linear;
use super::rope::RopeTables;
use crate::config::QuantizedWeights;
use crate::error::EngineLoadError;
use crate::gguf::{GgufFile, GgufSource, read_weights};
use crate::lora::LoraTarget;

/// Tensors by Hugging Face name.
pub(crate) type WeightMap = HashMap<String, Tensor>;

impl Llama {
    /// Loads a Hugging Face model directory onto `device` as `dtype`, serving at most `max_context` positions.
    pub(crate) fn load(
        dir: &Path,
        device: &Device,
        dtype: DType,
        max_context: Option<usize>,
    ) -> Result<Self, EngineLoadError> {
        let config = ModelConfig::from_model_dir(dir)?;
        let weights = read_safetensors(dir, &config, device, dtype)?;
        Self::from_weights(config, weights, device, dtype, max_context)
    }

    /// Loads the model of an open GGUF file onto `device` as `dtype`, its weight matrices kept quantized or
    /// dequantized as `matrices` says, serving at most `max_context` positions.
    pub(crate) fn load_gguf(
        file: &GgufFile,
        device: &Device,
        dtype: DType,
        max_context: Option<usize>,
        matrices: QuantizedWeights,
    ) -> Result<Self, EngineLoadError> {
        let config = file.model_config()?;
        let mut source = GgufSource::new(read_weights(file, &config)?, device, dtype, matrices);
        Self::assemble(config, &mut source, device, dtype, max_context)
    }

    /// Assembles a model from named tensors (any device and dtype; they are moved), checking every shape.
    pub(crate) fn from_weights(
        config: ModelConfig,
        weights: WeightMap,
        device: &Device,
        dtype: DType,
        max_context: Option<usize>,
    ) -> Result<Self, EngineLoadError> {
        let mut source = DenseSource { map: weights, device, dtype };
        Self::assemble(config, &mut source, device, dtype, max_context)
    }

    /// Assembles a model from `source`, checking every shape.
    fn assemble(
        config: ModelConfig,
        weights: &mut impl WeightSource,
        device: &Device,
        dtype: DType,
        max_context: Option<usize>,
    ) -> Result<Self, EngineLoadError> {
        let hidden = config.hidden_size;
        let take = |weights: &mut dyn WeightSource, name: &str, shape: Shape| {
            weights.tensor(name, &shape)?.ok_or_else(|| EngineLoadError::weights(format!("missing {name}")))
        };
        let embed_tokens = take(weights, "model.embed_tokens.weight", (config.vocab_size, hidden).into())?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for index in 0..config.num_layers {
            let mut projection = |target: LoraTarget| -> Result<Projection, EngineLoadError> {
                let path = target.module_path(index);
                let (fan_in, fan_out) = target.features(&config);
                let name = format!("{path}.weight");
                let weight = weights
                    .linear(&name, &(fan_out, fan_in).into())?
                    .ok_or_else(|| EngineLoadError::weights(format!("missing {name}")))?;
                let bias = weights.tensor(&format!("{path}.bias"), &fan_out.into())?;
                Ok(Projection { weight, bias, target })
            };
            let attention = Attention {
                q: projection(LoraTarget::Q)?,
                k: projection(LoraTarget::K)?,
                v: projection(LoraTarget::V)?,
                o: projection(LoraTarget::O)?,
                num_heads: config.num_heads,
                num_kv_heads: config.num_kv_heads,
                head_dim: config.head_dim,
            };
            let mlp = Mlp {
                gate: projection(LoraTarget::Gate)?,
                up: projection(LoraTarget::Up)?,
                down: projection(LoraTarget::Down)?,
            };
            layers.push(DecoderLayer {
                index,
                input_norm: take(weights, &format!("model.layers.{index}.input_layernorm.weight"), hidden.into())?,
                attention,
                post_attention_norm: take(
                    weights,
                    &format!("model.layers.{index}.post_attention_layernorm.weight"),
                    hidden.into(),
                )?,
                mlp,
                rms_norm_eps: config.rms_norm_eps,
            });
        }
        let norm = take(weights, "model.norm.weight", hidden.into())?;
        let lm_head = match config.tie_word_embeddings {
            true => weights.tied_lm_head(&embed_tokens)?,
            false => weights
                .linear("lm_head.weight", &(config.vocab_size, hidden).into())?
                .ok_or_else(|| EngineLoadError::weights("missing lm_head.weight"))?,
        };
        let context_length = config.served_context(max_context);
        let rope = RopeTables::new(&config, context_length, device, dtype).map_err(weights_error)?;
        Ok(Self { config, embed_tokens, layers, norm, lm_head, rope, context_length, device: device.clone(), dtype })
    }
}

/// Where a model's tensors come from while it is assembled; each tensor is taken once, checked and converted.
pub(crate) trait WeightSource {
    /// The tensor `name`, checked against `shape`, on the engine's device in its dtype; `None` if absent.
    fn tensor(&mut self, name: &str, shape: &Shape) -> Result<Option<Tensor>, EngineLoadError>;

    /// The weight matrix `name` `(out, in)`, checked against `shape`; `None` if absent.
    fn linear(&mut self, name: &str, shape: &Shape) -> Result<Option<Linear>, EngineLoadError>;

    /// The LM head of a model whose head is its embedding `embedding` `(vocab, hidden)` (as [`Self::tensor`] returned
    /// it).
    fn tied_lm_head(&mut self, embedding: &Tensor) -> Result<Linear, EngineLoadError>;
}

/// The tensor names a model of `config` may use (biases included, whether or not the checkpoint has them).
fn known_names(config: &ModelConfig) -> BTreeSet<String> {
    let mut names: BTreeSet<String> =
        ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"].map(String::from).into();
    for layer in 0..config.num_layers {
        names.insert(format!("model.layers.{layer}.input_layernorm.weight"));
        names.insert(format!("model.layers.{layer}.post_attention_layernorm.weight"));
        for target in LoraTarget::ALL {
            names.insert(format!("{}.weight", target.module_path(layer)));
            names.insert(format!("{}.bias", target.module_path(layer)));
        }
    }
    names
}

/// Reads the model's tensors (ignoring names the model does not use, such as old checkpoints' `inv_freq`), one
/// shard at a time, converting each tensor to the engine's device and dtype as it is read.
fn read_safetensors(
    dir: &Path,
    config: &ModelConfig,
    device: &Device,
    dtype: DType,
) -> Result<WeightMap, EngineLoadError> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    let files = if single.exists() {
        vec![single]
    } else if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|source| EngineLoadError::io(&index, source))?;
        let index_json: SafetensorsIndex = serde_json::from_str(&text)
            .map_err(|err| EngineLoadError::weights(format!("{}: {err}", index.display())))?;
        let shards: BTreeSet<String> = index_json.weight_map.into_values().collect();
        shards.into_iter().map(|shard| dir.join(shard)).collect()
    } else {
        return Err(EngineLoadError::weights(format!(
            "{} has neither model.safetensors nor model.safetensors.index.json",
            dir.display()
        )));
    };
    let known = known_names(config);
    let mut weights = WeightMap::new();
    for file in files {
        let bytes = std::fs::read(&file).map_err(|source| EngineLoadError::io(&file, source))?;
        let tensors = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|err| EngineLoadError::weights(format!("{}: {err}", file.display())))?;
        for (name, view) in tensors.iter().filter(|(name, _)| known.contains(*name)) {
            let tensor = view
                .load(&Device::Cpu)
                .and_then(|tensor| tensor.to_dtype(dtype))
                .and_then(|tensor| tensor.to_device(device))
                .map_err(|err| EngineLoadError::weights(format!("{name} in {}: {err}", file.display())))?;
            weights.insert(name.to_owned(), tensor);
        }
    }
    Ok(weights)
}

/// Dense named tensors (any device and dtype) being moved into a model.
struct DenseSource<'a> {
    map: WeightMap,
    device: &'a Device,
    dtype: DType,
}

impl WeightSource for DenseSource<'_> {
    fn tensor(&mut self, name: &str, shape: &Shape) -> Result<Option<Tensor>, EngineLoadError> {
        let Some(tensor) = self.map.remove(name) else { return Ok(None) };
        check_shape(name, &tensor, shape)?;
        to_engine(&tensor, self.device, self.dtype).map(Some)
    }

    fn linear(&mut self, name: &str, shape: &Shape) -> Result<Option<Linear>, EngineLoadError> {
        let Some(weight) = self.tensor(name, shape)? else { return Ok(None) };
        Linear::dense(&weight).map(Some).map_err(weights_error)
    }

    fn tied_lm_head(&mut self, embedding: &Tensor) -> Result<Linear, EngineLoadError> {
        // A transposed view: the GEMM reads it in place, no second copy of the embedding.
        Ok(Linear::Dense { weight_t: embedding.t().map_err(weights_error)? })
    }
}

#[derive(Deserialize)]
struct SafetensorsIndex {
    weight_map: HashMap<String, String>,
}

pub(crate) fn check_shape(name: &str, tensor: &Tensor, expected: &Shape) -> Result<(), EngineLoadError> {
    if tensor.shape() != expected {
        return Err(EngineLoadError::weights(format!(
            "{name} has shape {:?}, expected {:?}",
            tensor.dims(),
            expected.dims()
        )));
    }
    if !tensor.dtype().is_float() {
        return Err(EngineLoadError::weights(format!("{name} has dtype {:?}, expected floats", tensor.dtype())));
    }
    Ok(())
}

pub(crate) fn to_engine(tensor: &Tensor, device: &Device, dtype: DType) -> Result<Tensor, EngineLoadError> {
    tensor.to_dtype(dtype).and_then(|tensor| tensor.to_device(device)).map_err(weights_error)
}

pub(crate) fn weights_error(err: candle_core::Error) -> EngineLoadError {
    EngineLoadError::weights(err.to_string())
}

/// A tensor of `shape` drawn uniformly with standard deviation `std` from `rng`. candle's own CPU generator cannot
/// be seeded, so seeded weights come from `rand`.
pub(crate) fn random_tensor(
    rng: &mut impl Rng,
    shape: impl Into<Shape>,
    std: f32,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let shape = shape.into();
    let bound = std * 3f32.sqrt();
    let values: Vec<f32> = (0..shape.elem_count()).map(|_| rng.random_range(-bound..=bound)).collect();
    Tensor::from_vec(values, shape, device)
}

/// Seeded random weights for `config` (f32, on the CPU): the embedding and LM head with unit-scale rows, every
/// projection with `1/√fan_in` (so activations keep their scale through the random layers), norms at 1.
pub(crate) fn random_weights(config: &ModelConfig, rng: &mut impl Rng) -> candle_core::Result<WeightMap> {
    let device = Device::Cpu;
    let hidden = config.hidden_size;
    let mut weights = WeightMap::new();
    weights.insert("model.embed_tokens.weight".into(), random_tensor(rng, (config.vocab_size, hidden), 1.0, &device)?);
    for layer in 0..config.num_layers {
        for target in LoraTarget::ALL {
            let (fan_in, fan_out) = target.features(config);
            let std = 1.0 / (fan_in as f32).sqrt();
            weights.insert(
                format!("{}.weight", target.module_path(layer)),
                random_tensor(rng, (fan_out, fan_in), std, &device)?,
            );
        }
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            weights.insert(format!("model.layers.{layer}.{norm}.weight"), Tensor::ones(hidden, DType::F32, &device)?);
        }
    }
    weights.insert("model.norm.weight".into(), Tensor::ones(hidden, DType::F32, &device)?);
    if !config.tie_word_embeddings {
        let std = 2.0 / (hidden as f32).sqrt();
        weights.insert("lm_head.weight".into(), random_tensor(rng, (config.vocab_size, hidden), std, &device)?);
    }
    Ok(weights)
}
