//! Our own LLaMA-family decoder (LLaMA, Qwen2, Mistral): token embedding → N × [RMSNorm, grouped-query attention
//! with RoPE, RMSNorm, SwiGLU MLP] → RMSNorm → LM head. It is ours rather than candle-transformers' so that every
//! projection takes a per-row LoRA ([`LoraBatch`]), and so that one pass runs a scheduler step's packed tokens: the
//! decode rows of many sequences of different lengths and prefill chunks of other sequences, each over its own
//! blocks of the paged [`KvCache`] ([`Llama::forward_packed`]).
//!
//! The model is immutable once loaded (`&self` everywhere); all per-sequence state lives in the cache.

mod config;
pub mod kernel_bench;
mod kv_cache;
mod layer;
mod linear;
mod ops;
mod packed;
mod quantized;
mod rope;
mod scratch;
#[cfg(test)]
mod tests;
mod weights;

use candle_core::{D, DType, Device, Result, Tensor};

use crate::lora::LoraBatch;
use layer::{AttentionInput, DecoderLayer};
use rope::RopeTables;

pub(crate) use config::{ModelConfig, RopeScaling};
pub(crate) use kv_cache::{BLOCK_SIZE, BlockHash, BlockPool, KvCache, ReserveError, SequenceBlocks, kv_cache_error};
pub(crate) use linear::Linear;
pub(crate) use packed::{DecodeRow, PackedInput, PrefillChunk};
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

    /// Whether the layers' weights are multiplied quantized whatever the rows (a GGUF file's weights kept in their
    /// block format, without dense copies): prefill chunks then cost less per token than dense f32 GEMMs on a CPU.
    pub(crate) fn multiplies_quantized_only(&self) -> bool {
        self.layers.first().is_some_and(|layer| layer.attention.q.weight.multiplies_quantized_only())
    }

    /// How the weight matrices are held, most common first: `"Q4_1 kept quantized"` for a GGUF file's Q4_1 matrices
    /// multiplied as such, `"f32"` for dense ones, with each kind's count when they differ.
    pub(crate) fn weights_summary(&self) -> String {
        let mut kinds: Vec<(String, usize)> = Vec::new();
        let projections = self.layers.iter().flat_map(|layer| {
            let (attention, mlp) = (&layer.attention, &layer.mlp);
            [&attention.q, &attention.k, &attention.v, &attention.o, &mlp.gate, &mlp.up, &mlp.down]
                .map(|projection| &projection.weight)
        });
        for linear in projections.chain([&self.lm_head]) {
            let kind = linear.describe();
            match kinds.iter_mut().find(|(known, _)| *known == kind) {
                Some((_, count)) => *count += 1,
                None => kinds.push((kind, 1)),
            }
        }
        kinds.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
        if kinds.len() == 1 {
            return kinds.remove(0).0;
        }
        kinds.iter().map(|(kind, count)| format!("{kind} ({count} matrices)")).collect::<Vec<_>>().join(", ")
    }

    /// The longest sequence (prompt plus generated tokens) this model serves.
    pub(crate) fn context_length(&self) -> usize {
        self.context_length
    }

    /// Runs `tokens` `(rows, len)` (u32), every row from position 0, causally, and returns the final hidden states
    /// (after the last norm), `(rows, len, hidden)`. Differentiable (the demo trainer uses it) and cache-free: the
    /// reference the serving path ([`Llama::forward_packed`]) is tested against.
    pub(crate) fn forward_sequences(&self, tokens: &Tensor, lora: &LoraBatch) -> Result<Tensor> {
        let len = tokens.dims2()?.1;
        if len > self.context_length {
            candle_core::bail!("{len} positions exceed the context length {}", self.context_length);
        }
        let (cos, sin) = self.rope.prefix(len)?;
        let causal_mask = ops::causal_mask(0, len, &self.device)?.to_dtype(self.dtype)?;
        let mut x = self.embed(tokens)?;
        for layer in &self.layers {
            let input = AttentionInput::Sequences { cos: &cos, sin: &sin, causal_mask: &causal_mask };
            x = layer.forward(&x, lora, input)?;
        }
        ops::rms_norm(&x, &self.norm, self.config.rms_norm_eps)
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

    /// The bytes one cached position takes: `2 · layers · kv_heads · head_dim · dtype`.
    pub(crate) fn kv_bytes_per_position(&self) -> usize {
        let config = &self.config;
        KvCache::bytes_per_position(config.num_layers, config.num_kv_heads, config.head_dim, self.dtype)
    }

    /// A paged cache of `blocks` blocks for this model (see [`KvCache::new`]).
    pub(crate) fn kv_cache(&self, blocks: usize, prefix_caching: bool) -> Result<KvCache> {
        let config = &self.config;
        let heads = (config.num_kv_heads, config.head_dim);
        KvCache::new(config.num_layers, heads, blocks, prefix_caching, &self.device, self.dtype)
    }

    fn embed(&self, tokens: &Tensor) -> Result<Tensor> {
        let (rows, len) = tokens.dims2()?;
        self.embed_tokens.index_select(&tokens.flatten_all()?, 0)?.reshape((rows, len, self.config.hidden_size))
    }
}

/// `log_softmax` over the last dimension, in f32.
pub(crate) fn log_softmax(logits: &Tensor) -> Result<Tensor> {
    candle_nn::ops::log_softmax(&logits.to_dtype(DType::F32)?, D::Minus1)
}

/// `log_softmax` of each row of `logits` `(rows, vocab)`, in f32, flattened row after row into host memory: what the
/// samplers read. On the CPU one fused pass per row, rows in parallel (candle's composed op makes five passes over the
/// step's logits, one thread each); elsewhere candle's op on the device, then the copy.
pub(crate) fn log_softmax_rows(logits: &Tensor) -> Result<Vec<f32>> {
    if !logits.device().is_cpu() {
        return log_softmax(logits)?.flatten_all()?.to_vec1::<f32>();
    }
    let vocab = logits.dim(D::Minus1)?;
    let mut values = logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    ops::log_softmax_rows_in_place(&mut values, vocab);
    Ok(values)
}
