//! One scheduler step in one forward pass (the chunked prefill of vLLM V1 and TGI, packed): every decode row of the
//! batch and the prefill chunks of several other sequences, each token with its own position, LoRA row and causal
//! span. The projections and the MLP run over the packed `(tokens, hidden)` matrix at once, whatever mix of decode
//! rows, chunks and adapters it holds; attention is split per sequence: the decode rows in one batched call over
//! the batch cache, each chunk over its own sequence's cache (its earlier positions, then its own causally).

use candle_core::{Result, Tensor};

use super::kv_cache::{BatchKvCache, SequenceKv};
use super::layer::{AttentionInput, ChunkAttention, DecodeAttention};
use super::{Llama, ops};
use crate::lora::LoraBatch;

/// The tokens of one pass.
pub(crate) struct PackedInput<'a> {
    /// The decode batch: the next token of each row of the cache, in row order, each at its row's next position.
    pub(crate) decode: Option<(&'a [u32], &'a mut BatchKvCache)>,
    /// Prefill chunks, in order.
    pub(crate) chunks: Vec<PrefillChunk<'a>>,
}

/// The next positions of one sequence's prompt.
pub(crate) struct PrefillChunk<'a> {
    /// The tokens, at positions `cache.len()..cache.len() + tokens.len()`.
    pub(crate) tokens: &'a [u32],
    /// The sequence's cache: what the chunk attends to besides itself, and where its keys and values go.
    pub(crate) cache: &'a mut SequenceKv,
}

impl Llama {
    /// Runs `input` in one pass: the decode rows' tokens first, then each chunk's, in order (`lora` has one row per
    /// token, in that order). Returns the final hidden states `(tokens, hidden)`, after the last norm; each cache
    /// then holds its new positions.
    pub(crate) fn forward_packed(&self, input: PackedInput<'_>, lora: &LoraBatch) -> Result<Tensor> {
        let PackedInput { mut decode, chunks } = input;
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        if let Some((next, cache)) = &mut decode {
            if next.len() != cache.rows() {
                candle_core::bail!("{} decode tokens for {} cached rows", next.len(), cache.rows());
            }
            cache.reserve_step()?;
            tokens.extend_from_slice(next);
            positions.extend(cache.positions());
        }
        for chunk in &chunks {
            let (start, end) = (chunk.cache.len(), chunk.cache.len() + chunk.tokens.len());
            if end > self.context_length {
                candle_core::bail!("{end} positions exceed the context length {}", self.context_length);
            }
            tokens.extend_from_slice(chunk.tokens);
            positions.extend(start as u32..end as u32);
        }
        if tokens.is_empty() {
            candle_core::bail!("a forward pass needs at least one token");
        }
        let count = tokens.len();
        let (cos, sin) = self.rope.at(&Tensor::from_vec(positions, count, &self.device)?)?;
        let mut x = self.embed(&Tensor::from_vec(tokens, (count, 1), &self.device)?)?;
        let decode_mask = decode.as_ref().map(|(_, cache)| cache.step_mask()).transpose()?;
        let attention_chunks = chunks
            .iter()
            .map(|chunk| ChunkAttention { cache: &*chunk.cache, len: chunk.tokens.len() })
            .collect::<Vec<_>>();
        let decode_attention = match (&decode, &decode_mask) {
            (Some((_, cache)), Some(mask)) => Some(DecodeAttention { cache, mask }),
            _ => None,
        };
        for layer in &self.layers {
            let input =
                AttentionInput::Packed { cos: &cos, sin: &sin, decode: decode_attention, chunks: &attention_chunks };
            x = layer.forward(&x, lora, input)?;
        }
        drop(attention_chunks);
        if let Some((_, cache)) = decode {
            cache.advance();
        }
        for chunk in chunks {
            chunk.cache.advance(chunk.tokens.len());
        }
        ops::rms_norm(&x, &self.norm, self.config.rms_norm_eps)?.squeeze(1)
    }
}
