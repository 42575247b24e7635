//! The key/value cache of a decode batch: one left-padded tensor per layer for all rows.
//!
//! Row `i` holds `lenᵢ` cached positions in the columns `[len − lenᵢ, len)` of a `(rows, kv_heads, capacity,
//! head_dim)` buffer; the columns before are padding, hidden from attention by a `-inf` mask. Every decode step
//! writes one new column for all rows at once (`slice_set`, in place), so rows stay right-aligned and the work per
//! step is the same handful of ops whatever the number of rows. The buffer is rebuilt only when the batch's
//! membership changes: rows leaving are dropped with one `index_select` (and padding shared by every remaining row
//! is trimmed), rows joining are left-padded to the batch length and concatenated. Capacity grows geometrically,
//! up to the context length.

use candle_core::{DType, Device, Result, Tensor};

/// The keys and values of one layer for some rows, `(rows, kv_heads, len, head_dim)` each, RoPE already applied.
#[derive(Clone, Debug)]
pub(crate) struct LayerKv {
    pub(crate) keys: Tensor,
    pub(crate) values: Tensor,
}

/// The cache of a decode batch.
#[derive(Debug)]
pub(crate) struct BatchKvCache {
    /// One `(rows, kv_heads, capacity, head_dim)` key/value buffer per layer; `None` while there are no rows.
    layers: Vec<Option<LayerKv>>,
    /// Columns in use, the same for all rows.
    len: usize,
    capacity: usize,
    max_capacity: usize,
    /// Leading padding columns of each row.
    pads: Vec<usize>,
    /// `(rows, 1, 1, 1, capacity)`: `-inf` on each row's padding, 0 elsewhere.
    mask: Option<Tensor>,
    device: Device,
    dtype: DType,
}

impl BatchKvCache {
    /// An empty cache for `num_layers` layers whose rows never exceed `max_capacity` positions.
    pub(crate) fn new(num_layers: usize, max_capacity: usize, device: &Device, dtype: DType) -> Self {
        Self {
            layers: vec![None; num_layers],
            len: 0,
            capacity: 0,
            max_capacity,
            pads: Vec::new(),
            mask: None,
            device: device.clone(),
            dtype,
        }
    }

    /// The number of rows.
    pub(crate) fn rows(&self) -> usize {
        self.pads.len()
    }

    /// Keeps the rows at `keep` (indices of current rows, in their new order) and drops the others.
    pub(crate) fn retain(&mut self, keep: &[usize]) -> Result<()> {
        if keep.is_empty() {
            *self = Self::new(self.layers.len(), self.max_capacity, &self.device, self.dtype);
            return Ok(());
        }
        let pads: Vec<usize> = keep.iter().map(|&row| self.pads[row]).collect();
        let trim = pads.iter().copied().min().unwrap_or(0);
        let index = Tensor::from_vec(keep.iter().map(|&row| row as u32).collect::<Vec<_>>(), keep.len(), &self.device)?;
        for layer in self.layers.iter_mut().flatten() {
            for buffer in [&mut layer.keys, &mut layer.values] {
                let kept = buffer.index_select(&index, 0)?;
                *buffer = if trim == 0 { kept } else { kept.narrow(2, trim, self.capacity - trim)?.contiguous()? };
            }
        }
        self.len -= trim;
        self.capacity -= trim;
        self.pads = pads.into_iter().map(|pad| pad - trim).collect();
        self.rebuild_mask()
    }

    /// Appends `copies` rows that all hold `prefill` (one sequence's keys and values for every layer, `len` positions
    /// each): the `num_samples` sequences of a request share their prompt's prefill.
    pub(crate) fn push(&mut self, prefill: &[LayerKv], copies: usize) -> Result<()> {
        let Some(first) = prefill.first() else { return Ok(()) };
        let prompt_len = first.keys.dim(2)?;
        let new_len = self.len.max(prompt_len);
        let old_shift = new_len - self.len;
        let new_pad = new_len - prompt_len;
        let capacity = grown_capacity(self.capacity, new_len + 1, self.max_capacity);
        for (slot, layer) in self.layers.iter_mut().zip(prefill) {
            let old = slot.take();
            let mut joined = LayerKv { keys: layer.keys.clone(), values: layer.values.clone() };
            for (buffer, fresh, old) in [
                (&mut joined.keys, &layer.keys, old.as_ref().map(|kv| &kv.keys)),
                (&mut joined.values, &layer.values, old.as_ref().map(|kv| &kv.values)),
            ] {
                let (_, heads, _, head_dim) = fresh.dims4()?;
                let fresh = left_pad(fresh, new_pad)?;
                let fresh = fresh.broadcast_as((copies, heads, new_len, head_dim))?;
                let rows = match old {
                    Some(old) => Tensor::cat(&[&left_pad(&old.narrow(2, 0, self.len)?, old_shift)?, &fresh], 0)?,
                    None => fresh.contiguous()?,
                };
                *buffer = right_pad(&rows, capacity - new_len)?;
            }
            *slot = Some(joined);
        }
        for pad in &mut self.pads {
            *pad += old_shift;
        }
        self.pads.extend(std::iter::repeat_n(new_pad, copies));
        self.len = new_len;
        self.capacity = capacity;
        self.rebuild_mask()
    }

    /// Makes room for one more column (call once per decode step, before the layers append).
    pub(crate) fn reserve_step(&mut self) -> Result<()> {
        if self.len < self.capacity {
            return Ok(());
        }
        let capacity = grown_capacity(self.capacity, self.len + 1, self.max_capacity);
        if capacity <= self.len {
            candle_core::bail!("the KV cache is full ({} positions)", self.max_capacity);
        }
        for layer in self.layers.iter_mut().flatten() {
            layer.keys = right_pad(&layer.keys, capacity - self.capacity)?;
            layer.values = right_pad(&layer.values, capacity - self.capacity)?;
        }
        self.capacity = capacity;
        self.rebuild_mask()
    }

    /// Writes the step's new keys and values `(rows, kv_heads, 1, head_dim)` of `layer` and returns the layer's
    /// whole cache including them.
    pub(crate) fn append(&self, layer: usize, keys: &Tensor, values: &Tensor) -> Result<(Tensor, Tensor)> {
        let Some(Some(cache)) = self.layers.get(layer) else { candle_core::bail!("no cached rows in layer {layer}") };
        cache.keys.slice_set(&keys.contiguous()?, 2, self.len)?;
        cache.values.slice_set(&values.contiguous()?, 2, self.len)?;
        Ok((cache.keys.narrow(2, 0, self.len + 1)?, cache.values.narrow(2, 0, self.len + 1)?))
    }

    /// The attention mask of this step, `(rows, 1, 1, 1, len + 1)`.
    pub(crate) fn step_mask(&self) -> Result<Tensor> {
        let Some(mask) = &self.mask else { candle_core::bail!("the KV cache has no rows") };
        mask.narrow(4, 0, self.len + 1)
    }

    /// Records the column written by this step's [`BatchKvCache::append`]s.
    pub(crate) fn advance(&mut self) {
        self.len += 1;
    }

    fn rebuild_mask(&mut self) -> Result<()> {
        let rows = self.pads.len();
        let mut values = vec![0f32; rows * self.capacity];
        for (row, &pad) in self.pads.iter().enumerate() {
            values[row * self.capacity..row * self.capacity + pad].fill(f32::NEG_INFINITY);
        }
        let mask = Tensor::from_vec(values, (rows, 1, 1, 1, self.capacity), &self.device)?.to_dtype(self.dtype)?;
        self.mask = Some(mask);
        Ok(())
    }
}

/// At least `needed`, at least double the current capacity, at most `max`, in multiples of 64.
fn grown_capacity(current: usize, needed: usize, max: usize) -> usize {
    if needed <= current {
        return current;
    }
    needed.max(current * 2).next_multiple_of(64).min(max).max(needed.min(max))
}

fn left_pad(x: &Tensor, columns: usize) -> Result<Tensor> {
    if columns == 0 {
        return Ok(x.clone());
    }
    let (rows, heads, _, head_dim) = x.dims4()?;
    Tensor::cat(&[&Tensor::zeros((rows, heads, columns, head_dim), x.dtype(), x.device())?, x], 2)
}

fn right_pad(x: &Tensor, columns: usize) -> Result<Tensor> {
    let (rows, heads, _, head_dim) = x.dims4()?;
    if columns == 0 {
        return x.contiguous();
    }
    Tensor::cat(&[x, &Tensor::zeros((rows, heads, columns, head_dim), x.dtype(), x.device())?], 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(len: usize, value: f32) -> Vec<LayerKv> {
        let keys = Tensor::full(value, (1, 1, len, 2), &Device::Cpu).expect("keys");
        vec![LayerKv { keys: keys.clone(), values: keys }]
    }

    fn column_values(cache: &BatchKvCache, row: usize) -> Vec<f32> {
        let keys = &cache.layers[0].as_ref().expect("layer").keys;
        let row = keys.narrow(0, row, 1).and_then(|r| r.narrow(2, 0, cache.len)).expect("row");
        row.flatten_all().and_then(|r| r.to_vec1::<f32>()).expect("values").into_iter().step_by(2).collect()
    }

    #[test]
    fn rows_are_left_padded_and_padding_is_trimmed_when_the_longest_leaves() {
        let mut cache = BatchKvCache::new(1, 4096, &Device::Cpu, DType::F32);
        cache.push(&kv(2, 1.0), 1).expect("push");
        cache.push(&kv(4, 2.0), 2).expect("push");
        assert_eq!((cache.rows(), cache.len), (3, 4));
        assert_eq!(column_values(&cache, 0), vec![0.0, 0.0, 1.0, 1.0]);
        assert_eq!(column_values(&cache, 2), vec![2.0; 4]);
        assert_eq!(cache.pads, vec![2, 0, 0]);

        cache.reserve_step().expect("reserve");
        let new = Tensor::full(3f32, (3, 1, 1, 2), &Device::Cpu).expect("new");
        let (keys, _) = cache.append(0, &new, &new).expect("append");
        assert_eq!(keys.dim(2).expect("len"), 5);
        let mask = cache.step_mask().and_then(|m| m.flatten_all()).and_then(|m| m.to_vec1::<f32>()).expect("mask");
        assert_eq!(&mask[..5], &[f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0, 0.0, 0.0]);
        cache.advance();

        cache.retain(&[0]).expect("retain");
        assert_eq!((cache.rows(), cache.len), (1, 3));
        assert_eq!(column_values(&cache, 0), vec![1.0, 1.0, 3.0]);
        cache.retain(&[]).expect("retain none");
        assert_eq!(cache.rows(), 0);
    }

    #[test]
    fn capacity_grows_geometrically_within_the_context() {
        assert_eq!(grown_capacity(0, 5, 4096), 64);
        assert_eq!(grown_capacity(64, 65, 4096), 128);
        assert_eq!(grown_capacity(64, 64, 4096), 64);
        assert_eq!(grown_capacity(4000, 4001, 4096), 4096);
        assert_eq!(grown_capacity(4096, 4097, 4096), 4096);
    }
}
