//! Tiny random models and helpers shared by the unit tests.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use futures::StreamExt;
use loragate_core::{
    EngineError, EngineEvent, EngineStream, FinishReason, ModelInfo, RawSampleRequest, SampleRequest, TopLogprobs,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::lora::{AdapterWeights, LoraTarget, random_adapter};
use crate::model::{Llama, ModelConfig, RopeScaling, WeightMap, random_weights};

/// A tiny LLaMA: vocabulary 64, hidden 32, 2 layers, 4 query heads over 2 key/value heads, 4096 positions.
pub(crate) fn tiny_config(eos_token_ids: Vec<u32>) -> ModelConfig {
    ModelConfig {
        vocab_size: 64,
        hidden_size: 32,
        intermediate_size: 48,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: RopeScaling::None,
        max_position_embeddings: 4096,
        tie_word_embeddings: false,
        eos_token_ids,
    }
}

/// Seeded random weights for `config`.
pub(crate) fn tiny_weights(config: &ModelConfig, seed: u64) -> WeightMap {
    random_weights(config, &mut StdRng::seed_from_u64(seed)).expect("random weights")
}

/// A model of `config` with the weights of seed 7.
pub(crate) fn tiny_model(config: ModelConfig) -> Llama {
    let weights = tiny_weights(&config, 7);
    Llama::from_weights(config, weights, &Device::Cpu, DType::F32, None).expect("tiny model")
}

/// A random adapter on every target of `config`'s model, rank 4, scale 2.
pub(crate) fn tiny_adapter(config: &ModelConfig, seed: u64) -> Arc<AdapterWeights> {
    random_adapter(config, 4, 2.0, &LoraTarget::ALL, seed, &Device::Cpu).expect("random adapter")
}

/// The [`ModelInfo`] an engine of `config` reports.
pub(crate) fn info(config: &ModelConfig) -> ModelInfo {
    ModelInfo {
        vocab_size: config.vocab_size as u32,
        context_length: config.max_position_embeddings as u32,
        eos_token_ids: config.eos_token_ids.clone(),
    }
}

/// Validates `raw` against `config`'s model.
pub(crate) fn request(config: &ModelConfig, raw: RawSampleRequest) -> SampleRequest {
    SampleRequest::parse(raw, &info(config)).expect("valid request")
}

/// A greedy request of `lora` (empty for the base model) over `prompt`, ignoring EOS, for `max_tokens`.
pub(crate) fn greedy(lora: &str, prompt: &[u32], max_tokens: u32) -> RawSampleRequest {
    RawSampleRequest {
        lora_name: lora.into(),
        prompt_token_ids: prompt.to_vec(),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Default::default()
    }
}

/// Maximum absolute difference between two tensors of the same shape.
pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar())
        .expect("diff")
}

/// Everything one request produced.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    /// Per sequence: tokens, logprobs, finish reason.
    pub(crate) sequences: Vec<CollectedSequence>,
    pub(crate) prompt_logprobs: Option<Vec<f32>>,
    pub(crate) prompt_top_logprobs: Option<Vec<TopLogprobs>>,
    /// The prompt tokens found in the prefix cache, if the engine said.
    pub(crate) cached_tokens: Option<u32>,
    pub(crate) errors: Vec<String>,
    /// Every event in order, for ordering checks.
    pub(crate) events: Vec<EngineEvent>,
}

/// One sequence's output.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CollectedSequence {
    pub(crate) token_ids: Vec<u32>,
    pub(crate) logprobs: Vec<f32>,
    pub(crate) versions: Vec<u64>,
    pub(crate) top_logprobs: Vec<TopLogprobs>,
    pub(crate) finish: Option<FinishReason>,
    /// The keys and values it was parked with, if a pause parked it.
    pub(crate) parked: Option<loragate_core::ParkedKv>,
    /// Whether it resumed from parked keys and values.
    pub(crate) resumed: bool,
}

impl Collected {
    /// Records one event.
    pub(crate) fn record(&mut self, event: Result<EngineEvent, EngineError>) {
        let event = match event {
            Ok(event) => event,
            Err(err) => {
                self.errors.push(err.to_string());
                return;
            }
        };
        match &event {
            EngineEvent::PromptLogprobs(logprobs) => self.prompt_logprobs = Some(logprobs.clone()),
            EngineEvent::PromptTopLogprobs(top) => self.prompt_top_logprobs = Some(top.clone()),
            EngineEvent::PromptCached { tokens } => self.cached_tokens = Some(*tokens),
            EngineEvent::Tokens { sequence, version, token_ids, logprobs, top_logprobs } => {
                let output = self.sequence(*sequence);
                output.token_ids.extend(token_ids);
                output.logprobs.extend(logprobs);
                output.versions.extend(token_ids.iter().map(|_| version.0));
                output.top_logprobs.extend(top_logprobs.iter().cloned());
            }
            EngineEvent::Finished { sequence, reason } => self.sequence(*sequence).finish = Some(*reason),
            EngineEvent::Parked { sequence, kv } => self.sequence(*sequence).parked = Some(kv.clone()),
            EngineEvent::Resumed { sequence } => self.sequence(*sequence).resumed = true,
        }
        self.events.push(event);
    }

    fn sequence(&mut self, index: u32) -> &mut CollectedSequence {
        let index = index as usize;
        if self.sequences.len() <= index {
            self.sequences.resize_with(index + 1, Default::default);
        }
        &mut self.sequences[index]
    }

    /// The only sequence.
    pub(crate) fn single(&self) -> &CollectedSequence {
        assert_eq!(self.sequences.len(), 1, "{self:?}");
        &self.sequences[0]
    }
}

/// Reads `stream` to its end (failing the test after 30 s).
pub(crate) async fn collect(mut stream: EngineStream) -> Collected {
    let mut collected = Collected::default();
    let read = async {
        while let Some(event) = stream.next().await {
            collected.record(event);
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read).await.expect("the stream ended in time");
    collected
}

/// A temporary directory (from `tempfile`) named after its test, removed when dropped.
pub(crate) struct TempDir(tempfile::TempDir);

impl TempDir {
    pub(crate) fn new(label: &str) -> Self {
        Self(tempfile::Builder::new().prefix(&format!("loragate-{label}-")).tempdir().expect("temp dir"))
    }

    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }
}

/// Writes a PEFT adapter directory: `config` as `adapter_config.json` and `tensors` as `adapter_model.safetensors`.
pub(crate) fn write_peft(dir: &Path, config: &serde_json::Value, tensors: &WeightMap) {
    std::fs::create_dir_all(dir).expect("adapter dir");
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).expect("adapter config");
    candle_core::safetensors::save(tensors, dir.join("adapter_model.safetensors")).expect("adapter weights");
}

/// Random PEFT factors (nonzero A and B) of rank `rank` for `targets` of every layer of `config`'s model, under
/// PEFT's names.
pub(crate) fn peft_tensors(config: &ModelConfig, rank: usize, targets: &[LoraTarget], seed: u64) -> WeightMap {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tensors = WeightMap::new();
    for layer in 0..config.num_layers {
        for target in targets {
            let (fan_in, fan_out) = target.features(config);
            let path = target.module_path(layer);
            let a = crate::model::random_tensor(&mut rng, (rank, fan_in), 0.3, &Device::Cpu).expect("A");
            let b = crate::model::random_tensor(&mut rng, (fan_out, rank), 0.3, &Device::Cpu).expect("B");
            tensors.insert(format!("base_model.model.{path}.lora_A.weight"), a);
            tensors.insert(format!("base_model.model.{path}.lora_B.weight"), b);
        }
    }
    tensors
}
