//! A GGUF file's tensors being moved into a [`crate::model::Llama`]: vectors (norms, biases) and the embedding
//! table dequantized to the engine's dtype, weight matrices kept in their block format or dequantized as
//! [`QuantizedWeights`] says.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Shape, Tensor};

use super::tensors::GgufWeights;
use crate::config::QuantizedWeights;
use crate::error::EngineLoadError;
use crate::model::{Linear, WeightSource, check_shape, to_engine, weights_error};

/// The tensors of a GGUF file, taken one by one.
pub(crate) struct GgufSource<'a> {
    weights: GgufWeights,
    device: &'a Device,
    dtype: DType,
    matrices: QuantizedWeights,
    /// The embedding in its block format, kept for a tied LM head.
    embedding: Option<QTensor>,
}

impl<'a> GgufSource<'a> {
    pub(crate) fn new(weights: GgufWeights, device: &'a Device, dtype: DType, matrices: QuantizedWeights) -> Self {
        Self { weights, device, dtype, matrices, embedding: None }
    }

    fn take(&mut self, name: &str, shape: &Shape) -> Result<Option<QTensor>, EngineLoadError> {
        let Some(tensor) = self.weights.remove(name) else { return Ok(None) };
        if tensor.shape() != shape {
            return Err(EngineLoadError::weights(format!(
                "{name} has shape {:?}, expected {:?}",
                tensor.shape().dims(),
                shape.dims()
            )));
        }
        Ok(Some(tensor))
    }

    fn dense(&self, name: &str, tensor: &QTensor) -> Result<Tensor, EngineLoadError> {
        let dense =
            tensor.dequantize(&Device::Cpu).map_err(|err| EngineLoadError::weights(format!("{name}: {err}")))?;
        check_shape(name, &dense, tensor.shape())?;
        to_engine(&dense, self.device, self.dtype)
    }

    fn matrix(&self, name: &str, tensor: QTensor) -> Result<Linear, EngineLoadError> {
        let quantized = !matches!(tensor.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
        let dense_from_rows = match self.matrices {
            QuantizedWeights::Quantized => None,
            QuantizedWeights::Hybrid { dense_from_rows } => Some(dense_from_rows),
            QuantizedWeights::Dequantized => return Linear::dense(&self.dense(name, &tensor)?).map_err(weights_error),
        };
        if !quantized || !self.device.is_cpu() {
            return Linear::dense(&self.dense(name, &tensor)?).map_err(weights_error);
        }
        Linear::quantized(tensor, self.dtype, dense_from_rows).map_err(weights_error)
    }
}

impl WeightSource for GgufSource<'_> {
    fn tensor(&mut self, name: &str, shape: &Shape) -> Result<Option<Tensor>, EngineLoadError> {
        let Some(tensor) = self.take(name, shape)? else { return Ok(None) };
        let dense = self.dense(name, &tensor)?;
        if name == "model.embed_tokens.weight" {
            self.embedding = Some(tensor);
        }
        Ok(Some(dense))
    }

    fn linear(&mut self, name: &str, shape: &Shape) -> Result<Option<Linear>, EngineLoadError> {
        let Some(tensor) = self.take(name, shape)? else { return Ok(None) };
        self.matrix(name, tensor).map(Some)
    }

    fn tied_lm_head(&mut self, embedding: &Tensor) -> Result<Linear, EngineLoadError> {
        match self.embedding.take() {
            Some(tensor) => self.matrix("model.embed_tokens.weight", tensor),
            None => Ok(Linear::Dense { weight_t: embedding.t().map_err(weights_error)? }),
        }
    }
}
