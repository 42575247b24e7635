//! Rotary position embedding tables.

use candle_core::{DType, Device, Result, Tensor};

use super::config::{ModelConfig, RopeScaling};

/// `cos` and `sin` of every position's rotation angles, `(positions, head_dim / 2)`.
#[derive(Clone, Debug)]
pub(crate) struct RopeTables {
    cos: Tensor,
    sin: Tensor,
}

impl RopeTables {
    /// Tables for positions `0..positions`.
    pub(crate) fn new(config: &ModelConfig, positions: usize, device: &Device, dtype: DType) -> Result<Self> {
        let inverse_frequencies = inverse_frequencies(config);
        let half = inverse_frequencies.len();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for position in 0..positions {
            for frequency in &inverse_frequencies {
                let angle = position as f64 * frequency;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let table = |values| Tensor::from_vec(values, (positions, half), device)?.to_dtype(dtype);
        Ok(Self { cos: table(cos)?, sin: table(sin)? })
    }

    /// The tables of positions `0..len`, for a forward pass over whole sequences.
    pub(crate) fn prefix(&self, len: usize) -> Result<(Tensor, Tensor)> {
        Ok((self.cos.narrow(0, 0, len)?, self.sin.narrow(0, 0, len)?))
    }

    /// One position per row, `(rows, 1, head_dim / 2)`, for a decode step.
    pub(crate) fn at(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((self.cos.index_select(positions, 0)?.unsqueeze(1)?, self.sin.index_select(positions, 0)?.unsqueeze(1)?))
    }
}

fn inverse_frequencies(config: &ModelConfig) -> Vec<f64> {
    let dim = config.head_dim as f64;
    let base = (0..config.head_dim / 2).map(|i| 1.0 / config.rope_theta.powf(2.0 * i as f64 / dim));
    match config.rope_scaling {
        RopeScaling::None => base.collect(),
        RopeScaling::Linear { factor } => base.map(|frequency| frequency / factor).collect(),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            let low_frequency_wavelength = original_max_position_embeddings / low_freq_factor;
            let high_frequency_wavelength = original_max_position_embeddings / high_freq_factor;
            base.map(|frequency| {
                let wavelength = 2.0 * std::f64::consts::PI / frequency;
                if wavelength < high_frequency_wavelength {
                    frequency
                } else if wavelength > low_frequency_wavelength {
                    frequency / factor
                } else {
                    let smooth = (original_max_position_embeddings / wavelength - low_freq_factor)
                        / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * frequency / factor + smooth * frequency
                }
            })
            .collect()
        }
    }
}
