//! Random PEFT LoRA adapters for any model this engine serves: real PEFT directories (`adapter_config.json` +
//! `adapter_model.safetensors`), shaped for the model, with seeded random factors. They are untrained: each shifts
//! the model's outputs (greedy decoding takes another path than the base model's, and another than a different
//! seed's) without teaching it anything. They exist to try the plumbing — choosing an adapter per request, loading,
//! swapping, pausing — on a real model before bringing trained adapters.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::json;

use crate::error::EngineLoadError;
use crate::gguf::{GgufFile, ModelFormat};
use crate::lora::LoraTarget;
use crate::model::{ModelConfig, random_tensor};

/// The shape of a random adapter.
#[derive(Clone, Debug, PartialEq)]
pub struct RandomAdapter {
    /// The LoRA rank `r`.
    pub rank: usize,
    /// `lora_alpha` (the scale is `lora_alpha / r`).
    pub alpha: f64,
    /// The standard deviation of `lora_B`'s values (`lora_A`'s are uniform within `±1/√in`, PEFT's initialisation).
    /// PEFT starts `lora_B` at zero, which would change nothing; the default, 0.01, perturbs a small model's
    /// projections by a few percent.
    pub b_std: f32,
    /// The seed of the factors: the same seed gives the same adapter.
    pub seed: u64,
}

impl Default for RandomAdapter {
    fn default() -> Self {
        Self { rank: 8, alpha: 16.0, b_std: 0.01, seed: 1 }
    }
}

/// Why a random adapter could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RandomAdapterError {
    /// The model's configuration could not be read.
    #[error(transparent)]
    Model(#[from] EngineLoadError),
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The factors could not be made or saved.
    #[error("adapter weights: {0}")]
    Tensor(#[from] candle_core::Error),
    /// The rank is zero.
    #[error("the rank must be at least 1")]
    Rank,
}

/// Writes a random adapter (see the module's documentation) for the model at `model` (a Hugging Face directory or a
/// GGUF file) into the directory `out`, adapting all seven projections of every layer.
pub fn write_random_adapter(model: &Path, out: &Path, adapter: &RandomAdapter) -> Result<(), RandomAdapterError> {
    if adapter.rank == 0 {
        return Err(RandomAdapterError::Rank);
    }
    let config = match ModelFormat::of(model) {
        ModelFormat::HuggingFace => ModelConfig::from_model_dir(model)?,
        ModelFormat::Gguf => GgufFile::open(model)?.model_config()?,
    };
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| RandomAdapterError::Io { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    let base_name = model.file_name().map_or_else(String::new, |name| name.to_string_lossy().into_owned());
    let peft_config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": adapter.rank,
        "lora_alpha": adapter.alpha,
        "lora_dropout": 0.0,
        "target_modules": LoraTarget::ALL.map(LoraTarget::module_name),
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "use_dora": false,
        "inference_mode": true,
        "loragate_random_adapter": { "seed": adapter.seed, "b_std": adapter.b_std, "trained": false },
    });
    let config_path = out.join("adapter_config.json");
    let text = serde_json::to_string_pretty(&peft_config)
        .map_err(|err| RandomAdapterError::Io { path: config_path.clone(), source: std::io::Error::other(err) })?;
    std::fs::write(&config_path, text + "\n").map_err(io(&config_path))?;

    let mut rng = StdRng::seed_from_u64(adapter.seed);
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for layer in 0..config.num_layers {
        for target in LoraTarget::ALL {
            let (fan_in, fan_out) = target.features(&config);
            let path = target.module_path(layer);
            // Uniform values of standard deviation `std` lie within ±√3·std.
            let a_std = 1.0 / (3.0 * fan_in as f32).sqrt();
            let a = random_tensor(&mut rng, (adapter.rank, fan_in), a_std, &Device::Cpu)?;
            let b = random_tensor(&mut rng, (fan_out, adapter.rank), adapter.b_std, &Device::Cpu)?;
            tensors.insert(format!("base_model.model.{path}.lora_A.weight"), a);
            tensors.insert(format!("base_model.model.{path}.lora_B.weight"), b);
        }
    }
    candle_core::safetensors::save(&tensors, out.join("adapter_model.safetensors"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::{AdapterLimits, AdapterReader};
    use crate::test_support::{TempDir, tiny_config, tiny_weights};
    use loragate_core::AdapterSource;

    #[test]
    fn a_random_adapter_loads_as_peft_for_its_model_and_its_seed_decides_its_values() {
        let dir = TempDir::new("random-adapter");
        let config = tiny_config(vec![]);
        let model_dir = dir.path().join("model");
        std::fs::create_dir_all(&model_dir).expect("model dir");
        let hf_config = json!({
            "model_type": "llama", "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
            "max_position_embeddings": config.max_position_embeddings,
        });
        std::fs::write(model_dir.join("config.json"), hf_config.to_string()).expect("config");
        candle_core::safetensors::save(&tiny_weights(&config, 1), model_dir.join("model.safetensors"))
            .expect("weights");

        let write = |name: &str, seed: u64| {
            let out = dir.path().join(name);
            write_random_adapter(&model_dir, &out, &RandomAdapter { seed, ..RandomAdapter::default() }).expect("write");
            out
        };
        let reader = AdapterReader {
            model: std::sync::Arc::new(config.clone()),
            device: Device::Cpu,
            dtype: candle_core::DType::F32,
            limits: AdapterLimits { max_rank: 64, max_bytes: 1 << 30 },
        };
        let load = |path: &Path| reader.read(&AdapterSource::trusted(path)).expect("a valid PEFT adapter");
        let (first, again, other) = (write("first", 1), write("again", 1), write("other", 2));
        let weights = load(&first);
        for target in LoraTarget::ALL {
            assert_eq!(weights.rank(target), 8, "{target:?} is adapted at rank 8");
        }
        let bytes = |path: &Path| std::fs::read(path.join("adapter_model.safetensors")).expect("read");
        assert_eq!(bytes(&first), bytes(&again), "the same seed, the same factors");
        assert_ne!(bytes(&first), bytes(&other), "another seed, other factors");
        load(&other);
        assert!(matches!(
            write_random_adapter(&model_dir, &dir.path().join("bad"), &RandomAdapter { rank: 0, ..Default::default() }),
            Err(RandomAdapterError::Rank)
        ));
    }
}
