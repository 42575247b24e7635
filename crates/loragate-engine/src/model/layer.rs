//! One decoder layer: RMSNorm → grouped-query attention → residual, RMSNorm → SwiGLU MLP → residual. Every
//! projection takes the batch's LoRA.

use candle_core::{Result, Tensor};

use super::kv_cache::{BatchKvCache, LayerKv};
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
    /// Whole sequences from position 0, with a causal mask `(len, len)`; the layer's keys and values are returned.
    Sequences { cos: &'a Tensor, sin: &'a Tensor, causal_mask: &'a Tensor },
    /// One new position per row on top of the batch cache; `cos`/`sin` are per row `(rows, 1, head_dim / 2)`.
    Step { cos: &'a Tensor, sin: &'a Tensor, cache: &'a BatchKvCache, mask: &'a Tensor },
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
    /// `x` is `(rows, len, hidden)`. Returns the output and, for [`AttentionInput::Sequences`], this layer's keys and
    /// values.
    fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        lora: &LoraBatch,
        input: AttentionInput<'_>,
    ) -> Result<(Tensor, Option<LayerKv>)> {
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
        let (output, kv) = match input {
            AttentionInput::Sequences { cos, sin, causal_mask } => {
                let (q, k) = (ops::rope(&q, cos, sin)?, ops::rope(&k, cos, sin)?);
                let output = self.attend(&q, &k, &v, causal_mask)?;
                (output, Some(LayerKv { keys: k, values: v }))
            }
            AttentionInput::Step { cos, sin, cache, mask } => {
                let (q, k) = (ops::rope(&q, cos, sin)?, ops::rope(&k, cos, sin)?);
                let (keys, values) = cache.append(layer, &k, &v)?;
                (self.attend(&q, &keys, &values, mask)?, None)
            }
        };
        let output = output.reshape((rows * len, self.num_heads * self.head_dim))?;
        let output = self.o.forward(&output, rows, layer, lora)?.reshape((rows, len, hidden))?;
        Ok((output, kv))
    }

    /// Scaled dot-product attention of `q` `(rows, heads, len, d)` over `k`/`v` `(rows, kv_heads, total, d)`.
    /// Grouped-query attention without copying keys: the query heads sharing a key/value head are folded into the
    /// length axis, `(rows, kv_heads, group·len, d)`. `mask` broadcasts to `(rows, kv_heads, group, len, total)`.
    /// Returns `(rows, len, heads, d)`, contiguous.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (rows, _, len, head_dim) = q.dims4()?;
        let total = k.dim(2)?;
        let group = self.num_heads / self.num_kv_heads;
        let q = (q * (1.0 / (head_dim as f64).sqrt()))?.reshape((rows, self.num_kv_heads, group * len, head_dim))?;
        let scores = q.matmul(&k.t()?)?.reshape((rows, self.num_kv_heads, group, len, total))?;
        let weights = ops::softmax_last_dim(&scores.broadcast_add(mask)?)?;
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
        let gate = self.gate.forward(x, rows, layer, lora)?.silu()?;
        let up = self.up.forward(x, rows, layer, lora)?;
        self.down.forward(&(gate * up)?, rows, layer, lora)
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
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        lora: &LoraBatch,
        input: AttentionInput<'_>,
    ) -> Result<(Tensor, Option<LayerKv>)> {
        let (rows, len, hidden) = x.dims3()?;
        let normed = ops::rms_norm(x, &self.input_norm, self.rms_norm_eps)?;
        let (attention, kv) = self.attention.forward(&normed, self.index, lora, input)?;
        let x = (x + attention)?;
        let normed = ops::rms_norm(&x, &self.post_attention_norm, self.rms_norm_eps)?.reshape((rows * len, hidden))?;
        let mlp = self.mlp.forward(&normed, rows, self.index, lora)?.reshape((rows, len, hidden))?;
        Ok(((x + mlp)?, kv))
    }
}
