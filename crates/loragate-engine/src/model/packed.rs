//! One scheduler step in one forward pass (the chunked prefill of vLLM V1 and TGI, packed): every decode row and the
//! prefill chunks of other sequences, each token with its own position, LoRA row and causal span. The projections
//! and the MLP run over the packed `(tokens, hidden)` matrix at once, whatever mix of decode rows, chunks and
//! adapters it holds; attention is split per sequence, each over its own blocks of the paged cache: the decode rows
//! in one call, each chunk over its sequence's earlier positions and then its own, causally.

use candle_core::{Result, Tensor};

use super::kv_cache::{KvCache, SequenceBlocks};
use super::layer::{AttentionInput, Gathered, PassKv};
use super::ops::SequenceView;
use super::{Llama, ops};
use crate::lora::LoraBatch;

/// The tokens of one pass.
pub(crate) struct PackedInput<'a> {
    /// The decode rows, in order: each row's next token, at its sequence's next position.
    pub(crate) decode: Vec<DecodeRow<'a>>,
    /// Prefill chunks, in order.
    pub(crate) chunks: Vec<PrefillChunk<'a>>,
}

/// One decode row: the token it feeds, and its sequence's blocks (room for the token reserved).
pub(crate) struct DecodeRow<'a> {
    pub(crate) token: u32,
    pub(crate) blocks: &'a mut SequenceBlocks,
}

/// The next positions of one sequence's prompt.
pub(crate) struct PrefillChunk<'a> {
    /// The tokens, at positions `blocks.len()..blocks.len() + tokens.len()` (room for them reserved).
    pub(crate) tokens: &'a [u32],
    /// The sequence's blocks: what the chunk attends to besides itself, and where its keys and values go.
    pub(crate) blocks: &'a mut SequenceBlocks,
}

impl Llama {
    /// Runs `input` in one pass over `cache`: the decode rows' tokens first, then each chunk's, in order (`lora` has
    /// one row per token, in that order). Every sequence must have room reserved for its new positions
    /// ([`KvCache::reserve`]). Returns the final hidden states `(tokens, hidden)`, after the last norm; each
    /// sequence then holds its new positions.
    pub(crate) fn forward_packed(&self, input: PackedInput<'_>, lora: &LoraBatch, cache: &KvCache) -> Result<Tensor> {
        let PackedInput { mut decode, mut chunks } = input;
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let mut slots = Vec::new();
        let sequences =
            decode.iter().map(|row| (&*row.blocks, 1)).chain(chunks.iter().map(|c| (&*c.blocks, c.tokens.len())));
        for (blocks, count) in sequences {
            let (start, end) = (blocks.len(), blocks.len() + count);
            if end > self.context_length {
                candle_core::bail!("{end} positions exceed the context length {}", self.context_length);
            }
            if end > blocks.capacity() || !blocks.pool().same(cache.pool()) {
                candle_core::bail!("no room reserved in this cache for positions {start}..{end}");
            }
            positions.extend(start as u32..end as u32);
            slots.extend(blocks.next_slots(count));
        }
        tokens.extend(decode.iter().map(|row| row.token));
        for chunk in &chunks {
            tokens.extend_from_slice(chunk.tokens);
        }
        if tokens.is_empty() {
            candle_core::bail!("a forward pass needs at least one token");
        }
        let count = tokens.len();
        let (cos, sin) = self.rope.at(&Tensor::from_vec(positions, count, &self.device)?)?;
        let mut x = self.embed(&Tensor::from_vec(tokens, (count, 1), &self.device)?)?;
        {
            let slots = cache.slots(slots)?;
            let decode_views: Vec<SequenceView<'_>> = decode
                .iter()
                .map(|row| SequenceView { blocks: row.blocks.blocks(), len: row.blocks.len() + 1 })
                .collect();
            let chunk_views: Vec<(SequenceView<'_>, usize)> = chunks
                .iter()
                .map(|chunk| {
                    let len = chunk.tokens.len();
                    (SequenceView { blocks: chunk.blocks.blocks(), len: chunk.blocks.len() + len }, len)
                })
                .collect();
            let gathered = if cache.in_place() {
                None
            } else {
                Some(Gathered::new(&decode_views, &chunk_views, &self.device, self.dtype)?)
            };
            let pass = PassKv {
                cache,
                slots: &slots,
                decode: &decode_views,
                chunks: &chunk_views,
                gathered: gathered.as_ref(),
            };
            for layer in &self.layers {
                x = layer.forward(&x, lora, AttentionInput::Packed { cos: &cos, sin: &sin, pass: &pass })?;
            }
        }
        for row in &mut decode {
            row.blocks.advance(1);
        }
        for chunk in &mut chunks {
            chunk.blocks.advance(chunk.tokens.len());
        }
        ops::rms_norm(&x, &self.norm, self.config.rms_norm_eps)?.squeeze(1)
    }
}
