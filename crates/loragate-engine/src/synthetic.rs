//! Engines serving a model of a real checkpoint's shape with seeded random weights: what benchmarks and load tests
//! measure the engine on when the checkpoint itself is not at hand (its output is noise; its cost is the real one).

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::config::EngineConfig;
use crate::engine::CandleEngine;
use crate::error::EngineLoadError;
use crate::model::{Llama, ModelConfig, RopeScaling, random_weights};

/// The shape of a LLaMA-family decoder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The residual stream's width.
    pub hidden_size: usize,
    /// The SwiGLU MLP's inner width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention).
    pub num_kv_heads: usize,
    /// Each head's width.
    pub head_dim: usize,
    /// Positions the model serves.
    pub max_position_embeddings: usize,
    /// Whether the LM head is the token embedding.
    pub tie_word_embeddings: bool,
}

impl ModelShape {
    /// SmolLM2-135M: hidden 576, 30 layers, 9 query heads over 3 key/value heads of 64, SwiGLU 1536, vocabulary
    /// 49,152, tied embeddings, 8,192 positions.
    pub fn smollm2_135m() -> Self {
        Self {
            vocab_size: 49_152,
            hidden_size: 576,
            intermediate_size: 1536,
            num_layers: 30,
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
        }
    }

    /// Weights of the model, embedding and LM head included.
    pub fn parameters(&self) -> usize {
        let attention = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads);
        let mlp = 3 * self.hidden_size * self.intermediate_size;
        let norms = 2 * self.hidden_size;
        let embedding = self.vocab_size * self.hidden_size;
        let head = if self.tie_word_embeddings { 0 } else { embedding };
        self.num_layers * (attention + mlp + norms) + self.hidden_size + embedding + head
    }

    /// Floating-point operations (multiply and add counted apart) of prefilling a `tokens`-token prompt in one pass:
    /// every layer's projections and MLP for every token, causal attention (`QKᵀ` and the weighted sum, half the
    /// square), and the LM head for the last position only.
    pub fn prefill_flops(&self, tokens: usize) -> f64 {
        let tokens = tokens as f64;
        let per_token_layer = 2.0
            * (self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
                + 3 * self.hidden_size * self.intermediate_size) as f64;
        let attention = 2.0 * 2.0 * (self.num_heads * self.head_dim) as f64 * tokens * (tokens + 1.0) / 2.0;
        let head = 2.0 * (self.vocab_size * self.hidden_size) as f64;
        self.num_layers as f64 * (per_token_layer * tokens + attention) + head
    }

    fn model_config(&self) -> ModelConfig {
        ModelConfig {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_layers,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            rms_norm_eps: 1e-5,
            rope_theta: 100_000.0,
            rope_scaling: RopeScaling::None,
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            eos_token_ids: Vec::new(),
        }
    }
}

impl CandleEngine {
    /// An engine serving a model of `shape` whose weights are drawn from a `StdRng` seeded with `seed` (projections
    /// with `1/√fan_in`, so activations keep their scale), with no tokenizer and no end-of-sequence token. Blocking:
    /// drawing SmolLM2-135M's weights takes a few seconds.
    pub fn with_random_weights(shape: &ModelShape, seed: u64, config: EngineConfig) -> Result<Self, EngineLoadError> {
        let model_config = shape.model_config();
        let weights = random_weights(&model_config, &mut StdRng::seed_from_u64(seed))
            .map_err(|err| EngineLoadError::Weights(err.to_string()))?;
        let device = config.device.open()?;
        let dtype = config.dtype.for_device(&device)?;
        let max_context = config.max_context_length.map(|max| max as usize);
        let model = Llama::from_weights(model_config, weights, &device, dtype, max_context)?;
        Self::start(model, None, &config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_135m_has_its_parameter_count_and_prefill_arithmetic() {
        let shape = ModelShape::smollm2_135m();
        assert_eq!(shape.parameters(), 134_515_008, "SmolLM2-135M's published 134.5M parameters");
        let flops = shape.prefill_flops(3000);
        assert!((0.9e12..1.0e12).contains(&flops), "about 0.9 TFLOP for 3,000 tokens: {flops:e}");
    }
}
