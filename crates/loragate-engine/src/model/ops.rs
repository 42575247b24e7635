//! candle's fused kernels (RMSNorm, softmax, RoPE) have no backward pass. Inference uses them; when the input is
//! tracked by autograd (the demo trainer differentiates through the frozen model into its LoRA), the same math is
//! composed from differentiable ops instead.

use candle_core::{D, Result, Tensor};

pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    if x.track_op() {
        candle_nn::ops::rms_norm_slow(x, weight, eps as f32)
    } else {
        candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps as f32)
    }
}

pub(crate) fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if x.track_op() { candle_nn::ops::softmax(x, D::Minus1) } else { candle_nn::ops::softmax_last_dim(x) }
}

/// Rotates `x` `(batch, heads, len, head_dim)` (Hugging Face's non-interleaved "rotate half" layout). `cos`/`sin`
/// are `(len, head_dim / 2)` for one shared set of positions, or `(batch, len, head_dim / 2)` per row.
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if x.track_op() {
        candle_nn::rotary_emb::rope_slow(x, cos, sin)
    } else {
        candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin)
    }
}
