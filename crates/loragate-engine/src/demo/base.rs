//! The demo base model's shape and files, and the adapters' PEFT files.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use serde_json::json;

use super::train::{TrainedAdapter, TrainingPlan};
use super::vocab::{self, BOS, EOS, PAD, VOCAB_SIZE};
use super::{DEMO_MODEL_NAME, DemoError};
use crate::lora::LoraTarget;
use crate::model::{Llama, random_weights};

/// The demo model: LLaMA-shaped and small enough to train adapters for in seconds and to decode thousands of
/// tokens per second on two CPU cores.
const HIDDEN_SIZE: usize = 128;
const INTERMEDIATE_SIZE: usize = 256;
const NUM_LAYERS: usize = 4;
const NUM_HEADS: usize = 4;
const NUM_KV_HEADS: usize = 2;
/// The demo context length, prompt plus generated tokens.
const CONTEXT_LENGTH: usize = 4096;

/// How the demo adapters are trained (see `train.rs`).
pub(super) const TRAINING: TrainingPlan =
    TrainingPlan { rank: 8, alpha: 16.0, steps: 50, rows: 8, sequence_len: 48, learning_rate: 1e-2 };

/// The demo's chat template (`tokenizer_config.json`'s `chat_template`): each message as `<|role|>`, a newline, its
/// content and a newline, then `<|assistant|>` and a newline for the generation prompt. Small, but shaped like the
/// templates of real chat models, and the adapters answer after it as after any prompt.
const CHAT_TEMPLATE: &str = "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n\
    {% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

/// `config.json`.
fn model_config() -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": "float32",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HIDDEN_SIZE / NUM_HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT_LENGTH,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": null,
        "attention_bias": false,
        "mlp_bias": false,
        "tie_word_embeddings": false,
        "initializer_range": 0.02,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "use_cache": true,
        "_name_or_path": DEMO_MODEL_NAME,
    })
}

/// Writes the base model's directory into `dir` and loads it back (so the adapters are trained on exactly what is
/// served).
pub(super) fn write_base_model(dir: &Path, rng: &mut StdRng) -> Result<Llama, DemoError> {
    std::fs::create_dir_all(dir).map_err(DemoError::io(dir))?;
    write_json(&dir.join("config.json"), &model_config())?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({ "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "do_sample": false }),
    )?;
    let config: crate::model::ModelConfig = crate::model::ModelConfig::from_model_dir(dir)?;
    let weights = random_weights(&config, rng)?;
    candle_core::safetensors::save(&weights, dir.join("model.safetensors"))?;
    vocab::write_tokenizer(dir)?;
    let specials: serde_json::Map<String, serde_json::Value> = vocab::special_token_names()
        .iter()
        .map(|(id, name)| (id.to_string(), json!({ "content": name, "special": true })))
        .collect();
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
            "add_bos_token": false, "model_max_length": CONTEXT_LENGTH,
            "added_tokens_decoder": specials,
            "chat_template": CHAT_TEMPLATE,
        }),
    )?;
    Ok(Llama::load(dir, &Device::Cpu, DType::F32, None)?)
}

/// Writes one trained adapter as a PEFT directory.
pub(super) fn write_adapter(dir: &Path, adapter: &TrainedAdapter, plan: &TrainingPlan) -> Result<(), DemoError> {
    std::fs::create_dir_all(dir).map_err(DemoError::io(dir))?;
    write_json(
        &dir.join("adapter_config.json"),
        &json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": DEMO_MODEL_NAME,
            "r": plan.rank,
            "lora_alpha": plan.alpha,
            "lora_dropout": 0.0,
            "target_modules": LoraTarget::ALL.map(LoraTarget::module_name),
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "inference_mode": true,
        }),
    )?;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (layer, pairs) in adapter.factors.iter().enumerate() {
        for (target, (a, b)) in LoraTarget::ALL.iter().zip(pairs) {
            let path = target.module_path(layer);
            tensors.insert(format!("base_model.model.{path}.lora_A.weight"), a.clone());
            tensors.insert(format!("base_model.model.{path}.lora_B.weight"), b.clone());
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors"))?;
    Ok(())
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), DemoError> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").map_err(DemoError::io(path))
}
