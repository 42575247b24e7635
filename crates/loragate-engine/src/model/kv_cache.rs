//! Key/value caches: one left-padded tensor per layer for all rows of the decode batch ([`BatchKvCache`]), and one
//! sequence's own cache while its prompt is prefilled chunk by chunk ([`SequenceKv`]).
//!
//! Row `i` of the batch holds `lenᵢ` cached positions in the columns `[len − lenᵢ, len)` of a `(rows, kv_heads,
//! capacity, head_dim)` buffer; the columns before are padding, hidden from attention by a `-inf` mask. Every decode
//! step writes one new column for all rows at once (`slice_set`, in place), so rows stay right-aligned and the work
//! per step is the same handful of ops whatever the number of rows. The buffer is rebuilt only when the batch's
//! membership changes: rows leaving are dropped with one `index_select` (and padding shared by every remaining row
//! is trimmed); the rows joining in one step (each a [`SequenceKv`] whose prefill finished, or any sequence's
//! keys and values) are written into one new buffer with the old rows, so each step copies the batch at most once.
//! Capacity grows geometrically, up to the context length.
//!
//! A sequence's keys and values are a self-contained `[LayerKv]` (`(1, kv_heads, len, head_dim)` per layer) on the
//! way in and on the way out ([`BatchKvCache::row`]): a sequence can leave the batch with its cache and rejoin later
//! as a decode row without any prefill.

mod sequence;

use candle_core::{DType, Device, Result, Tensor};

pub(crate) use sequence::SequenceKv;

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

    /// Appends rows: for each `(kv, copies)` of `joining`, `copies` rows that all hold `kv` (one sequence's keys and
    /// values for every layer, `(1, kv_heads, len, head_dim)` each; the `num_samples` sequences of a request share
    /// their prompt's prefill). The buffers are rebuilt once for all of them: every row already in the batch is
    /// copied once (shifted right when a newcomer is longer than the batch), whatever the number of newcomers.
    pub(crate) fn push(&mut self, joining: &[(&[LayerKv], usize)]) -> Result<()> {
        let joining: Vec<(&[LayerKv], usize)> =
            joining.iter().copied().filter(|(kv, copies)| *copies > 0 && !kv.is_empty()).collect();
        if joining.is_empty() {
            return Ok(());
        }
        let lens = joining.iter().map(|(kv, _)| kv[0].keys.dim(2)).collect::<Result<Vec<_>>>()?;
        let new_len = lens.iter().copied().fold(self.len, usize::max);
        let old_shift = new_len - self.len;
        let capacity = grown_capacity(self.capacity, new_len + 1, self.max_capacity);
        for (index, slot) in self.layers.iter_mut().enumerate() {
            let old = slot.take();
            let mut buffers = Vec::with_capacity(2);
            for part in [Part::Keys, Part::Values] {
                let mut blocks = Vec::with_capacity(joining.len() + 1);
                if let Some(old) = &old {
                    let old = part.of(old);
                    if old_shift == 0 && capacity == self.capacity {
                        blocks.push(old.clone());
                    } else {
                        let (rows, heads, _, head_dim) = old.dims4()?;
                        let moved = Tensor::zeros((rows, heads, capacity, head_dim), self.dtype, &self.device)?;
                        // The columns past `len` are never read: moving them along saves a copy when they fit.
                        let source = if self.capacity + old_shift <= capacity {
                            old.contiguous()?
                        } else {
                            old.narrow(2, 0, self.len)?.contiguous()?
                        };
                        moved.slice_set(&source, 2, old_shift)?;
                        blocks.push(moved);
                    }
                }
                for ((kv, copies), len) in joining.iter().zip(&lens) {
                    let Some(layer) = kv.get(index) else { candle_core::bail!("a joining row lacks layer {index}") };
                    let fresh = part.of(layer);
                    let (_, heads, _, head_dim) = fresh.dims4()?;
                    let block = Tensor::zeros((1, heads, capacity, head_dim), self.dtype, &self.device)?;
                    block.slice_set(&fresh.contiguous()?, 2, new_len - len)?;
                    blocks.push(if *copies == 1 {
                        block
                    } else {
                        block.broadcast_as((*copies, heads, capacity, head_dim))?.contiguous()?
                    });
                }
                buffers.push(if blocks.len() == 1 { blocks.remove(0) } else { Tensor::cat(&blocks, 0)? });
            }
            let values = buffers.pop().expect("values were built");
            let keys = buffers.pop().expect("keys were built");
            *slot = Some(LayerKv { keys, values });
        }
        for pad in &mut self.pads {
            *pad += old_shift;
        }
        for ((_, copies), len) in joining.iter().zip(&lens) {
            self.pads.extend(std::iter::repeat_n(new_len - len, *copies));
        }
        self.len = new_len;
        self.capacity = capacity;
        self.rebuild_mask()
    }

    /// The position of each row's next token: how many positions it has cached.
    pub(crate) fn positions(&self) -> Vec<u32> {
        self.pads.iter().map(|pad| (self.len - pad) as u32).collect()
    }

    /// The keys and values of row `row`, its padding left out: what [`BatchKvCache::push`] takes back. This is how a
    /// sequence leaves the batch with its cache (to be parked, and rejoin later without any prefill).
    pub(crate) fn row(&self, row: usize) -> Result<Vec<LayerKv>> {
        let Some(&pad) = self.pads.get(row) else { candle_core::bail!("no row {row} in the batch") };
        let cached = self.len - pad;
        self.layers
            .iter()
            .flatten()
            .map(|layer| {
                let take = |buffer: &Tensor| buffer.narrow(0, row, 1)?.narrow(2, pad, cached)?.contiguous();
                Ok(LayerKv { keys: take(&layer.keys)?, values: take(&layer.values)? })
            })
            .collect()
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

/// The keys or the values of a [`LayerKv`].
#[derive(Clone, Copy)]
enum Part {
    Keys,
    Values,
}

impl Part {
    fn of(self, layer: &LayerKv) -> &Tensor {
        match self {
            Self::Keys => &layer.keys,
            Self::Values => &layer.values,
        }
    }
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
        cache.push(&[(&kv(2, 1.0), 1)]).expect("push");
        cache.push(&[(&kv(4, 2.0), 2)]).expect("push");
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
    fn several_rows_join_at_once_and_a_row_leaves_with_exactly_its_own_positions() {
        let mut cache = BatchKvCache::new(1, 4096, &Device::Cpu, DType::F32);
        cache.push(&[(&kv(3, 1.0), 1)]).expect("push");
        let (short, long) = (kv(2, 2.0), kv(5, 3.0));
        cache.push(&[(&short, 2), (&long, 1), (&kv(1, 4.0), 0)]).expect("push several");
        assert_eq!((cache.rows(), cache.len), (4, 5), "no row for zero copies");
        assert_eq!(cache.pads, vec![2, 3, 3, 0]);
        assert_eq!(cache.positions(), vec![3, 2, 2, 5]);
        assert_eq!(column_values(&cache, 0), vec![0.0, 0.0, 1.0, 1.0, 1.0], "the old row is shifted right");
        assert_eq!(column_values(&cache, 2), vec![0.0, 0.0, 0.0, 2.0, 2.0]);
        assert_eq!(column_values(&cache, 3), vec![3.0; 5]);

        let row = cache.row(1).expect("row 1");
        assert_eq!(row[0].keys.dims(), &[1, 1, 2, 2]);
        cache.retain(&[0, 2, 3]).expect("retain");
        cache.push(&[(&row, 1)]).expect("rejoin");
        assert_eq!(column_values(&cache, 3), vec![0.0, 0.0, 0.0, 2.0, 2.0], "it rejoins as it left");
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
