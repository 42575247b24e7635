//! One sequence's own key/value cache, outside the decode batch: a prompt being prefilled chunk by chunk.
//!
//! The buffers are allocated once for the whole prompt (`capacity` positions, `(1, kv_heads, capacity, head_dim)`
//! per layer), and each chunk writes its columns in place, so a prompt prefilled over many steps is never copied on
//! the way. When the prefill is done, [`SequenceKv::layers`] hands the filled columns to
//! [`super::BatchKvCache::push`].

use candle_core::{DType, Device, Result, Tensor};

use super::LayerKv;

/// The keys and values of one sequence, `len` positions filled out of `capacity`.
#[derive(Debug)]
pub(crate) struct SequenceKv {
    /// One `(1, kv_heads, capacity, head_dim)` key/value buffer per layer.
    layers: Vec<LayerKv>,
    len: usize,
    capacity: usize,
}

impl SequenceKv {
    /// An empty cache of `capacity` positions for a model of `num_layers` layers of `kv_heads` key/value heads.
    pub(crate) fn new(
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let layers = (0..num_layers)
            .map(|_| {
                let buffer = || Tensor::zeros((1, kv_heads, capacity, head_dim), dtype, device);
                Ok(LayerKv { keys: buffer()?, values: buffer()? })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { layers, len: 0, capacity })
    }

    /// The positions filled.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Writes the keys and values `(1, kv_heads, n, head_dim)` of `n` new positions of `layer` after the filled ones
    /// and returns all `len + n` positions of the layer. Every layer appends the same positions; then
    /// [`SequenceKv::advance`] records them.
    pub(crate) fn append(&self, layer: usize, keys: &Tensor, values: &Tensor) -> Result<(Tensor, Tensor)> {
        let Some(cache) = self.layers.get(layer) else { candle_core::bail!("no layer {layer} in the sequence cache") };
        let new = keys.dim(2)?;
        if self.len + new > self.capacity {
            candle_core::bail!("{} positions exceed the sequence cache's {}", self.len + new, self.capacity);
        }
        cache.keys.slice_set(&keys.contiguous()?, 2, self.len)?;
        cache.values.slice_set(&values.contiguous()?, 2, self.len)?;
        Ok((cache.keys.narrow(2, 0, self.len + new)?, cache.values.narrow(2, 0, self.len + new)?))
    }

    /// Records the `positions` written by this pass's [`SequenceKv::append`]s.
    pub(crate) fn advance(&mut self, positions: usize) {
        self.len += positions;
    }

    /// The filled positions of every layer, `(1, kv_heads, len, head_dim)` each (views, not copies).
    pub(crate) fn layers(&self) -> Result<Vec<LayerKv>> {
        self.layers
            .iter()
            .map(|layer| {
                Ok(LayerKv { keys: layer.keys.narrow(2, 0, self.len)?, values: layer.values.narrow(2, 0, self.len)? })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_fill_the_buffer_in_place_and_overflow_is_an_error() {
        let mut cache = SequenceKv::new(1, 1, 2, 5, &Device::Cpu, DType::F32).expect("cache");
        let chunk = |len: usize, value: f32| Tensor::full(value, (1, 1, len, 2), &Device::Cpu).expect("chunk");
        let (keys, _) = cache.append(0, &chunk(2, 1.0), &chunk(2, 1.0)).expect("first");
        assert_eq!(keys.dim(2).expect("len"), 2);
        cache.advance(2);
        let (keys, values) = cache.append(0, &chunk(3, 2.0), &chunk(3, 5.0)).expect("second");
        let column = |t: &Tensor| t.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("values");
        assert_eq!(column(&keys), vec![1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]);
        assert_eq!(column(&values)[4..], [5.0; 6]);
        cache.advance(3);
        assert_eq!(cache.len(), 5);
        assert!(cache.append(0, &chunk(1, 3.0), &chunk(1, 3.0)).is_err(), "the cache is full");
        assert_eq!(cache.layers().expect("layers")[0].keys.dims(), &[1, 1, 5, 2]);
    }
}
