//! The paged KV cache: keys and values live in fixed-size **blocks** of [`BLOCK_SIZE`] positions taken from one
//! pool, and each sequence has a block table ([`SequenceBlocks`]) saying which blocks hold its positions.
//!
//! - **Storage**: per layer one key and one value tensor of `(blocks · block_size, kv_heads · head_dim)`: row `s`
//!   is *slot* `s`, every key/value head of one position. A position costs exactly `2 · layers · kv_heads ·
//!   head_dim · dtype` bytes wherever it is, with no padding; the tensors are allocated once, zeroed, at the pool's
//!   size (on the CPU that memory costs nothing until a block is first written: the system hands zeroed pages out
//!   lazily, and the pool hands the lowest blocks out first).
//! - **Blocks** are reference-counted ([`BlockPool`]): the `num_samples` sequences of one request share their
//!   prompt's blocks, a parked sequence keeps its own by reference, and prefix hits share blocks across requests.
//!   A sequence appending to a partly filled block that others share first copies the block's filled positions
//!   into one of its own (copy on write, [`KvCache::reserve`]); full blocks are never written again.
//! - **Attention reads the blocks**: on the CPU the decode rows' attention walks each sequence's blocks in place,
//!   and a prefill chunk's reads its cached prefix from them (`model/ops`); elsewhere (CUDA) each pass gathers the
//!   slots it attends to into contiguous tensors once per layer (padding points at block 0, which is never handed
//!   out and stays zero, so masked padding contributes exact zeros).
//!
//! Why 16 positions per block: prefixes are reused in whole blocks, so a conversation's next turn or a swap's
//! continuation recomputes up to one block of what it already had, and a sequence wastes up to one block's slots;
//! 16 keeps both small (vLLM's GPU default) while the per-block work — a table entry, a hash per full block — stays
//! negligible beside a block's 16 × `kv_heads · head_dim` values. Attention does not care: it walks positions.

mod blocks;
mod hash;
mod pool;

use candle_core::{CpuStorage, DType, Device, InplaceOp2, Layout, Result, Tensor};

pub(crate) use blocks::SequenceBlocks;
pub(crate) use hash::BlockHash;
pub(crate) use pool::{BlockId, BlockPool};

/// Positions per block.
pub(crate) const BLOCK_SIZE: usize = 16;

/// Why a sequence of `positions` positions can never run in a cache of `blocks` blocks: the error that names the
/// limit.
pub(crate) fn kv_cache_error(positions: usize, blocks: usize) -> String {
    format!(
        "needs {positions} positions of KV cache, more than the {} ({blocks} blocks of {BLOCK_SIZE}) the cache holds \
         (--kv-cache-memory-bytes)",
        blocks * BLOCK_SIZE
    )
}

/// One layer's storage: `(slots, kv_heads · head_dim)` keys and values, RoPE already applied to the keys.
#[derive(Debug)]
pub(crate) struct LayerKv {
    pub(crate) keys: Tensor,
    pub(crate) values: Tensor,
}

/// The pool of blocks of one engine, with the keys and values they hold.
pub(crate) struct KvCache {
    layers: Vec<LayerKv>,
    pool: BlockPool,
    kv_heads: usize,
    head_dim: usize,
    /// Whether attention reads the blocks in place (the CPU kernels, f32) rather than gathering them.
    in_place: bool,
}

/// Why room could not be made for a sequence's next positions.
#[derive(Debug)]
pub(crate) enum ReserveError {
    /// Not enough blocks are free or cached: some sequence must give its blocks back first.
    OutOfBlocks,
    /// Copying a shared block failed.
    Model(candle_core::Error),
}

impl KvCache {
    /// A cache of `blocks` blocks of [`BLOCK_SIZE`] positions for a model of `num_layers` layers with `kv_heads`
    /// key/value heads of `head_dim` values; block 0 is kept zero and never handed out.
    pub(crate) fn new(
        num_layers: usize,
        (kv_heads, head_dim): (usize, usize),
        blocks: usize,
        prefix_caching: bool,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let blocks = blocks.max(2);
        let slots = blocks * BLOCK_SIZE;
        let layers = (0..num_layers)
            .map(|_| {
                let buffer = || Tensor::zeros((slots, kv_heads * head_dim), dtype, device);
                Ok(LayerKv { keys: buffer()?, values: buffer()? })
            })
            .collect::<Result<Vec<_>>>()?;
        let in_place = device.is_cpu() && dtype == DType::F32;
        let pool = BlockPool::new(blocks, BLOCK_SIZE, prefix_caching);
        Ok(Self { layers, pool, kv_heads, head_dim, in_place })
    }

    /// The bytes of one cached position: `2 · layers · kv_heads · head_dim · dtype`.
    pub(crate) fn bytes_per_position(num_layers: usize, kv_heads: usize, head_dim: usize, dtype: DType) -> usize {
        2 * num_layers * kv_heads * head_dim * dtype.size_in_bytes()
    }

    /// The same cache reading its blocks through gathered copies, as on devices (tests the device path on the CPU).
    #[cfg(test)]
    pub(crate) fn gathering(mut self) -> Self {
        self.in_place = false;
        self
    }

    /// The block pool.
    pub(crate) fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Layer `layer`'s keys and values.
    pub(crate) fn layer(&self, layer: usize) -> Option<&LayerKv> {
        self.layers.get(layer)
    }

    /// Whether attention reads the blocks in place.
    pub(crate) fn in_place(&self) -> bool {
        self.in_place
    }

    /// Blocks [`KvCache::reserve`] must take for `positions` more positions of `sequence`: new blocks, and one to
    /// copy a shared partly filled last block into.
    #[cfg(test)]
    pub(crate) fn blocks_needed(&self, sequence: &SequenceBlocks, positions: usize) -> usize {
        let end = sequence.len() + positions;
        let new = end.div_ceil(BLOCK_SIZE).saturating_sub(sequence.blocks().len());
        new + usize::from(positions > 0 && self.must_copy_last(sequence))
    }

    /// Makes room in `sequence` for `positions` more positions: copies a partly filled last block it shares with
    /// other sequences into a block of its own, then allocates the blocks the new positions need. All or nothing:
    /// [`ReserveError::OutOfBlocks`] takes no block.
    pub(crate) fn reserve(
        &self,
        sequence: &mut SequenceBlocks,
        positions: usize,
    ) -> std::result::Result<(), ReserveError> {
        if positions == 0 {
            return Ok(());
        }
        let copy = self.must_copy_last(sequence);
        let new = (sequence.len() + positions).div_ceil(BLOCK_SIZE).saturating_sub(sequence.blocks().len());
        let Some(mut ids) = self.pool.allocate(new + usize::from(copy)) else { return Err(ReserveError::OutOfBlocks) };
        if copy {
            let target = ids.pop().expect("a block to copy into");
            let last = *sequence.blocks().last().expect("a partly filled block");
            if let Err(err) = self.copy_block(last, target, sequence.len() % BLOCK_SIZE) {
                self.pool.release(&ids);
                self.pool.release(&[target]);
                return Err(ReserveError::Model(err));
            }
            sequence.replace_last(target);
        }
        sequence.push_blocks(ids);
        Ok(())
    }

    /// Whether the next position of `sequence` falls in a partly filled block that another table references.
    fn must_copy_last(&self, sequence: &SequenceBlocks) -> bool {
        !sequence.len().is_multiple_of(BLOCK_SIZE)
            && sequence.blocks().len() == sequence.len().div_ceil(BLOCK_SIZE)
            && sequence.blocks().last().is_some_and(|&last| self.pool.refs(last) > 1)
    }

    /// Copies the first `positions` slots of block `from` into block `to`, in every layer.
    fn copy_block(&self, from: BlockId, to: BlockId, positions: usize) -> Result<()> {
        let (from, to) = (from as usize * BLOCK_SIZE, to as usize * BLOCK_SIZE);
        for layer in &self.layers {
            for buffer in [&layer.keys, &layer.values] {
                // `slice_set` copies between distinct storages: the block goes through a copy.
                let filled = buffer.narrow(0, from, positions)?.copy()?;
                buffer.slice_set(&filled, 0, to)?;
            }
        }
        Ok(())
    }

    /// Writes a pass's new keys and values of `layer`, `(tokens, kv_heads, 1, head_dim)` each, into their slots.
    pub(crate) fn write(&self, layer: usize, slots: &Slots, keys: &Tensor, values: &Tensor) -> Result<()> {
        let Some(storage) = self.layers.get(layer) else { candle_core::bail!("no layer {layer} in the KV cache") };
        let width = self.kv_heads * self.head_dim;
        for (buffer, new) in [(&storage.keys, keys), (&storage.values, values)] {
            let new = new.reshape((slots.host.len(), width))?.contiguous()?;
            match &slots.device {
                Some(index) => buffer.scatter_set(index, &new, 0)?,
                None => buffer.inplace_op2(&new, &WriteRows { slots: &slots.host, width })?,
            }
        }
        Ok(())
    }

    /// The slots of a pass's tokens, in the form [`KvCache::write`] takes.
    pub(crate) fn slots(&self, host: Vec<u32>) -> Result<Slots> {
        let device = if self.in_place {
            None
        } else {
            let (device, width) = (self.layers[0].keys.device(), self.kv_heads * self.head_dim);
            let count = host.len();
            Some(Tensor::from_slice(&host, (count, 1), device)?.broadcast_as((count, width))?.contiguous()?)
        };
        Ok(Slots { host, device })
    }
}

/// Where a pass's tokens' keys and values go: one global slot per token, in pass order.
pub(crate) struct Slots {
    pub(crate) host: Vec<u32>,
    /// For devices: the slots as a `(tokens, kv_heads · head_dim)` index of `scatter_set`.
    device: Option<Tensor>,
}

/// Writes rows of `width` values into the rows `slots` of a `(slots, width)` storage, on the CPU.
struct WriteRows<'a> {
    slots: &'a [u32],
    width: usize,
}

impl InplaceOp2 for WriteRows<'_> {
    fn name(&self) -> &'static str {
        "kv-write-rows"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout, new: &CpuStorage, new_layout: &Layout) -> Result<()> {
        let (CpuStorage::F32(storage), CpuStorage::F32(new)) = (storage, new) else {
            candle_core::bail!("the KV cache's fast path writes f32")
        };
        let (Some((start, _)), Some((new_start, new_end))) =
            (layout.contiguous_offsets(), new_layout.contiguous_offsets())
        else {
            candle_core::bail!("non-contiguous KV rows")
        };
        let new = &new[new_start..new_end];
        if new.len() != self.slots.len() * self.width {
            candle_core::bail!("{} values for {} slots of {}", new.len(), self.slots.len(), self.width);
        }
        for (row, &slot) in new.chunks_exact(self.width).zip(self.slots) {
            let at = start + slot as usize * self.width;
            storage[at..at + self.width].copy_from_slice(row);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(blocks: usize) -> KvCache {
        KvCache::new(1, (1, 2), blocks, true, &Device::Cpu, DType::F32).expect("cache")
    }

    /// Writes `values` (one per position) as the keys and values of the next positions of `sequence`.
    fn append(cache: &KvCache, sequence: &mut SequenceBlocks, values: &[f32]) {
        cache.reserve(sequence, values.len()).expect("room");
        let slots = cache.slots(sequence.next_slots(values.len()).collect()).expect("slots");
        let data: Vec<f32> = values.iter().flat_map(|&value| [value, value]).collect();
        let new = Tensor::from_vec(data, (values.len(), 1, 1, 2), &Device::Cpu).expect("new");
        cache.write(0, &slots, &new, &new).expect("write");
        sequence.advance(values.len());
    }

    /// The keys of every position of `sequence`, read through its blocks.
    fn read(cache: &KvCache, sequence: &SequenceBlocks) -> Vec<f32> {
        let keys = cache.layer(0).expect("layer").keys.to_vec2::<f32>().expect("keys");
        (0..sequence.len())
            .map(|position| {
                keys[sequence.blocks()[position / BLOCK_SIZE] as usize * BLOCK_SIZE + position % BLOCK_SIZE][0]
            })
            .collect()
    }

    #[test]
    fn sequences_fill_blocks_in_order_and_a_shared_partial_block_is_copied_on_write() {
        for gather in [false, true] {
            let cache = if gather { cache(8).gathering() } else { cache(8) };
            let mut first = SequenceBlocks::new(cache.pool(), None);
            let prompt: Vec<f32> = (0..20).map(|i| i as f32).collect();
            append(&cache, &mut first, &prompt);
            assert_eq!(first.blocks(), &[1, 2], "two blocks, the lowest first");
            let mut second = first.fork();
            assert_eq!(cache.pool().refs(2), 2, "shared by reference");
            assert_eq!(cache.blocks_needed(&second, 1), 1, "the shared partial block is copied");
            append(&cache, &mut second, &[100.0]);
            append(&cache, &mut first, &[200.0]);
            assert_eq!(second.blocks()[0], first.blocks()[0], "full blocks stay shared");
            assert_ne!(second.blocks()[1], first.blocks()[1], "the partial block was copied before the write");
            assert_eq!(read(&cache, &second), [prompt.clone(), vec![100.0]].concat(), "gather {gather}");
            assert_eq!(read(&cache, &first), [prompt.clone(), vec![200.0]].concat(), "gather {gather}");
            assert_eq!(cache.pool().usage().used, 3);
            drop((first, second));
            assert_eq!(cache.pool().usage().used, 0, "every block given back");
            cache.pool().check();
        }
    }

    #[test]
    fn a_reservation_that_does_not_fit_takes_nothing() {
        let cache = cache(3);
        let mut sequence = SequenceBlocks::new(cache.pool(), None);
        assert!(matches!(cache.reserve(&mut sequence, 3 * BLOCK_SIZE), Err(ReserveError::OutOfBlocks)));
        assert_eq!(cache.pool().usage().used, 0);
        cache.reserve(&mut sequence, 2 * BLOCK_SIZE).expect("two blocks fit");
        assert_eq!(sequence.capacity(), 2 * BLOCK_SIZE);
        assert_eq!(
            KvCache::bytes_per_position(30, 3, 64, DType::F32),
            46_080,
            "SmolLM2-135M: 2 · 30 layers · 3 heads · 64 · 4 bytes"
        );
    }

    /// Random allocations, forks (shared blocks, copied on write), prefix registrations and adoptions, parking
    /// (a table moved out), drops, evictions and resets, over many seeds: the pool's bookkeeping holds after every
    /// operation, no block is freed twice (the pool asserts it) or leaked, and everything comes back at the end.
    #[test]
    fn random_block_operations_never_leak_or_free_twice() {
        use rand::{Rng, SeedableRng};
        for seed in 0..64u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let cache = cache(rng.random_range(3..24));
            let pool = cache.pool();
            let root = BlockHash::root("meow", rng.random_range(1..3), None, None);
            let mut tables: Vec<(SequenceBlocks, Vec<u32>)> = Vec::new();
            let mut parked: Vec<SequenceBlocks> = Vec::new();
            for _ in 0..200 {
                match rng.random_range(0..8) {
                    0 => {
                        // A new sequence, taking what the cache holds of its tokens (a shared prefix of few tokens).
                        let tokens: Vec<u32> = (0..rng.random_range(1..80)).map(|_| rng.random_range(0..2)).collect();
                        let chain = BlockHash::chain(root, &tokens, BLOCK_SIZE);
                        let max = (tokens.len() - 1) / BLOCK_SIZE;
                        let table = match pool.adopt(&chain, max) {
                            Ok(found) if !found.is_empty() => SequenceBlocks::with_prefix(pool, root, found, &chain),
                            _ => SequenceBlocks::new(pool, Some(root)),
                        };
                        tables.push((table, tokens));
                    }
                    1 | 2 if !tables.is_empty() => {
                        // Writes some of its tokens (registering the blocks they fill) or one more.
                        let index = rng.random_range(0..tables.len());
                        let (table, tokens) = &mut tables[index];
                        let count = if table.len() < tokens.len() { tokens.len() - table.len() } else { 1 };
                        let count = rng.random_range(1..=count);
                        if cache.reserve(table, count).is_ok() {
                            table.advance(count);
                            while tokens.len() < table.len() + 1 {
                                tokens.push(rng.random_range(0..2));
                            }
                            table.register_full_blocks(tokens);
                        }
                    }
                    3 if !tables.is_empty() => {
                        let index = rng.random_range(0..tables.len());
                        let fork = (tables[index].0.fork(), tables[index].1.clone());
                        tables.push(fork);
                    }
                    4 if !tables.is_empty() => {
                        let (mut table, _) = tables.swap_remove(rng.random_range(0..tables.len()));
                        parked.push(table.take());
                    }
                    5 if !tables.is_empty() => drop(tables.swap_remove(rng.random_range(0..tables.len()))),
                    6 if !parked.is_empty() => drop(parked.swap_remove(rng.random_range(0..parked.len()))),
                    7 => {
                        pool.reset_prefix_cache();
                    }
                    _ => {}
                }
                pool.check();
                let usage = pool.usage();
                assert!(usage.used + usage.cached <= usage.total, "seed {seed}: {usage:?}");
            }
            drop((tables, parked));
            pool.check();
            let usage = pool.usage();
            assert_eq!(usage.used, 0, "seed {seed}: every reference given back");
            pool.reset_prefix_cache();
            assert_eq!(pool.available(), usage.total, "seed {seed}: every block free again");
        }
    }
}
