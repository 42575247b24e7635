//! The block pool: which blocks of the KV cache are free, which are referenced and how often, and which hold a
//! known prefix (prefix caching). It owns no keys or values (those live in [`super::KvCache`]'s storage); it only
//! hands out block ids and takes them back.
//!
//! A block is in exactly one of these states:
//! - **free**: nobody references it and it names no prefix; allocated first (last freed, first reused, so that the
//!   pages in use stay few);
//! - **referenced**: by `refs ≥ 1` sequence tables (a request's `num_samples` sequences share their prompt's
//!   blocks; a parked sequence keeps its own; prefix hits share blocks across requests);
//! - **cached**: nobody references it, but it holds a computed prefix, registered under its [`BlockHash`]; a
//!   request with that prefix takes it back. Cached blocks are evicted least recently freed first, when no free
//!   block is left.
//!
//! A referenced block may also be registered: *computed* once its keys and values are all written, *pending* while
//! the prefill that allocated it is computing them (a request with the same prefix then waits for it rather than
//! computing it twice). A pending block whose last reference goes (its prefill was cancelled, failed or
//! preempted) is forgotten, not cached.
//!
//! The pool is shared (behind a mutex) by the step thread, which allocates, and by whoever drops a sequence's
//! blocks — a parked sequence's handle is dropped wherever its caller drops it — and read by the metrics. Block 0
//! is never handed out: it stays zero, for the padding of gathered attention on devices.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::hash::BlockHash;

/// A block's index in the pool (and in the storage, `block_size` slots from `id · block_size`).
pub(crate) type BlockId = u32;

/// What [`BlockPool::probe`] found of a chain of block hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Probe {
    /// Leading blocks cached and computed.
    pub(crate) hits: usize,
    /// Whether the block after them is being computed by another prefill.
    pub(crate) pending: bool,
}

/// Counters of the cache's use since the engine started (vLLM's metrics).
#[derive(Debug, Default)]
pub(crate) struct KvCounters {
    /// Prompt tokens looked up in the prefix cache.
    pub(crate) prefix_queries: AtomicU64,
    /// Of those, tokens whose keys and values were found.
    pub(crate) prefix_hits: AtomicU64,
    /// Sequences preempted (their blocks freed, recomputed later) because the pool was full.
    pub(crate) preemptions: AtomicU64,
    /// Prompt positions computed by prefill chunks (prefix hits not included).
    pub(crate) prefilled_tokens: AtomicU64,
}

/// A snapshot of the pool's blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolUsage {
    /// Blocks that can be handed out (block 0 excluded).
    pub(crate) total: usize,
    /// Blocks referenced by some sequence.
    pub(crate) used: usize,
    /// Unreferenced blocks holding a cached prefix.
    pub(crate) cached: usize,
}

/// The block pool of one engine; clones share it.
#[derive(Clone)]
pub(crate) struct BlockPool {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<PoolState>,
    counters: KvCounters,
    block_size: usize,
    prefix_caching: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct BlockMeta {
    refs: u32,
    /// The prefix it is registered under, and whether its keys and values are all written.
    registered: Option<(BlockHash, bool)>,
    /// Its place in the eviction order while cached (0: not cached).
    freed_at: u64,
}

struct PoolState {
    blocks: Vec<BlockMeta>,
    /// Free blocks, the last freed on top.
    free: Vec<BlockId>,
    registered: HashMap<BlockHash, BlockId>,
    /// Cached blocks by the time they were freed: the first is evicted first.
    cached: BTreeMap<u64, BlockId>,
    clock: u64,
    used: usize,
}

impl BlockPool {
    /// A pool of `blocks` blocks of `block_size` positions (block 0 among them, never handed out). Without
    /// `prefix_caching`, no block is ever registered or found.
    pub(crate) fn new(blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        let blocks = blocks.max(1);
        let state = PoolState {
            blocks: vec![BlockMeta::default(); blocks],
            // Popped from the end: block 1 first.
            free: (1..blocks as BlockId).rev().collect(),
            registered: HashMap::new(),
            cached: BTreeMap::new(),
            clock: 0,
            used: 0,
        };
        let shared = Shared { state: Mutex::new(state), counters: KvCounters::default(), block_size, prefix_caching };
        Self { shared: Arc::new(shared) }
    }

    /// Positions per block.
    pub(crate) fn block_size(&self) -> usize {
        self.shared.block_size
    }

    /// The cache's counters.
    pub(crate) fn counters(&self) -> &KvCounters {
        &self.shared.counters
    }

    /// Adds `count` to one of the counters.
    pub(crate) fn count(counter: &AtomicU64, count: usize) {
        counter.fetch_add(count as u64, Ordering::Relaxed);
    }

    /// Whether `self` and `other` are the same pool.
    pub(crate) fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// The blocks in use, cached and in all.
    pub(crate) fn usage(&self) -> PoolUsage {
        let state = self.shared.state.lock();
        PoolUsage { total: state.blocks.len() - 1, used: state.used, cached: state.cached.len() }
    }

    /// Blocks [`BlockPool::allocate`] can hand out now: the free ones and the cached ones it would evict.
    pub(crate) fn available(&self) -> usize {
        let state = self.shared.state.lock();
        state.free.len() + state.cached.len()
    }

    /// `count` blocks, each referenced once, or `None` (and nothing taken) if fewer are available. Free blocks go
    /// first, then cached ones, least recently freed first (their prefixes are forgotten).
    pub(crate) fn allocate(&self, count: usize) -> Option<Vec<BlockId>> {
        let mut state = self.shared.state.lock();
        if state.free.len() + state.cached.len() < count {
            return None;
        }
        let ids = (0..count).map(|_| state.take_one()).collect();
        Some(ids)
    }

    /// References each of `ids` once more (they are referenced already).
    pub(crate) fn retain(&self, ids: &[BlockId]) {
        let mut state = self.shared.state.lock();
        for &id in ids {
            let meta = &mut state.blocks[id as usize];
            debug_assert!(meta.refs > 0, "block {id} retained while unreferenced");
            meta.refs += 1;
        }
    }

    /// Drops one reference to each of `ids`. A block left unreferenced is cached if it holds a computed prefix, and
    /// free otherwise.
    pub(crate) fn release(&self, ids: &[BlockId]) {
        if ids.is_empty() {
            return;
        }
        let mut state = self.shared.state.lock();
        for &id in ids {
            state.release_one(id);
        }
    }

    /// How many sequence tables reference block `id`.
    pub(crate) fn refs(&self, id: BlockId) -> u32 {
        self.shared.state.lock().blocks[id as usize].refs
    }

    /// How many leading blocks of `chain` are cached and computed, and whether the next one is pending. Takes
    /// nothing.
    pub(crate) fn probe(&self, chain: &[BlockHash]) -> Probe {
        if !self.shared.prefix_caching {
            return Probe { hits: 0, pending: false };
        }
        let state = self.shared.state.lock();
        let mut hits = 0;
        for hash in chain {
            match state.registered.get(hash).map(|&id| state.blocks[id as usize].registered) {
                Some(Some((_, true))) => hits += 1,
                Some(_) => return Probe { hits, pending: true },
                None => break,
            }
        }
        Probe { hits, pending: false }
    }

    /// References the leading blocks of `chain` that are cached and computed (at most `max` of them) and returns
    /// them, or `Err` with nothing referenced if the block after them is pending (another prefill computes it: the
    /// caller waits for it).
    pub(crate) fn adopt(&self, chain: &[BlockHash], max: usize) -> Result<Vec<BlockId>, Pending> {
        if !self.shared.prefix_caching {
            return Ok(Vec::new());
        }
        let mut state = self.shared.state.lock();
        let mut found = Vec::new();
        for hash in chain.iter().take(max) {
            let Some(&id) = state.registered.get(hash) else { break };
            if state.blocks[id as usize].registered.is_some_and(|(_, computed)| !computed) {
                return Err(Pending);
            }
            found.push(id);
        }
        for &id in &found {
            state.reference(id);
        }
        Ok(found)
    }

    /// Registers block `id` (referenced by the caller) under `hash`, `computed` or pending; false (and nothing done)
    /// if the hash names another block already, or the block is registered, or prefix caching is off.
    pub(crate) fn register(&self, id: BlockId, hash: BlockHash, computed: bool) -> bool {
        if !self.shared.prefix_caching {
            return false;
        }
        let mut state = self.shared.state.lock();
        if state.registered.contains_key(&hash) || state.blocks[id as usize].registered.is_some() {
            return false;
        }
        state.registered.insert(hash, id);
        state.blocks[id as usize].registered = Some((hash, computed));
        true
    }

    /// Marks pending block `id` computed: requests with its prefix may now take it.
    pub(crate) fn mark_computed(&self, id: BlockId) {
        let mut state = self.shared.state.lock();
        if let Some((_, computed)) = &mut state.blocks[id as usize].registered {
            *computed = true;
        }
    }

    /// Forgets every cached (unreferenced) prefix, making its blocks free; blocks in use keep theirs. Returns how
    /// many blocks were dropped.
    pub(crate) fn reset_prefix_cache(&self) -> usize {
        let mut state = self.shared.state.lock();
        let cached = std::mem::take(&mut state.cached);
        for &id in cached.values() {
            let meta = &mut state.blocks[id as usize];
            let (hash, _) = meta.registered.take().expect("a cached block is registered");
            meta.freed_at = 0;
            state.registered.remove(&hash);
            state.free.push(id);
        }
        cached.len()
    }

    /// Checks the pool's bookkeeping (for tests): every block in exactly one state, the counts right.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let state = self.shared.state.lock();
        let mut seen = vec![0u8; state.blocks.len()];
        for &id in &state.free {
            seen[id as usize] += 1;
            let meta = state.blocks[id as usize];
            assert!(meta.refs == 0 && meta.registered.is_none() && meta.freed_at == 0, "free block {id}: {meta:?}");
        }
        for (&at, &id) in &state.cached {
            seen[id as usize] += 1;
            let meta = state.blocks[id as usize];
            assert!(meta.refs == 0 && meta.freed_at == at, "cached block {id}: {meta:?}");
            assert!(matches!(meta.registered, Some((_, true))), "cached block {id} is computed: {meta:?}");
        }
        let used = state.blocks.iter().filter(|meta| meta.refs > 0).count();
        assert_eq!(used, state.used, "the count of blocks in use");
        for (id, meta) in state.blocks.iter().enumerate().skip(1) {
            assert_eq!(u32::from(seen[id]) + u32::from(meta.refs > 0), 1, "block {id} in one state: {meta:?}");
            if let Some((hash, _)) = meta.registered {
                assert_eq!(state.registered.get(&hash), Some(&(id as BlockId)), "block {id}'s registration");
            }
        }
        assert_eq!(seen[0], 0, "block 0 is never handed out");
        assert_eq!(state.blocks[0].refs, 0);
        assert_eq!(state.registered.len(), state.blocks.iter().filter(|meta| meta.registered.is_some()).count());
    }
}

/// The next block of a prefix is being computed by another prefill.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Pending;

impl PoolState {
    /// One block, referenced once: a free one, else the least recently freed cached one. There is one.
    fn take_one(&mut self) -> BlockId {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let (_, id) = self.cached.pop_first().expect("a block is available");
                let meta = &mut self.blocks[id as usize];
                let (hash, _) = meta.registered.take().expect("a cached block is registered");
                meta.freed_at = 0;
                self.registered.remove(&hash);
                id
            }
        };
        let meta = &mut self.blocks[id as usize];
        meta.refs = 1;
        self.used += 1;
        id
    }

    /// References `id` once more, taking it out of the cached ones if it was unreferenced.
    fn reference(&mut self, id: BlockId) {
        let meta = &mut self.blocks[id as usize];
        if meta.refs == 0 {
            self.cached.remove(&meta.freed_at);
            meta.freed_at = 0;
            self.used += 1;
        }
        meta.refs += 1;
    }

    fn release_one(&mut self, id: BlockId) {
        let meta = &mut self.blocks[id as usize];
        assert!(meta.refs > 0, "block {id} released more often than referenced");
        meta.refs -= 1;
        if meta.refs > 0 {
            return;
        }
        self.used -= 1;
        match meta.registered {
            Some((_, true)) => {
                self.clock += 1;
                meta.freed_at = self.clock;
                self.cached.insert(self.clock, id);
            }
            Some((hash, false)) => {
                meta.registered = None;
                self.registered.remove(&hash);
                self.free.push(id);
            }
            None => self.free.push(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(tokens: &[u32]) -> Vec<BlockHash> {
        BlockHash::chain(BlockHash::root("meow", 1, None, None), tokens, 4)
    }

    #[test]
    fn freed_prefixes_are_cached_found_again_and_evicted_least_recently_freed_first() {
        let pool = BlockPool::new(5, 4, true);
        let (first, second) = (chain(&[1, 2, 3, 4, 5, 6, 7, 8]), chain(&[9, 9, 9, 9]));
        let ids = pool.allocate(2).expect("two blocks");
        assert_eq!(ids, vec![1, 2], "the lowest blocks first");
        assert!(pool.register(ids[0], first[0], false) && pool.register(ids[1], first[1], false));
        assert_eq!(pool.probe(&first), Probe { hits: 0, pending: true }, "pending: others wait");
        assert_eq!(pool.adopt(&first, 2), Err(Pending));
        pool.mark_computed(ids[0]);
        pool.mark_computed(ids[1]);
        assert_eq!(pool.probe(&first), Probe { hits: 2, pending: false });
        let other = pool.allocate(1).expect("one more");
        assert!(pool.register(other[0], second[0], true));
        assert!(!pool.register(other[0], first[0], true), "a hash names one block");
        pool.release(&ids);
        pool.release(&other);
        assert_eq!(pool.usage(), PoolUsage { total: 4, used: 0, cached: 3 });
        pool.check();

        // The second sequence's block was freed last; the first's are evicted before it.
        assert_eq!(pool.adopt(&first, 1), Ok(vec![1]), "at most `max`");
        pool.release(&[1]);
        let taken = pool.allocate(3).expect("one free block and two evicted");
        assert_eq!(taken, vec![4, 2, 3], "the free block, then the least recently freed cached ones");
        assert_eq!(pool.probe(&first).hits, 1, "block 1 was freed again after them: still cached");
        assert_eq!(pool.probe(&second).hits, 0, "evicted");
        assert!(pool.allocate(2).is_none(), "only one block left: nothing is taken");
        assert_eq!(pool.available(), 1);
        pool.release(&taken);
        pool.check();
    }

    #[test]
    fn shared_blocks_live_until_their_last_reference_and_pending_ones_are_forgotten() {
        let pool = BlockPool::new(4, 4, true);
        let hashes = chain(&[1, 2, 3, 4]);
        let ids = pool.allocate(1).expect("block");
        assert!(pool.register(ids[0], hashes[0], false));
        pool.retain(&ids);
        assert_eq!(pool.refs(ids[0]), 2);
        pool.release(&ids);
        assert_eq!(pool.usage().used, 1, "one reference left");
        pool.release(&ids);
        assert_eq!(pool.probe(&hashes), Probe { hits: 0, pending: false }, "a pending block is forgotten");
        assert_eq!(pool.usage(), PoolUsage { total: 3, used: 0, cached: 0 });
        pool.check();
    }

    #[test]
    fn reset_drops_only_unreferenced_prefixes_and_a_disabled_cache_finds_nothing() {
        let pool = BlockPool::new(4, 4, true);
        let hashes = chain(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let ids = pool.allocate(2).expect("blocks");
        for (id, hash) in ids.iter().zip(&hashes) {
            assert!(pool.register(*id, *hash, true));
        }
        pool.release(&ids[1..]);
        assert_eq!(pool.reset_prefix_cache(), 1);
        assert_eq!(pool.probe(&hashes).hits, 1, "the referenced block keeps its prefix");
        pool.release(&ids[..1]);
        pool.check();

        let off = BlockPool::new(4, 4, false);
        let ids = off.allocate(1).expect("block");
        assert!(!off.register(ids[0], hashes[0], true));
        assert_eq!(off.probe(&hashes).hits, 0);
        off.release(&ids);
        assert_eq!(off.usage().cached, 0);
    }
}
