//! Key/value caches: one left-padded tensor per layer for all rows of the decode batch ([`BatchKvCache`]), and one
//! sequence's own cache while its prompt is prefilled chunk by chunk ([`SequenceKv`]).
//!
//! Row `i` of the batch holds `lenᵢ` cached positions in the columns `[len − lenᵢ, len)` of a `(row_capacity,
//! kv_heads, capacity, head_dim)` buffer; the columns before are padding, hidden from attention by a `-inf` mask.
//! Every decode step writes one new column for all rows at once (`slice_set`, in place), so rows stay right-aligned
//! and the work per step is the same handful of ops whatever the number of rows.
//!
//! Membership changes copy as little as they can, since a step that copies the whole batch stalls every tenant
//! (with 32 rows of a few hundred positions the buffers hold a gigabyte at f32):
//! - rows joining are written into free rows at the end of the buffers (their padding columns zeroed, as a reused
//!   row may hold anything a departed sequence wrote); only a newcomer longer than every row (the others shift
//!   right), a full row or column capacity, or a batch that shrank to a quarter of its rows rebuilds the buffers,
//!   and then with one copy of the rows in use. On the CPU the buffers reserve the scheduler's batch size of rows
//!   from the start: memory never written costs nothing there;
//! - rows leaving are replaced by rows moved from the end (one row copy each), not by re-gathering the batch;
//!   padding shared by every row is trimmed only once it is half the columns, or when the columns run out;
//! - a batch whose last row left keeps its buffers, and rows joining it again go into them (the rows of a keep-mode
//!   pause with KV reuse leave all at once and come back together: allocating and zeroing the buffers again would
//!   cost about a decode step). The owner gives them back with [`BatchKvCache::release`] when none are expected.
//!
//! Capacities grow geometrically (columns up to the context length); a shift right adds some slack.
//!
//! A sequence's keys and values are a self-contained `[LayerKv]` (`(1, kv_heads, len, head_dim)` per layer) on the
//! way in and on the way out ([`BatchKvCache::row`]): a sequence can leave the batch with its cache and rejoin later
//! as a decode row without any prefill.

mod sequence;

use candle_core::{DType, Device, Result, Tensor};

pub(crate) use sequence::SequenceKv;

/// The padding columns added beyond a longer newcomer when the rows are shifted right to make room for it.
const SHIFT_SLACK: usize = 32;

/// The keys and values of one layer for some rows, `(rows, kv_heads, len, head_dim)` each, RoPE already applied.
#[derive(Clone, Debug)]
pub(crate) struct LayerKv {
    pub(crate) keys: Tensor,
    pub(crate) values: Tensor,
}

/// The cache of a decode batch.
#[derive(Debug)]
pub(crate) struct BatchKvCache {
    /// One `(row_capacity, kv_heads, capacity, head_dim)` key/value buffer per layer; `None` while there are no
    /// rows. Rows `rows()..row_capacity` are free.
    layers: Vec<Option<LayerKv>>,
    /// Columns in use, the same for all rows.
    len: usize,
    capacity: usize,
    row_capacity: usize,
    /// The rows reserved at the first allocation on the CPU (see [`BatchKvCache::reserving_rows`]).
    reserved_rows: usize,
    /// The most rows written since the buffers were last allocated: their pages are in memory.
    touched_rows: usize,
    max_capacity: usize,
    /// Leading padding columns of each row.
    pads: Vec<usize>,
    /// `(rows, 1, 1, 1, capacity)`: `-inf` on each row's padding, 0 elsewhere.
    mask: Option<Tensor>,
    device: Device,
    dtype: DType,
}

impl BatchKvCache {
    /// An empty cache without buffers for `num_layers` layers whose rows never exceed `max_capacity` positions.
    pub(crate) fn new(num_layers: usize, max_capacity: usize, device: &Device, dtype: DType) -> Self {
        Self {
            layers: vec![None; num_layers],
            len: 0,
            capacity: 0,
            row_capacity: 0,
            reserved_rows: 0,
            touched_rows: 0,
            max_capacity,
            pads: Vec::new(),
            mask: None,
            device: device.clone(),
            dtype,
        }
    }

    /// Reserves room for `rows` rows at once on the CPU, where memory never written costs nothing (the buffers are
    /// allocated zeroed, which the system does lazily): rows joining then never rebuild the buffers. Elsewhere the
    /// row capacity grows geometrically.
    pub(crate) fn reserving_rows(mut self, rows: usize) -> Self {
        self.reserved_rows = if self.device.is_cpu() { rows } else { 0 };
        self
    }

    /// The number of rows.
    pub(crate) fn rows(&self) -> usize {
        self.pads.len()
    }

    /// Whether the cache has no rows but keeps its buffers for rows joining again.
    pub(crate) fn holds_spare_buffers(&self) -> bool {
        self.rows() == 0 && self.layers.iter().any(Option::is_some)
    }

    /// Gives back the buffers of a cache without rows (a cache with rows keeps them).
    pub(crate) fn release(&mut self) {
        if self.rows() == 0 {
            *self = Self::new(self.layers.len(), self.max_capacity, &self.device, self.dtype)
                .reserving_rows(self.reserved_rows);
        }
    }

    /// Keeps the rows at `keep` (indices of current rows, in their new order) and drops the others. Cheapest when
    /// every row either stays where it is or comes from past the new end (as when the last rows fill the holes):
    /// then only the moved rows are copied. Keeping none keeps the buffers (see [`BatchKvCache::release`]).
    pub(crate) fn retain(&mut self, keep: &[usize]) -> Result<()> {
        self.retain_rows(keep, true)
    }

    /// [`BatchKvCache::retain`] without trimming padding or giving rows back: for rows that left to come back (parked
    /// rows), which then fit again without shifting every row right.
    pub(crate) fn retain_keeping_layout(&mut self, keep: &[usize]) -> Result<()> {
        self.retain_rows(keep, false)
    }

    fn retain_rows(&mut self, keep: &[usize], compact: bool) -> Result<()> {
        if keep.is_empty() {
            (self.len, self.mask) = (0, None);
            self.pads.clear();
            return Ok(());
        }
        let moves_only_from_the_end = keep.iter().enumerate().all(|(to, &from)| from == to || from >= keep.len());
        if moves_only_from_the_end {
            for (to, &from) in keep.iter().enumerate().filter(|(to, from)| to != *from) {
                for layer in self.layers.iter().flatten() {
                    for buffer in [&layer.keys, &layer.values] {
                        // `slice_set` copies between distinct storages: the moved row goes through a copy.
                        let moved = buffer.narrow(0, from, 1)?.force_contiguous()?;
                        buffer.narrow(0, to, 1)?.slice_set(&moved, 2, 0)?;
                    }
                }
            }
        } else {
            let index =
                Tensor::from_vec(keep.iter().map(|&row| row as u32).collect::<Vec<_>>(), keep.len(), &self.device)?;
            for layer in self.layers.iter_mut().flatten() {
                for buffer in [&mut layer.keys, &mut layer.values] {
                    *buffer = buffer.index_select(&index, 0)?;
                }
            }
            self.row_capacity = keep.len();
        }
        self.pads = keep.iter().map(|&row| self.pads[row]).collect();
        let trim = self.shared_padding();
        // A batch down to a quarter of the rows it wrote is rebuilt, to give their memory back.
        let shrink = self.touched_rows > 16 && self.rows() * 4 <= self.touched_rows;
        if compact && (shrink || trim * 2 >= self.len.max(1)) {
            let row_capacity =
                if shrink { self.reserved_rows.max(grown_rows(0, self.rows())) } else { self.row_capacity };
            self.relayout(row_capacity, self.capacity, trim)?;
        }
        self.rebuild_mask()
    }

    /// Appends rows: for each `(kv, copies)` of `joining`, `copies` rows that all hold `kv` (one sequence's keys and
    /// values for every layer, `(1, kv_heads, len, head_dim)` each; the `num_samples` sequences of a request share
    /// their prompt's prefill). The newcomers go into free rows; the rows already in the batch are copied only when
    /// the buffers must be rebuilt (see the module's documentation), and then once, whatever the number of
    /// newcomers.
    pub(crate) fn push(&mut self, joining: &[(&[LayerKv], usize)]) -> Result<()> {
        let joining: Vec<(&[LayerKv], usize)> =
            joining.iter().copied().filter(|(kv, copies)| *copies > 0 && !kv.is_empty()).collect();
        if joining.is_empty() {
            return Ok(());
        }
        for (kv, _) in &joining {
            if kv.len() != self.layers.len() {
                candle_core::bail!("a joining row has {} layers, the batch {}", kv.len(), self.layers.len());
            }
        }
        let lens = joining.iter().map(|(kv, _)| kv[0].keys.dim(2)).collect::<Result<Vec<_>>>()?;
        let new_len = lens.iter().copied().fold(self.len, usize::max);
        let rows = self.rows() + joining.iter().map(|(_, copies)| copies).sum::<usize>();
        // Spare buffers take the newcomers when they fit (`len` is 0: nothing to shift); else fresh ones do.
        let fit_spare_buffers = new_len < self.capacity && rows <= self.row_capacity;
        if self.holds_spare_buffers() && !fit_spare_buffers {
            self.release();
        }
        if self.layers[0].is_none() {
            let (heads, head_dim) = (joining[0].0[0].keys.dim(1)?, joining[0].0[0].keys.dim(3)?);
            self.allocate(rows, grown_capacity(0, new_len + 1, self.max_capacity), heads, head_dim)?;
        } else if self.rows() > 0 && (new_len > self.len || new_len >= self.capacity || rows > self.row_capacity) {
            // A newcomer longer than the batch shifts every row right: by some slack more, so that the next
            // newcomers of about its length (the continuations of a swap, prompts of one batch) fit without another.
            let new_len = if new_len > self.len {
                (new_len + SHIFT_SLACK).min(self.max_capacity.saturating_sub(1)).max(new_len)
            } else {
                new_len
            };
            let capacity = grown_capacity(self.capacity, new_len + 1, self.max_capacity);
            self.grow(rows, capacity, new_len - self.len)?;
        }
        let new_len = self.len.max(new_len);
        let mut row = self.rows();
        for ((kv, copies), len) in joining.iter().zip(&lens) {
            let pad = new_len - len;
            for _ in 0..*copies {
                for (layer, fresh) in self.layers.iter().flatten().zip(kv.iter()) {
                    for (buffer, fresh) in [(&layer.keys, &fresh.keys), (&layer.values, &fresh.values)] {
                        let target = buffer.narrow(0, row, 1)?;
                        if pad > 0 {
                            let (_, heads, _, head_dim) = fresh.dims4()?;
                            let zeros = Tensor::zeros((1, heads, pad, head_dim), self.dtype, &self.device)?;
                            target.slice_set(&zeros, 2, 0)?;
                        }
                        target.slice_set(&fresh.contiguous()?, 2, pad)?;
                    }
                }
                self.pads.push(pad);
                row += 1;
            }
        }
        self.touched_rows = self.touched_rows.max(row);
        self.len = new_len;
        self.rebuild_mask()
    }

    /// The position of each row's next token: how many positions it has cached.
    pub(crate) fn positions(&self) -> Vec<u32> {
        self.pads.iter().map(|pad| (self.len - pad) as u32).collect()
    }

    /// The keys and values of row `row`, its padding left out: what [`BatchKvCache::push`] takes back. This is how a
    /// sequence leaves the batch with its cache (to be parked, and rejoin later without any prefill). Always a copy:
    /// with one key/value head a row's columns are contiguous in the buffer, and a view would change as the buffer
    /// is written, and keep the whole buffer alive.
    pub(crate) fn row(&self, row: usize) -> Result<Vec<LayerKv>> {
        let Some(&pad) = self.pads.get(row) else { candle_core::bail!("no row {row} in the batch") };
        let cached = self.len - pad;
        self.layers
            .iter()
            .flatten()
            .map(|layer| {
                let take = |buffer: &Tensor| buffer.narrow(0, row, 1)?.narrow(2, pad, cached)?.force_contiguous();
                Ok(LayerKv { keys: take(&layer.keys)?, values: take(&layer.values)? })
            })
            .collect()
    }

    /// Makes room for one more column (call once per decode step, before the layers append): trims the padding
    /// every row shares, or grows the columns.
    pub(crate) fn reserve_step(&mut self) -> Result<()> {
        if self.len < self.capacity {
            return Ok(());
        }
        let trim = self.shared_padding();
        if trim > 0 {
            self.relayout(self.row_capacity, self.capacity, trim)?;
        } else {
            let capacity = grown_capacity(self.capacity, self.len + 1, self.max_capacity);
            if capacity <= self.len {
                candle_core::bail!("the KV cache is full ({} positions)", self.max_capacity);
            }
            self.grow(self.row_capacity, capacity, 0)?;
        }
        self.rebuild_mask()
    }

    /// Writes the step's new keys and values `(rows, kv_heads, 1, head_dim)` of `layer` and returns the layer's
    /// whole cache including them.
    pub(crate) fn append(&self, layer: usize, keys: &Tensor, values: &Tensor) -> Result<(Tensor, Tensor)> {
        let Some(Some(cache)) = self.layers.get(layer) else { candle_core::bail!("no cached rows in layer {layer}") };
        let rows = self.rows();
        let (cached_keys, cached_values) = (cache.keys.narrow(0, 0, rows)?, cache.values.narrow(0, 0, rows)?);
        cached_keys.slice_set(&keys.contiguous()?, 2, self.len)?;
        cached_values.slice_set(&values.contiguous()?, 2, self.len)?;
        Ok((cached_keys.narrow(2, 0, self.len + 1)?, cached_values.narrow(2, 0, self.len + 1)?))
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

    /// Leading padding columns every row has.
    fn shared_padding(&self) -> usize {
        self.pads.iter().copied().min().unwrap_or(0)
    }

    /// Fresh zeroed buffers of `rows` rows and `capacity` columns (for the first rows).
    fn allocate(&mut self, rows: usize, capacity: usize, heads: usize, head_dim: usize) -> Result<()> {
        let row_capacity = self.reserved_rows.max(grown_rows(0, rows));
        for slot in &mut self.layers {
            let buffer = || Tensor::zeros((row_capacity, heads, capacity, head_dim), self.dtype, &self.device);
            *slot = Some(LayerKv { keys: buffer()?, values: buffer()? });
        }
        (self.row_capacity, self.capacity) = (row_capacity, capacity);
        Ok(())
    }

    /// Rebuilds the buffers with room for at least `rows` rows and `capacity` columns, the rows in use shifted
    /// `shift` columns right.
    fn grow(&mut self, rows: usize, capacity: usize, shift: usize) -> Result<()> {
        let row_capacity =
            if rows > self.row_capacity { grown_rows(self.row_capacity, rows) } else { self.row_capacity };
        let rows = self.rows();
        for layer in self.layers.iter_mut().flatten() {
            for buffer in [&mut layer.keys, &mut layer.values] {
                let (_, heads, _, head_dim) = buffer.dims4()?;
                let grown = Tensor::zeros((row_capacity, heads, capacity, head_dim), self.dtype, &self.device)?;
                if rows > 0 {
                    // The columns past `len` are never read: moving them along saves a copy when they fit.
                    let used = buffer.narrow(0, 0, rows)?;
                    let source = if self.capacity + shift <= capacity {
                        used
                    } else {
                        used.narrow(2, 0, self.len)?.contiguous()?
                    };
                    grown.narrow(0, 0, rows)?.slice_set(&source, 2, shift)?;
                }
                *buffer = grown;
            }
        }
        for pad in &mut self.pads {
            *pad += shift;
        }
        self.len += shift;
        (self.row_capacity, self.capacity, self.touched_rows) = (row_capacity, capacity, rows);
        Ok(())
    }

    /// Rebuilds the buffers with `row_capacity` rows (at least those in use) and `capacity` columns, dropping the
    /// first `trim` columns (padding of every row).
    fn relayout(&mut self, row_capacity: usize, capacity: usize, trim: usize) -> Result<()> {
        let rows = self.rows();
        let row_capacity = row_capacity.max(rows);
        let kept = self.len - trim;
        for layer in self.layers.iter_mut().flatten() {
            for buffer in [&mut layer.keys, &mut layer.values] {
                let (_, heads, _, head_dim) = buffer.dims4()?;
                let rebuilt = Tensor::zeros((row_capacity, heads, capacity, head_dim), self.dtype, &self.device)?;
                let source = buffer.narrow(0, 0, rows)?.narrow(2, trim, kept)?.contiguous()?;
                rebuilt.narrow(0, 0, rows)?.slice_set(&source, 2, 0)?;
                *buffer = rebuilt;
            }
        }
        for pad in &mut self.pads {
            *pad -= trim;
        }
        self.len = kept;
        (self.row_capacity, self.capacity, self.touched_rows) = (row_capacity, capacity, rows);
        Ok(())
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

/// The new order of the rows flagged in `kept`, the cheapest for [`BatchKvCache::retain`]: a kept row stays where it is unless it is past the new end, in which
/// case it fills the first hole (a row not kept) before that end.
pub(crate) fn fill_holes_from_the_end(kept: &[bool]) -> Vec<usize> {
    let count = kept.iter().filter(|&&keep| keep).count();
    let mut from_the_end = (count..kept.len()).filter(|&index| kept[index]);
    (0..count)
        .map(|index| if kept[index] { index } else { from_the_end.next().expect("as many rows past the end as holes") })
        .collect()
}

/// At least `needed`, at least double the current capacity, at most `max`, in multiples of 64.
fn grown_capacity(current: usize, needed: usize, max: usize) -> usize {
    if needed <= current {
        return current;
    }
    needed.max(current * 2).next_multiple_of(64).min(max).max(needed.min(max))
}

/// Row capacity for at least `needed` rows: at least double the current, in multiples of 8.
fn grown_rows(current: usize, needed: usize) -> usize {
    needed.max(current * 2).next_multiple_of(8)
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
    fn rows_are_left_padded_and_padding_is_trimmed_once_it_is_half_the_columns() {
        // Two long rows, then a short one (shorter than the batch: no shift), then one decode step.
        let stepped = |short: usize| {
            let mut cache = BatchKvCache::new(1, 4096, &Device::Cpu, DType::F32);
            cache.push(&[(&kv(4, 2.0), 2)]).expect("push");
            cache.push(&[(&kv(short, 1.0), 1)]).expect("push");
            assert_eq!((cache.rows(), cache.len), (3, 4));
            assert_eq!(cache.pads, vec![0, 0, 4 - short]);
            cache.reserve_step().expect("reserve");
            let new = Tensor::full(3f32, (3, 1, 1, 2), &Device::Cpu).expect("new");
            let (keys, _) = cache.append(0, &new, &new).expect("append");
            assert_eq!(keys.dim(2).expect("len"), 5);
            let mask = cache.step_mask().and_then(|m| m.flatten_all()).and_then(|m| m.to_vec1::<f32>()).expect("mask");
            let short_row = &mask[2 * 5..3 * 5];
            assert!(short_row[..4 - short].iter().all(|&m| m == f32::NEG_INFINITY), "{short_row:?}");
            assert!(short_row[4 - short..].iter().all(|&m| m == 0.0), "{short_row:?}");
            cache.advance();
            cache
        };

        let mut cache = stepped(1);
        assert_eq!(column_values(&cache, 2), vec![0.0, 0.0, 0.0, 1.0, 3.0]);
        // The long rows leave: three of five columns are padding the short row alone has, so they go.
        cache.retain(&[2]).expect("retain");
        assert_eq!((cache.rows(), cache.len, cache.pads.clone()), (1, 2, vec![0]));
        assert_eq!(column_values(&cache, 0), vec![1.0, 3.0]);
        cache.retain(&[]).expect("retain none");
        assert_eq!(cache.rows(), 0);

        // One of five columns is padding: less than half, so it stays (trimming copies the whole batch).
        let mut cache = stepped(3);
        cache.retain(&[2]).expect("retain");
        assert_eq!((cache.rows(), cache.len, cache.pads.clone()), (1, 5, vec![1]));
        assert_eq!(column_values(&cache, 0), vec![0.0, 1.0, 1.0, 1.0, 3.0]);
        assert_eq!(cache.row(0).expect("row")[0].keys.dims(), &[1, 1, 4, 2], "the row leaves without its padding");
    }

    #[test]
    fn a_reused_row_has_its_padding_zeroed_and_moved_rows_keep_their_values() {
        let mut cache = BatchKvCache::new(1, 4096, &Device::Cpu, DType::F32);
        cache.push(&[(&kv(6, 2.0), 1), (&kv(6, 3.0), 1), (&kv(6, f32::NAN), 1)]).expect("push");
        // The last row (with NaN keys, as a hostile adapter writes them) leaves; its row is free, not cleared.
        cache.retain(&[0, 1]).expect("retain");
        // A short newcomer takes that row: its padding must not hold NaN (masked weights are 0, and 0 × NaN is NaN).
        cache.push(&[(&kv(2, 4.0), 1)]).expect("push");
        assert_eq!(column_values(&cache, 2), vec![0.0, 0.0, 0.0, 0.0, 4.0, 4.0]);
        // The first row leaves: the last moves into its place, and the others stay.
        cache.retain(&[2, 1]).expect("retain");
        assert_eq!(cache.positions(), vec![2, 6]);
        assert_eq!(column_values(&cache, 0), vec![0.0, 0.0, 0.0, 0.0, 4.0, 4.0]);
        assert_eq!(column_values(&cache, 1), vec![3.0; 6]);
    }

    #[test]
    fn several_rows_join_at_once_and_a_row_leaves_with_exactly_its_own_positions() {
        let mut cache = BatchKvCache::new(1, 4096, &Device::Cpu, DType::F32);
        cache.push(&[(&kv(3, 1.0), 1)]).expect("push");
        let (short, long) = (kv(2, 2.0), kv(5, 3.0));
        cache.push(&[(&short, 2), (&long, 1), (&kv(1, 4.0), 0)]).expect("push several");
        // The longer newcomer shifted the batch right, by the slack more.
        let slack = SHIFT_SLACK;
        let padded = |pad: usize, values: &[f32]| [vec![0.0; pad], values.to_vec()].concat();
        assert_eq!((cache.rows(), cache.len), (4, 5 + slack), "no row for zero copies");
        assert_eq!(cache.pads, vec![2 + slack, 3 + slack, 3 + slack, slack]);
        assert_eq!(cache.positions(), vec![3, 2, 2, 5]);
        assert_eq!(column_values(&cache, 0), padded(2 + slack, &[1.0; 3]), "the old row is shifted right");
        assert_eq!(column_values(&cache, 2), padded(3 + slack, &[2.0; 2]));
        assert_eq!(column_values(&cache, 3), padded(slack, &[3.0; 5]));

        let row = cache.row(1).expect("row 1");
        assert_eq!(row[0].keys.dims(), &[1, 1, 2, 2]);
        // A newcomer no longer than the batch (within the slack) needs no shift.
        cache.push(&[(&kv(20, 5.0), 1)]).expect("push within the slack");
        assert_eq!((cache.rows(), cache.len), (5, 5 + slack));
        assert_eq!(column_values(&cache, 0), padded(2 + slack, &[1.0; 3]), "the old rows stayed in place");
        assert_eq!(column_values(&cache, 4), padded(5 + slack - 20, &[5.0; 20]));
        // Rows 1 and 4 leave, in an order that gathers the rows; the slack, now more than half the columns and
        // shared by every row, is trimmed.
        cache.retain(&[0, 2, 3]).expect("retain");
        assert_eq!((cache.rows(), cache.len), (3, 5));
        cache.push(&[(&row, 1)]).expect("rejoin");
        assert_eq!(column_values(&cache, 3), vec![0.0, 0.0, 0.0, 2.0, 2.0], "it rejoins as it left");
        assert_eq!(column_values(&cache, 2), vec![3.0; 5]);
    }

    #[test]
    fn an_emptied_batch_keeps_its_buffers_for_rows_that_fit_and_gives_them_back_when_told() {
        let buffer = |cache: &BatchKvCache| cache.layers[0].as_ref().map(|layer| layer.keys.id());
        let mut cache = BatchKvCache::new(1, 4096, &Device::Cpu, DType::F32);
        cache.push(&[(&kv(6, 2.0), 2)]).expect("push");
        let first = buffer(&cache).expect("buffers");
        cache.retain(&[]).expect("every row leaves");
        assert!(cache.holds_spare_buffers());
        assert_eq!((cache.rows(), cache.len), (0, 0));

        // Rows joining again go into the same buffers; a shorter one's padding is zeroed over what was there.
        cache.push(&[(&kv(6, 3.0), 1), (&kv(4, 4.0), 1)]).expect("rejoin");
        assert_eq!(buffer(&cache), Some(first), "no new buffers");
        assert_eq!((cache.rows(), cache.len, cache.pads.clone()), (2, 6, vec![0, 2]));
        assert_eq!(column_values(&cache, 0), vec![3.0; 6]);
        assert_eq!(column_values(&cache, 1), vec![0.0, 0.0, 4.0, 4.0, 4.0, 4.0]);
        cache.release();
        assert_eq!(buffer(&cache), Some(first), "a cache with rows keeps its buffers");

        // A row longer than the spare buffers' columns gets fresh buffers.
        cache.retain(&[]).expect("every row leaves");
        cache.push(&[(&kv(100, 5.0), 1)]).expect("a longer row");
        assert!(buffer(&cache).is_some_and(|id| id != first), "fresh buffers");
        assert_eq!((cache.rows(), cache.len), (1, 100));
        assert_eq!(column_values(&cache, 0), vec![5.0; 100]);

        cache.retain(&[]).expect("every row leaves");
        cache.release();
        assert!(!cache.holds_spare_buffers());
        assert_eq!(buffer(&cache), None, "given back");
    }

    #[test]
    fn rows_leaving_to_come_back_keep_the_layout_and_return_without_a_shift() {
        let buffer = |cache: &BatchKvCache| cache.layers[0].as_ref().map(|layer| layer.keys.id());
        for keep_layout in [true, false] {
            let mut cache = BatchKvCache::new(1, 4096, &Device::Cpu, DType::F32);
            cache.push(&[(&kv(2, 1.0), 1), (&kv(40, 2.0), 2)]).expect("a short row and two long ones");
            let parked = [cache.row(1).expect("row 1"), cache.row(2).expect("row 2")];
            let first = buffer(&cache);
            // The long rows leave; the short one's padding is now all but 2 of the 40 columns.
            if keep_layout {
                cache.retain_keeping_layout(&[0]).expect("retain");
                assert_eq!((cache.len, cache.pads.clone()), (40, vec![38]), "no trim");
            } else {
                cache.retain(&[0]).expect("retain");
                assert_eq!((cache.len, cache.pads.clone()), (2, vec![0]), "trimmed");
            }
            cache.push(&[(&parked[0], 1), (&parked[1], 1)]).expect("they come back");
            assert_eq!(
                buffer(&cache) == first,
                keep_layout,
                "a shift rebuilds the buffers (keep_layout {keep_layout})"
            );
            assert_eq!(cache.positions(), vec![2, 40, 40]);
            let (short, long) = (column_values(&cache, 0), column_values(&cache, 2));
            assert_eq!(short[short.len() - 2..], [1.0, 1.0]);
            assert_eq!(long[long.len() - 40..], [2.0; 40]);
        }
    }

    #[test]
    fn capacity_grows_geometrically_within_the_context() {
        assert_eq!(grown_capacity(0, 5, 4096), 64);
        assert_eq!(grown_capacity(64, 65, 4096), 128);
        assert_eq!(grown_capacity(64, 64, 4096), 64);
        assert_eq!(grown_capacity(4000, 4001, 4096), 4096);
        assert_eq!(grown_capacity(4096, 4097, 4096), 4096);
    }

    #[test]
    fn the_last_kept_rows_fill_the_holes() {
        assert_eq!(fill_holes_from_the_end(&[true, false, true, true]), vec![0, 3, 2]);
        assert_eq!(fill_holes_from_the_end(&[false, false, true, true, false]), vec![2, 3]);
        assert_eq!(fill_holes_from_the_end(&[true, true, false, false]), vec![0, 1]);
        assert_eq!(fill_holes_from_the_end(&[false, true, false, true, true]), vec![3, 1, 4]);
        assert_eq!(fill_holes_from_the_end(&[false, false]), Vec::<usize>::new());
    }
}
