//! A LoRA factor as a pair stores it: transposed (and, for `B`, scaled) in one pass, and checked for NaN and
//! infinities in place.
//!
//! Reading an adapter used to spend a third of its time in candle's generic strided copy (`t()?.contiguous()`),
//! which walks a multi-dimensional index per element, and another tenth copying every value out to check it. Both
//! factors are f32 matrices on the CPU when an adapter is read, so both run here over the storage's slice: the
//! transpose tile by tile (every tile's rows and columns stay in the L1 cache), the check without a copy. Anything
//! else (another dtype, a device, a strided view, a factor being trained, whose gradient only candle's ops carry)
//! takes candle's path, which gives the same values.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

/// The side of the square tiles the transpose copies: 16 × 16 f32 values read from 16 rows and written to 16, each
/// row a full 64-byte cache line.
const TILE: usize = 16;

/// `matrix` `(rows, cols)` transposed to `(cols, rows)`, contiguous, each value multiplied by `scale`, as
/// `(matrix * scale)?.t()?.contiguous()` computes it (`scale == 1.0` copies the values unchanged).
pub(super) fn scaled_transpose(matrix: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    let (rows, cols) = matrix.dims2()?;
    // A factor being trained (the demo's, a `Var`) keeps candle's ops, which carry its gradient.
    let transposed = (!matrix.track_op())
        .then(|| with_f32_values(matrix, |values| transpose(rows, cols, scale as f32, |at| values[at])))
        .flatten();
    match transposed {
        Some(values) => Tensor::from_vec(values, (cols, rows), &Device::Cpu),
        None if scale == 1.0 => matrix.t()?.contiguous(),
        None => (matrix * scale)?.t()?.contiguous(),
    }
}

/// The `(rows, cols)` matrix of little-endian f32 values `bytes` hold (a safetensors F32 tensor's data), transposed
/// and scaled as [`scaled_transpose`] does, without a tensor of them first.
pub(super) fn scaled_transpose_of_f32_bytes(
    bytes: &[u8],
    rows: usize,
    cols: usize,
    scale: f64,
) -> candle_core::Result<Tensor> {
    if bytes.len() != rows * cols * 4 {
        candle_core::bail!("{} bytes for a ({rows}, {cols}) f32 matrix", bytes.len());
    }
    let value = |at: usize| {
        let mut word = [0u8; 4];
        word.copy_from_slice(&bytes[at * 4..at * 4 + 4]);
        f32::from_le_bytes(word)
    };
    Tensor::from_vec(transpose(rows, cols, scale as f32, value), (cols, rows), &Device::Cpu)
}

/// Whether every value of `tensor` is finite, as it holds them.
pub(super) fn all_finite(tensor: &Tensor) -> candle_core::Result<bool> {
    if let Some(finite) = with_f32_values(tensor, all_finite_values) {
        return Ok(finite);
    }
    let values = tensor.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(all_finite_values(&values))
}

/// Runs `f` over `tensor`'s values in place if it is a contiguous f32 tensor on the CPU.
fn with_f32_values<T>(tensor: &Tensor, f: impl FnOnce(&[f32]) -> T) -> Option<T> {
    let (storage, layout) = tensor.storage_and_layout();
    let (start, end) = layout.contiguous_offsets()?;
    match &*storage {
        Storage::Cpu(CpuStorage::F32(values)) => Some(f(&values[start..end])),
        _ => None,
    }
}

/// A `(rows, cols)` row-major matrix (`value(r · cols + c)` its values) transposed and scaled:
/// `out[c · rows + r] = value(r · cols + c) · scale`.
fn transpose(rows: usize, cols: usize, scale: f32, value: impl Fn(usize) -> f32) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * cols];
    for row_start in (0..rows).step_by(TILE) {
        let row_end = (row_start + TILE).min(rows);
        for col_start in (0..cols).step_by(TILE) {
            let col_end = (col_start + TILE).min(cols);
            for col in col_start..col_end {
                let column = &mut out[col * rows + row_start..col * rows + row_end];
                for (slot, row) in column.iter_mut().zip(row_start..row_end) {
                    *slot = value(row * cols + col) * scale;
                }
            }
        }
    }
    out
}

/// Whether every one of `values` is finite: a branch-free pass per chunk, so the compiler vectorises it.
fn all_finite_values(values: &[f32]) -> bool {
    values.chunks(256).all(|chunk| chunk.iter().fold(true, |finite, value| finite & value.is_finite()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `(rows, cols)` matrix of distinct values, some negative and some zero.
    fn matrix(rows: usize, cols: usize) -> Tensor {
        let values: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 3.0).collect();
        Tensor::from_vec(values, (rows, cols), &Device::Cpu).expect("a matrix")
    }

    /// What the pair computed before: candle's affine, transpose and strided copy.
    fn candle_path(matrix: &Tensor, scale: f64) -> Vec<Vec<f32>> {
        (matrix * scale).and_then(|scaled| scaled.t()).and_then(|t| t.to_vec2()).expect("candle's transpose")
    }

    #[test]
    fn the_transpose_gives_candles_values_for_every_shape_around_the_tiles() {
        for (rows, cols) in [(1, 1), (16, 576), (576, 16), (8, 1536), (1536, 32), (17, 33), (15, 16), (3, 70)] {
            let matrix = matrix(rows, cols);
            for scale in [1.0, 0.5, 2.75] {
                let fast = scaled_transpose(&matrix, scale).expect("the transpose").to_vec2::<f32>().expect("values");
                assert_eq!(fast, candle_path(&matrix, scale), "({rows}, {cols}) scaled by {scale}");
            }
        }
    }

    #[test]
    fn a_factor_is_transposed_straight_from_its_files_bytes_as_from_its_tensor() {
        for (rows, cols) in [(16, 576), (1536, 16), (17, 33)] {
            let matrix = matrix(rows, cols);
            let values = matrix.flatten_all().and_then(|flat| flat.to_vec1::<f32>()).expect("values");
            let bytes: Vec<u8> = values.iter().flat_map(|value| value.to_le_bytes()).collect();
            for scale in [1.0, 0.125] {
                let fast = scaled_transpose_of_f32_bytes(&bytes, rows, cols, scale).expect("the transpose");
                assert_eq!(fast.to_vec2::<f32>().expect("values"), candle_path(&matrix, scale), "({rows}, {cols})");
            }
            let short = scaled_transpose_of_f32_bytes(&bytes[4..], rows, cols, 1.0);
            assert!(short.is_err(), "a byte count that is not the shape's is refused");
        }
    }

    #[test]
    fn a_view_that_is_not_contiguous_takes_candles_path() {
        // The transpose of a contiguous matrix is a strided view: no slice to walk.
        let view = matrix(24, 40).t().expect("a view");
        let transposed = scaled_transpose(&view, 1.5).expect("the transpose");
        assert_eq!(transposed.to_vec2::<f32>().expect("values"), candle_path(&view, 1.5));
        // Another dtype as well.
        let half = matrix(24, 40).to_dtype(DType::F16).expect("f16");
        let transposed = scaled_transpose(&half, 1.0).expect("the transpose");
        assert_eq!(transposed.dtype(), DType::F16);
        assert_eq!(transposed.to_vec2::<half::f16>().expect("values"), half.t().expect("t").to_vec2().expect("values"));
    }

    #[test]
    fn a_factor_being_trained_keeps_its_gradient() {
        // The demo trains its adapters through `LoraPair::new` on `Var`s: the transpose must stay on the graph.
        let factor = candle_core::Var::from_tensor(&matrix(3, 5)).expect("a variable");
        let transposed = scaled_transpose(factor.as_tensor(), 2.5).expect("the transpose");
        let weights = Tensor::arange(0f32, 15.0, &Device::Cpu).and_then(|w| w.reshape((5, 3))).expect("weights");
        let loss = (transposed * &weights).and_then(|weighted| weighted.sum_all()).expect("a loss");
        let gradients = loss.backward().expect("backward");
        let gradient = gradients.get(factor.as_tensor()).expect("a gradient for the factor");
        // d loss / d factor[r][c] = 2.5 · weights[c][r].
        let expected = (weights.t().expect("t") * 2.5).and_then(|g| g.to_vec2::<f32>()).expect("expected");
        assert_eq!(gradient.to_vec2::<f32>().expect("values"), expected);
    }

    #[test]
    fn one_nan_or_infinity_anywhere_is_found_in_every_layout() {
        let clean = matrix(33, 300);
        assert!(all_finite(&clean).expect("checked"));
        assert!(all_finite(&clean.t().expect("a view")).expect("checked"));
        for (position, bad) in [(0, f32::NAN), (5_000, f32::INFINITY), (33 * 300 - 1, f32::NEG_INFINITY)] {
            let mut values = clean.flatten_all().and_then(|flat| flat.to_vec1::<f32>()).expect("values");
            values[position] = bad;
            let tainted = Tensor::from_vec(values, (33, 300), &Device::Cpu).expect("a matrix");
            assert!(!all_finite(&tainted).expect("checked"), "{bad} at {position}");
            assert!(!all_finite(&tainted.t().expect("a view")).expect("checked"), "{bad} at {position}, strided");
            let half = tainted.to_dtype(DType::F16).expect("f16");
            assert!(!all_finite(&half).expect("checked"), "{bad} at {position}, f16");
        }
    }
}
