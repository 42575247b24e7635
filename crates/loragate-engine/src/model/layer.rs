//! One decoder layer: RMSNorm → grouped-query attention → residual, RMSNorm → SwiGLU MLP → residual. Every
//! projection takes the batch's LoRA.

use candle_core::{Result, Tensor};

use super::kv_cache::{BatchKvCache, SequenceKv};
use super::linear::Linear;
use super::ops;
use crate::lora::{LoraBatch, LoraTarget};

/// A linear projection `y = x·Wᵀ (+ b)` plus the batch's LoRA term for it. `W` is dense or quantized ([`Linear`]);
/// the LoRA term is dense either way, so per-row LoRA is exact on a quantized model too.
#[derive(Debug)]
pub(crate) struct Projection {
    /// `W` and how `x·Wᵀ` is computed.
    pub(crate) weight: Linear,
    /// Qwen2's q/k/v projections have biases; LLaMA's have none.
    pub(crate) bias: Option<Tensor>,
    pub(crate) target: LoraTarget,
}

impl Projection {
    /// `x` is `(rows·len, in)` for `rows` rows; returns `(rows·len, out)`.
    fn forward(&self, x: &Tensor, rows: usize, layer: usize, lora: &LoraBatch) -> Result<Tensor> {
        let mut y = self.weight.forward(x)?;
        if let Some(bias) = &self.bias {
            y = y.broadcast_add(bias)?;
        }
        match lora.delta(layer, self.target, x, rows)? {
            Some(delta) => y + delta,
            None => Ok(y),
        }
    }
}

/// What attention attends over.
pub(crate) enum AttentionInput<'a> {
    /// Whole sequences from position 0, with a causal mask `(len, len)`; nothing is cached.
    Sequences { cos: &'a Tensor, sin: &'a Tensor, causal_mask: &'a Tensor },
    /// Packed tokens of several sequences, one per row (`len` 1), each with its own position: `cos`/`sin` are per
    /// token, `(tokens, 1, head_dim / 2)`. The first rows are the decode batch's (one new position per row on top of
    /// the batch cache), then each prefill chunk's tokens in order (its next positions on top of its own cache).
    Packed { cos: &'a Tensor, sin: &'a Tensor, decode: Option<DecodeAttention<'a>>, chunks: &'a [ChunkAttention<'a>] },
}

/// The decode rows of a packed pass: one token per row of the batch cache.
#[derive(Clone, Copy)]
pub(crate) struct DecodeAttention<'a> {
    pub(crate) cache: &'a BatchKvCache,
    /// `(rows, 1, 1, 1, cached + 1)`: each row's padding hidden.
    pub(crate) mask: &'a Tensor,
}

/// One prefill chunk of a packed pass: `len` consecutive positions of one sequence, attending causally to
/// themselves and to every position its cache already holds.
pub(crate) struct ChunkAttention<'a> {
    pub(crate) cache: &'a SequenceKv,
    pub(crate) len: usize,
}

/// Which key positions each query position of [`Attention::attend`] may see.
#[derive(Clone, Copy)]
enum Visible<'a> {
    /// An additive mask (0 or `-inf`) broadcast to the scores `(rows, kv_heads, group, len, total)`.
    Masked(&'a Tensor),
    /// The `len` queries are the last `len` of the `total` positions, each seeing those up to itself.
    Causal,
}

#[derive(Debug)]
pub(crate) struct Attention {
    pub(crate) q: Projection,
    pub(crate) k: Projection,
    pub(crate) v: Projection,
    pub(crate) o: Projection,
    pub(crate) num_heads: usize,
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
}

impl Attention {
    /// `x` is `(rows, len, hidden)`.
    fn forward(&self, x: &Tensor, layer: usize, lora: &LoraBatch, input: AttentionInput<'_>) -> Result<Tensor> {
        let (rows, len, hidden) = x.dims3()?;
        let x = x.reshape((rows * len, hidden))?;
        let heads = |projection: &Projection, count: usize| -> Result<Tensor> {
            projection
                .forward(&x, rows, layer, lora)?
                .reshape((rows, len, count, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = heads(&self.q, self.num_heads)?;
        let k = heads(&self.k, self.num_kv_heads)?;
        let v = heads(&self.v, self.num_kv_heads)?;
        let output = match input {
            AttentionInput::Sequences { cos, sin, causal_mask } => {
                let (q, k) = (ops::rope(&q, cos, sin)?, ops::rope(&k, cos, sin)?);
                self.attend(&q, &k, &v, Visible::Masked(causal_mask))?
            }
            AttentionInput::Packed { cos, sin, decode, chunks } => {
                let (q, k) = (ops::rope(&q, cos, sin)?, ops::rope(&k, cos, sin)?);
                self.attend_packed(layer, &q, &k, &v, decode, chunks)?
            }
        };
        let output = output.reshape((rows * len, self.num_heads * self.head_dim))?;
        self.o.forward(&output, rows, layer, lora)?.reshape((rows, len, hidden))
    }

    /// Attention of packed tokens `(tokens, heads, 1, d)`: the decode rows over the batch cache in one batched call,
    /// then each chunk over its own sequence's cache. Returns `(tokens, 1, heads, d)`.
    fn attend_packed(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        decode: Option<DecodeAttention<'_>>,
        chunks: &[ChunkAttention<'_>],
    ) -> Result<Tensor> {
        let mut outputs = Vec::with_capacity(chunks.len() + 1);
        let mut offset = 0;
        if let Some(DecodeAttention { cache, mask }) = decode {
            let rows = cache.rows();
            let (keys, values) = cache.append(layer, &k.narrow(0, 0, rows)?, &v.narrow(0, 0, rows)?)?;
            outputs.push(self.attend(&q.narrow(0, 0, rows)?, &keys, &values, Visible::Masked(mask))?);
            offset = rows;
        }
        // A chunk's tokens are rows of the packed tensors; attention wants them as one sequence, `(1, heads, len, d)`.
        let sequence = |x: &Tensor, offset: usize, len: usize| -> Result<Tensor> {
            let (_, heads, _, head_dim) = x.dims4()?;
            x.narrow(0, offset, len)?.reshape((1, len, heads, head_dim))?.transpose(1, 2)?.contiguous()
        };
        for chunk in chunks {
            let (k, v) = (sequence(k, offset, chunk.len)?, sequence(v, offset, chunk.len)?);
            let (keys, values) = chunk.cache.append(layer, &k, &v)?;
            let output =
                match ops::causal_chunk_attention(q, offset, chunk.len, &keys, &values)? {
                    Some(output) => output,
                    None => self
                        .attend(&sequence(q, offset, chunk.len)?, &keys, &values, Visible::Causal)?
                        .reshape((chunk.len, 1, self.num_heads, self.head_dim))?,
                };
            outputs.push(output);
            offset += chunk.len;
        }
        if outputs.len() == 1 { Ok(outputs.remove(0)) } else { Tensor::cat(&outputs, 0) }
    }

    /// Scaled dot-product attention of `q` `(rows, heads, len, d)` over `k`/`v` `(rows, kv_heads, total, d)`.
    /// Grouped-query attention without copying keys: the query heads sharing a key/value head are folded into the
    /// length axis, `(rows, kv_heads, group·len, d)`. Returns `(rows, len, heads, d)`, contiguous.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, visible: Visible<'_>) -> Result<Tensor> {
        let (rows, _, len, head_dim) = q.dims4()?;
        let total = k.dim(2)?;
        let group = self.num_heads / self.num_kv_heads;
        let q = (q * (1.0 / (head_dim as f64).sqrt()))?.reshape((rows, self.num_kv_heads, group * len, head_dim))?;
        let scores = q.matmul(&k.t()?)?.reshape((rows, self.num_kv_heads, group, len, total))?;
        let weights = match visible {
            Visible::Masked(mask) => ops::softmax_last_dim(&scores.broadcast_add(mask)?)?,
            Visible::Causal => ops::causal_softmax(scores)?,
        };
        let output = weights.reshape((rows, self.num_kv_heads, group * len, total))?.matmul(v)?;
        output.reshape((rows, self.num_heads, len, head_dim))?.transpose(1, 2)?.contiguous()
    }
}

#[derive(Debug)]
pub(crate) struct Mlp {
    pub(crate) gate: Projection,
    pub(crate) up: Projection,
    pub(crate) down: Projection,
}

impl Mlp {
    /// `x` is `(rows·len, hidden)`.
    fn forward(&self, x: &Tensor, rows: usize, layer: usize, lora: &LoraBatch) -> Result<Tensor> {
        let gate = self.gate.forward(x, rows, layer, lora)?;
        let up = self.up.forward(x, rows, layer, lora)?;
        self.down.forward(&ops::swiglu(gate, &up)?, rows, layer, lora)
    }
}

#[derive(Debug)]
pub(crate) struct DecoderLayer {
    pub(crate) index: usize,
    pub(crate) input_norm: Tensor,
    pub(crate) attention: Attention,
    pub(crate) post_attention_norm: Tensor,
    pub(crate) mlp: Mlp,
    pub(crate) rms_norm_eps: f64,
}

impl DecoderLayer {
    /// `x` is `(rows, len, hidden)`.
    pub(crate) fn forward(&self, x: &Tensor, lora: &LoraBatch, input: AttentionInput<'_>) -> Result<Tensor> {
        let (rows, len, hidden) = x.dims3()?;
        let normed = ops::rms_norm(x, &self.input_norm, self.rms_norm_eps)?;
        let attention = self.attention.forward(&normed, self.index, lora, input)?;
        let x = (x + attention)?;
        let normed = ops::rms_norm(&x, &self.post_attention_norm, self.rms_norm_eps)?.reshape((rows * len, hidden))?;
        let mlp = self.mlp.forward(&normed, rows, self.index, lora)?.reshape((rows, len, hidden))?;
        x + mlp
    }
}
