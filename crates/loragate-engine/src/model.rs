//! Our own LLaMA-family decoder (LLaMA, Qwen2, Mistral): token embedding → N × [RMSNorm, grouped-query attention
//! with RoPE, RMSNorm, SwiGLU MLP] → RMSNorm → LM head. It is ours rather than candle-transformers' so that every
//! projection takes a per-row LoRA ([`LoraBatch`]), and so that a decode step runs many sequences of different
//! lengths at once over a [`BatchKvCache`].
//!
//! The model is immutable once loaded (`&self` everywhere); all per-sequence state lives in the caches.

mod config;
mod kv_cache;
mod layer;
mod linear;
mod ops;
mod quantized;
mod rope;
#[cfg(test)]
mod tests;
mod weights;

use candle_core::{D, DType, Device, Result, Tensor};

use crate::lora::LoraBatch;
use layer::{AttentionInput, DecoderLayer};
use rope::RopeTables;

pub(crate) use config::ModelConfig;
#[cfg(test)]
pub(crate) use config::RopeScaling;
pub(crate) use kv_cache::{BatchKvCache, LayerKv};
pub(crate) use linear::Linear;
#[cfg(test)]
pub(crate) use weights::WeightMap;
pub(crate) use weights::{WeightSource, check_shape, random_tensor, random_weights, to_engine, weights_error};

/// A loaded LLaMA-family model.
#[derive(Debug)]
pub(crate) struct Llama {
    config: ModelConfig,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: Tensor,
    /// `(vocab, hidden)`; the embedding itself when the checkpoint ties them.
    lm_head: Linear,
    rope: RopeTables,
    /// Positions served: the RoPE tables and KV caches never go past this.
    context_length: usize,
    device: Device,
    dtype: DType,
}

/// The output of a forward pass over whole sequences.
pub(crate) struct SequencesOutput {
    /// The final hidden states (after the last norm), `(rows, len, hidden)`.
    pub(crate) hidden: Tensor,
    /// Each layer's keys and values, `(rows, kv_heads, len, head_dim)`.
    pub(crate) kv: Vec<LayerKv>,
}

impl Llama {
    pub(crate) fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    /// The longest sequence (prompt plus generated tokens) this model serves.
    pub(crate) fn context_length(&self) -> usize {
        self.context_length
    }

    /// Runs `tokens` `(rows, len)` (u32), every row from position 0, causally.
    pub(crate) fn forward_sequences(&self, tokens: &Tensor, lora: &LoraBatch) -> Result<SequencesOutput> {
        let len = tokens.dims2()?.1;
        if len > self.context_length {
            candle_core::bail!("{len} positions exceed the context length {}", self.context_length);
        }
        let (cos, sin) = self.rope.prefix(len)?;
        let causal_mask = causal_mask(len, &self.device, self.dtype)?;
        let mut x = self.embed(tokens)?;
        let mut kv = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let input = AttentionInput::Sequences { cos: &cos, sin: &sin, causal_mask: &causal_mask };
            let (next, layer_kv) = layer.forward(&x, lora, input)?;
            x = next;
            kv.extend(layer_kv);
        }
        Ok(SequencesOutput { hidden: ops::rms_norm(&x, &self.norm, self.config.rms_norm_eps)?, kv })
    }

    /// One decode step: row `i` of `cache` gets `tokens[i]` at position `positions[i]` (its cached length). Returns
    /// the next-token logits `(rows, vocab)` in f32. The cache must have had [`BatchKvCache::reserve_step`].
    pub(crate) fn forward_step(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        cache: &mut BatchKvCache,
        lora: &LoraBatch,
    ) -> Result<Tensor> {
        let (cos, sin) = self.rope.at(positions)?;
        let mask = cache.step_mask()?;
        let mut x = self.embed(&tokens.unsqueeze(1)?)?;
        for layer in &self.layers {
            let input = AttentionInput::Step { cos: &cos, sin: &sin, cache, mask: &mask };
            x = layer.forward(&x, lora, input)?.0;
        }
        cache.advance();
        let hidden = ops::rms_norm(&x, &self.norm, self.config.rms_norm_eps)?.squeeze(1)?;
        self.logits(&hidden)
    }

    /// Logits `(…, vocab)` in f32 of final hidden states `(…, hidden)`.
    pub(crate) fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let dims = hidden.dims().to_vec();
        let hidden_size = dims[dims.len() - 1];
        let flat = hidden.reshape(((), hidden_size))?;
        let logits = self.lm_head.forward(&flat)?.to_dtype(DType::F32)?;
        let mut out_dims = dims;
        *out_dims.last_mut().expect("hidden states have a last dimension") = self.config.vocab_size;
        logits.reshape(out_dims)
    }

    fn embed(&self, tokens: &Tensor) -> Result<Tensor> {
        let (rows, len) = tokens.dims2()?;
        self.embed_tokens.index_select(&tokens.flatten_all()?, 0)?.reshape((rows, len, self.config.hidden_size))
    }
}

/// `(len, len)`: 0 on and below the diagonal, `-inf` above.
fn causal_mask(len: usize, device: &Device, dtype: DType) -> Result<Tensor> {
    let values: Vec<f32> =
        (0..len).flat_map(|i| (0..len).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY })).collect();
    Tensor::from_vec(values, (len, len), device)?.to_dtype(dtype)
}

/// `log_softmax` over the last dimension, in f32.
pub(crate) fn log_softmax(logits: &Tensor) -> Result<Tensor> {
    candle_nn::ops::log_softmax(&logits.to_dtype(DType::F32)?, D::Minus1)
}
