//! candle's fused kernels (RMSNorm, softmax, RoPE) have no backward pass. Inference uses them; when the input is
//! tracked by autograd (the demo trainer differentiates through the frozen model into its LoRA), the same math is
//! composed from differentiable ops instead. Plus our own fused causal softmax for prefill chunks on the CPU.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, D, DType, Device, InplaceOp1, InplaceOp2, Layout, Result, Tensor};
use rayon::prelude::*;

mod chunk_attention;
mod paged_attention;
mod vector;

pub(crate) use chunk_attention::causal_chunk_attention;
pub(crate) use paged_attention::{SequenceView, paged_decode_attention, paged_decode_attention_with};

pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    if x.track_op() {
        candle_nn::ops::rms_norm_slow(x, weight, eps as f32)
    } else {
        candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps as f32)
    }
}

/// `log_softmax` of each `vocab`-long row of `values`, in place, rows in parallel: `(x − max) − ln Σ exp(x − max)`,
/// in that order (adding `max` and the logarithm first would round the logprobs near 0 at the logits' magnitude),
/// the sum accumulated in f64.
pub(crate) fn log_softmax_rows_in_place(values: &mut [f32], vocab: usize) {
    values.par_chunks_mut(vocab.max(1)).for_each(vector::log_softmax_in_place);
}

pub(crate) fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if x.track_op() { candle_nn::ops::softmax(x, D::Minus1) } else { candle_nn::ops::softmax_last_dim(x) }
}

/// SwiGLU's `silu(gate) · up`. On the CPU, for f32 values outside autograd, one pass in place over `gate` (a fresh
/// product nobody else holds), rows in parallel; elsewhere candle's two ops.
pub(crate) fn swiglu(gate: Tensor, up: &Tensor) -> Result<Tensor> {
    let fused = gate.device().is_cpu() && !gate.track_op() && !up.track_op() && gate.dims() == up.dims();
    if fused && gate.dtype() == DType::F32 && up.dtype() == DType::F32 && gate.is_contiguous() && up.is_contiguous() {
        gate.inplace_op2(up, &SwiGlu)?;
        return Ok(gate);
    }
    gate.silu()? * up
}

/// [`swiglu`] on the CPU.
struct SwiGlu;

/// Values per parallel task of [`SwiGlu`]: a few rows of an MLP's activations, so that a decode step's handful of
/// rows stays on one thread.
const SWIGLU_TASK: usize = 16 * 1024;

impl InplaceOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(&self, gate: &mut CpuStorage, gate_layout: &Layout, up: &CpuStorage, up_layout: &Layout) -> Result<()> {
        let (CpuStorage::F32(gate), CpuStorage::F32(up)) = (gate, up) else { candle_core::bail!("swiglu of non-f32") };
        let (Some((from, to)), Some((up_from, up_to))) =
            (gate_layout.contiguous_offsets(), up_layout.contiguous_offsets())
        else {
            candle_core::bail!("swiglu of non-contiguous activations")
        };
        gate[from..to]
            .par_chunks_mut(SWIGLU_TASK)
            .zip(up[up_from..up_to].par_chunks(SWIGLU_TASK))
            .for_each(|(gate, up)| vector::silu_mul_in_place(gate, up));
        Ok(())
    }
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

/// The softmax over the last dimension of a prefill chunk's attention scores `(…, len, total)`, for a chunk at
/// positions `total − len..total`: row `i` of each `(len, total)` block keeps the columns up to its own position
/// (`..=total − len + i`) and gets exact zeros after it. On the CPU this is one pass over the scores, in place (the
/// chunk's scores are the largest tensor of a prefill: no mask is added and no copy made); elsewhere, and under
/// autograd, an additive `-inf` mask and candle's softmax. On a GPU the mask is built there
/// ([`causal_mask_on_device`]): a table written on the host would be copied over for every layer of every chunk.
pub(crate) fn causal_softmax(scores: Tensor) -> Result<Tensor> {
    let dims = scores.dims();
    let (len, total) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    if scores.device().is_cpu() && scores.dtype() == DType::F32 && !scores.track_op() && scores.is_contiguous() {
        scores.inplace_op1(&CausalSoftmax { len, start: total - len })?;
        return Ok(scores);
    }
    let mask = if scores.device().is_cpu() {
        causal_mask(total - len, len, scores.device())?.to_dtype(scores.dtype())?
    } else {
        causal_mask_on_device(total - len, len, scores.device(), scores.dtype())?
    };
    softmax_last_dim(&scores.broadcast_add(&mask)?)
}

/// `(len, start + len)` for positions `start..start + len`: 0 where a position may attend (every earlier position
/// and itself), `-inf` after it.
pub(crate) fn causal_mask(start: usize, len: usize, device: &Device) -> Result<Tensor> {
    let total = start + len;
    let values: Vec<f32> =
        (0..len).flat_map(|i| (0..total).map(move |j| if j <= start + i { 0.0 } else { f32::NEG_INFINITY })).collect();
    Tensor::from_vec(values, (len, total), device)
}

/// [`causal_mask`] in `dtype`, computed on `device` from the two position ranges: only the ranges (`start + len`
/// integers) cross from the host.
pub(crate) fn causal_mask_on_device(start: usize, len: usize, device: &Device, dtype: DType) -> Result<Tensor> {
    let total = start + len;
    let positions = Tensor::arange(start as u32, total as u32, device)?.reshape((len, 1))?;
    let keys = Tensor::arange(0u32, total as u32, device)?.reshape((1, total))?;
    let open = Tensor::zeros((len, total), dtype, device)?;
    let closed = Tensor::full(f32::NEG_INFINITY, (len, total), device)?.to_dtype(dtype)?;
    keys.broadcast_le(&positions)?.where_cond(&open, &closed)
}

/// [`causal_softmax`] on the CPU: each row of `len` consecutive rows is the position after the one before.
struct CausalSoftmax {
    len: usize,
    start: usize,
}

impl InplaceOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let dtype = storage.dtype();
        let CpuStorage::F32(values) = storage else { candle_core::bail!("causal softmax of {dtype:?} scores") };
        let Some((from, to)) = layout.contiguous_offsets() else { candle_core::bail!("non-contiguous scores") };
        let total = self.start + self.len;
        values[from..to].par_chunks_mut(total).enumerate().for_each(|(row, scores)| {
            let (visible, hidden) = scores.split_at_mut(self.start + row % self.len + 1);
            // NaN and infinite scores (an overflowing adapter) make the whole row NaN, as candle's softmax does.
            vector::softmax_in_place(visible);
            hidden.fill(0.0);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fused_causal_softmax_equals_a_masked_softmax() {
        // Deterministic scores in -5..5 (the rows of 9 put one value in each row's vector tail).
        let values: Vec<f32> = (0..270).map(|i| ((i * 37) % 101) as f32 / 10.0 - 5.0).collect();
        let scores = Tensor::from_vec(values, (2, 3, 5, 9), &Device::Cpu).expect("scores");
        let mask = causal_mask(4, 5, &Device::Cpu).expect("mask");
        let expected = softmax_last_dim(&scores.broadcast_add(&mask).expect("masked")).expect("softmax");
        let fused = causal_softmax(scores.copy().expect("copy")).expect("fused");
        let diff = (fused - &expected).and_then(|d| d.abs()).and_then(|d| d.flatten_all()).and_then(|d| d.max(0));
        assert!(diff.and_then(|d| d.to_scalar::<f32>()).expect("diff") < 1e-6);
        let row = fused_row(&scores, 0);
        assert_eq!(&row[5..], &[0.0; 4], "the first position sees the 4 cached ones and itself");
        let nan = scores.copy().expect("copy");
        nan.slice_set(&Tensor::full(f32::NAN, (2, 3, 5, 1), &Device::Cpu).expect("nan"), 3, 0).expect("set");
        let row = fused_row(&nan, 4);
        assert!(row.iter().take(9).all(|value| value.is_nan()), "a NaN score spoils its row: {row:?}");
    }

    #[test]
    fn the_fused_swiglu_equals_candles_silu_times_up() {
        let values = |seed: usize| -> Vec<f32> { (0..3 * 41).map(|i| ((i * seed) % 89) as f32 / 8.0 - 5.5).collect() };
        let gate = Tensor::from_vec(values(37), (3, 41), &Device::Cpu).expect("gate");
        let up = Tensor::from_vec(values(53), (3, 41), &Device::Cpu).expect("up");
        let expected = (gate.silu().expect("silu") * &up).expect("product");
        let fused = swiglu(gate.copy().expect("copy"), &up).expect("fused");
        let diff = (fused - &expected).and_then(|d| d.abs()).and_then(|d| d.flatten_all()).and_then(|d| d.max(0));
        assert!(diff.and_then(|d| d.to_scalar::<f32>()).expect("diff") < 1e-5);
        let strided = swiglu(gate.t().expect("transposed"), &up.t().expect("transposed")).expect("candle's ops");
        let diff = (strided.t().expect("back") - &expected).and_then(|d| d.abs()).and_then(|d| d.flatten_all());
        assert!(diff.and_then(|d| d.max(0)).and_then(|d| d.to_scalar::<f32>()).expect("diff") < 1e-5);
    }

    #[test]
    fn the_mask_built_on_the_device_equals_the_host_table() {
        for (start, len) in [(0, 1), (0, 6), (4, 5), (17, 3)] {
            let host = causal_mask(start, len, &Device::Cpu).and_then(|m| m.to_vec2::<f32>()).expect("host");
            let device = causal_mask_on_device(start, len, &Device::Cpu, DType::F32)
                .and_then(|m| m.to_vec2::<f32>())
                .expect("device");
            assert_eq!(host, device, "start {start}, len {len}");
        }
    }

    #[test]
    fn the_fused_log_softmax_equals_candles_and_spoils_non_finite_rows() {
        // Deterministic logits in -5..4.6, and one far above the rest in row 0: its logprob is a hair below 0
        // (about -2e-5), where the order of the arithmetic shows. Random logits made the hair vanish below f64's
        // resolution whenever no other logit came near the peak.
        let mut values: Vec<f32> = (0..3000).map(|i| ((i * 37) % 97) as f32 / 10.0 - 5.0).collect();
        values[0] = 20.0;
        let logits = Tensor::from_vec(values.clone(), (3, 1000), &Device::Cpu).expect("logits");
        let expected = candle_nn::ops::log_softmax(&logits, D::Minus1).expect("log_softmax");
        let mut fused = values.clone();
        log_softmax_rows_in_place(&mut fused, 1000);
        let expected = expected.flatten_all().and_then(|e| e.to_vec1::<f32>()).expect("expected");
        let diff = fused.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-4, "differs by {diff}");
        let rest: f64 = values[1..1000].iter().map(|&x| (f64::from(x) - 20.0).exp()).sum();
        let peak = -rest.ln_1p();
        assert!(peak < -1e-5, "the test's peak is a hair below 0, not at 0: {peak}");
        assert!(fused[0] < 0.0, "the peak's logprob stays below 0: {}", fused[0]);
        assert!((f64::from(fused[0]) - peak).abs() < 1e-3 * peak.abs(), "{} is {peak}", fused[0]);
        for spoiler in [f32::NAN, f32::INFINITY] {
            let mut values = vec![0.5f32, -1.0, spoiler, 2.0, 1.0, 0.0];
            log_softmax_rows_in_place(&mut values, 3);
            assert!(values[..3].iter().all(|value| value.is_nan()), "{spoiler} spoils its row: {values:?}");
            assert!(values[3..].iter().all(|value| value.is_finite()), "only its row: {values:?}");
        }
    }

    fn fused_row(scores: &Tensor, row: usize) -> Vec<f32> {
        let fused = causal_softmax(scores.copy().expect("copy")).expect("fused");
        fused.flatten_all().and_then(|f| f.narrow(0, row * 9, 9)).and_then(|f| f.to_vec1()).expect("row")
    }
}
