//! How `x·Wᵀ` is computed for a weight matrix `W` `(out, in)`: dense (a GEMM over `Wᵀ` in the engine's dtype), or
//! quantized (`W` kept in a GGUF block format and multiplied as such, reading a fraction of the bytes — what makes
//! decoding a few rows fast, since it is bound by memory bandwidth), optionally with a dense copy for inputs of many
//! rows (prefill, large batches), where a dense GEMM is faster than quantized dot products.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Result, Tensor};

use super::quantized::QuantizedMatrix;

/// A weight matrix and how it multiplies.
#[derive(Debug)]
pub(crate) enum Linear {
    /// `Wᵀ`, `(in, out)`, contiguous: row-major for the matmul.
    Dense {
        /// `Wᵀ`.
        weight_t: Tensor,
    },
    /// `W` in a GGUF block format.
    Quantized(QuantizedLinear),
}

/// A quantized weight matrix, with an optional dense copy for inputs of many rows.
#[derive(Debug)]
pub(crate) struct QuantizedLinear {
    /// `W` `(out, in)`, quantized; inputs are quantized to 8 bits per block for the dot products, as llama.cpp does.
    weight: Kernel,
    /// `Wᵀ` in the engine's dtype, used for inputs of at least `dense_from_rows` rows.
    dense: Option<DenseCopy>,
    /// The engine's dtype: inputs arrive and outputs leave in it.
    dtype: DType,
    /// The block format `W` is kept in.
    format: GgmlDType,
}

/// Who multiplies a quantized matrix: our kernel for the formats of small models ([`QuantizedMatrix`]), candle's
/// for the others (its k-quant kernels are vectorised).
#[derive(Debug)]
enum Kernel {
    Own(QuantizedMatrix),
    Candle(QMatMul),
}

#[derive(Debug)]
struct DenseCopy {
    weight_t: Tensor,
    from_rows: usize,
}

impl Linear {
    /// A dense matrix from `W` `(out, in)`.
    pub(crate) fn dense(weight: &Tensor) -> Result<Self> {
        Ok(Self::Dense { weight_t: weight.t()?.contiguous()? })
    }

    /// A quantized matrix (on the CPU) for an engine of `dtype`, with a dense copy used for inputs of at least
    /// `dense_from_rows` rows if given.
    pub(crate) fn quantized(weight: QTensor, dtype: DType, dense_from_rows: Option<usize>) -> Result<Self> {
        let format = weight.dtype();
        let dense = match dense_from_rows {
            Some(from_rows) => {
                let weight_t = weight.dequantize(&candle_core::Device::Cpu)?.to_dtype(dtype)?.t()?.contiguous()?;
                Some(DenseCopy { weight_t, from_rows })
            }
            None => None,
        };
        let weight = match QuantizedMatrix::from_qtensor(&weight)? {
            Some(matrix) => Kernel::Own(matrix),
            None => Kernel::Candle(QMatMul::from_qtensor(weight)?),
        };
        Ok(Self::Quantized(QuantizedLinear { weight, dense, dtype, format }))
    }

    /// Whether every input, however many rows, is multiplied by the quantized kernels (no dense copy).
    pub(crate) fn multiplies_quantized_only(&self) -> bool {
        matches!(self, Self::Quantized(QuantizedLinear { dense: None, .. }))
    }

    /// How the matrix is held: its dtype (`f32`), or its block format kept quantized (`Q4_1 kept quantized`), with
    /// its dense copies if it has them.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Dense { weight_t } => weight_t.dtype().as_str().to_owned(),
            Self::Quantized(QuantizedLinear { dense: None, format, .. }) => format!("{format:?} kept quantized"),
            Self::Quantized(QuantizedLinear { dense: Some(dense), format, dtype, .. }) => {
                format!("{format:?} kept quantized with dense {} copies from {} rows", dtype.as_str(), dense.from_rows)
            }
        }
    }

    /// `(rows, in) → (rows, out)`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Dense { weight_t } => x.matmul(weight_t),
            Self::Quantized(quantized) => quantized.forward(x),
        }
    }
}

impl Linear {
    /// `x·Wᵢᵀ` for each of `linears` (`(rows, in)` → `(rows, outᵢ)` each), as [`Linear::forward`] gives them. Where
    /// every one multiplies `x` with our quantized kernel ([`QuantizedMatrix::forward_many`]), `x` is quantized once
    /// and the products split over the pool together; otherwise one by one.
    pub(crate) fn forward_many(linears: &[&Self], x: &Tensor) -> Result<Vec<Tensor>> {
        let rows = x.dim(0)?;
        let matrices: Option<Vec<(&QuantizedMatrix, DType)>> = linears
            .iter()
            .map(|linear| match linear {
                Self::Quantized(QuantizedLinear { weight: Kernel::Own(matrix), dense, dtype, .. })
                    if dense.as_ref().is_none_or(|dense| rows < dense.from_rows) =>
                {
                    Some((matrix, *dtype))
                }
                _ => None,
            })
            .collect();
        let Some(matrices) = matrices.filter(|_| !x.track_op() && x.device().is_cpu()) else {
            return linears.iter().map(|linear| linear.forward(x)).collect();
        };
        let input = if x.dtype() == DType::F32 { x.contiguous()? } else { x.to_dtype(DType::F32)? };
        let kernels: Vec<&QuantizedMatrix> = matrices.iter().map(|(matrix, _)| *matrix).collect();
        let products = QuantizedMatrix::forward_many(&kernels, &input)?;
        products
            .into_iter()
            .zip(&matrices)
            .map(|(y, (_, dtype))| if y.dtype() == *dtype { Ok(y) } else { y.to_dtype(*dtype) })
            .collect()
    }
}

impl QuantizedLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(dense) = &self.dense
            && x.dim(0)? >= dense.from_rows
        {
            return x.matmul(&dense.weight_t);
        }
        let input = if x.dtype() == DType::F32 { x.contiguous()? } else { x.to_dtype(DType::F32)? };
        let y = match &self.weight {
            Kernel::Own(matrix) => matrix.forward(&input)?,
            Kernel::Candle(matmul) => matmul.forward(&input)?,
        };
        if y.dtype() == self.dtype { Ok(y) } else { y.to_dtype(self.dtype) }
    }
}
