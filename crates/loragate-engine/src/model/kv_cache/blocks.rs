//! One sequence's block table: the blocks holding its keys and values, in position order, and the prefix chain
//! naming its full blocks. It holds one reference to each of its blocks and drops them when it is dropped (RAII):
//! a finished, cancelled, failed or preempted sequence, a parked one whose handle goes away, all give their blocks
//! back the same way, on whichever thread drops them.

use super::hash::BlockHash;
use super::pool::{BlockId, BlockPool};

/// A sequence's blocks: positions `0..len` hold keys and values, position `p` in slot `p % block_size` of block
/// `blocks[p / block_size]`.
pub(crate) struct SequenceBlocks {
    pool: BlockPool,
    blocks: Vec<BlockId>,
    len: usize,
    /// The root of the sequence's prefix chain (`None`: its blocks are never registered for reuse), and the hashes
    /// of its full blocks that are known.
    root: Option<BlockHash>,
    hashes: Vec<BlockHash>,
}

impl SequenceBlocks {
    /// An empty table whose full blocks will be named from `root` (`None`: never reused by other sequences).
    pub(crate) fn new(pool: &BlockPool, root: Option<BlockHash>) -> Self {
        Self { pool: pool.clone(), blocks: Vec::new(), len: 0, root, hashes: Vec::new() }
    }

    /// A table starting with `blocks`, already referenced for it, the full blocks of a cached prefix named by
    /// `hashes`.
    pub(crate) fn with_prefix(pool: &BlockPool, root: BlockHash, blocks: Vec<BlockId>, hashes: &[BlockHash]) -> Self {
        let len = blocks.len() * pool.block_size();
        Self { pool: pool.clone(), hashes: hashes[..blocks.len()].to_vec(), blocks, len, root: Some(root) }
    }

    /// Positions holding keys and values.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The blocks, in position order.
    pub(crate) fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Positions the blocks have room for.
    pub(crate) fn capacity(&self) -> usize {
        self.blocks.len() * self.pool.block_size()
    }

    /// The pool its blocks come from.
    pub(crate) fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The root of its prefix chain, if its blocks may be reused.
    pub(crate) fn root(&self) -> Option<BlockHash> {
        self.root
    }

    /// The global slot of each of the `count` positions after the last one held.
    pub(crate) fn next_slots(&self, count: usize) -> impl Iterator<Item = u32> + '_ {
        let block_size = self.pool.block_size();
        (self.len..self.len + count).map(move |position| {
            self.blocks[position / block_size] * block_size as u32 + (position % block_size) as u32
        })
    }

    /// Records `positions` more positions written (room for them was reserved).
    pub(crate) fn advance(&mut self, positions: usize) {
        debug_assert!(self.len + positions <= self.capacity(), "positions written beyond the reserved blocks");
        self.len += positions;
    }

    /// Another table sharing these blocks (each referenced once more), for another sequence continuing from the
    /// same keys and values.
    pub(crate) fn fork(&self) -> Self {
        self.pool.retain(&self.blocks);
        Self {
            pool: self.pool.clone(),
            blocks: self.blocks.clone(),
            len: self.len,
            root: self.root,
            hashes: self.hashes.clone(),
        }
    }

    /// Appends newly allocated `blocks` (referenced once each, for this table).
    pub(crate) fn push_blocks(&mut self, blocks: Vec<BlockId>) {
        self.blocks.extend(blocks);
    }

    /// Replaces the last block, shared with other sequences, by `copy`, which holds the same positions: the shared
    /// one loses this table's reference.
    pub(crate) fn replace_last(&mut self, copy: BlockId) {
        let last = self.blocks.last_mut().expect("a table with a shared last block");
        let shared = std::mem::replace(last, copy);
        self.pool.release(&[shared]);
    }

    /// Names the table's full blocks whose hashes are not known yet, from `tokens` (the sequence's tokens from
    /// position 0, at least up to the last full block), and registers each in the pool as computed: other sequences
    /// with this prefix may take them. Nothing happens without a root.
    pub(crate) fn register_full_blocks(&mut self, tokens: &[u32]) {
        let Some(root) = self.root else { return };
        let block_size = self.pool.block_size();
        let full = self.len / block_size;
        while self.hashes.len() < full {
            let index = self.hashes.len();
            let parent = self.hashes.last().copied().unwrap_or(root);
            let hash = parent.then(&tokens[index * block_size..(index + 1) * block_size]);
            self.pool.register(self.blocks[index], hash, true);
            self.hashes.push(hash);
        }
    }

    /// How many of its blocks are named.
    pub(crate) fn named_blocks(&self) -> usize {
        self.hashes.len()
    }

    /// Takes `hashes` (the chain of the blocks this table will fill, from the first not named yet) as the names of
    /// its blocks and registers each block among them that it holds as pending: a request with the same prefix
    /// waits for it instead of computing it again. Returns the blocks registered, with their indices.
    pub(crate) fn register_pending(&mut self, hashes: &[BlockHash]) -> Vec<(usize, BlockId)> {
        if self.root.is_none() {
            return Vec::new();
        }
        let mut registered = Vec::new();
        for &hash in hashes {
            let index = self.hashes.len();
            let Some(&id) = self.blocks.get(index) else { break };
            if self.pool.register(id, hash, false) {
                registered.push((index, id));
            }
            self.hashes.push(hash);
        }
        registered
    }

    /// Moves the blocks out into a new table (for a sequence that takes over a parked one's), leaving this one
    /// empty.
    pub(crate) fn take(&mut self) -> Self {
        let taken = Self {
            pool: self.pool.clone(),
            blocks: std::mem::take(&mut self.blocks),
            len: self.len,
            root: self.root,
            hashes: std::mem::take(&mut self.hashes),
        };
        self.len = 0;
        taken
    }

    /// Never registers its blocks for reuse from now on (its keys and values mix adapter versions).
    pub(crate) fn stop_registering(&mut self) {
        self.root = None;
    }
}

impl Drop for SequenceBlocks {
    fn drop(&mut self) {
        self.pool.release(&self.blocks);
    }
}

impl std::fmt::Debug for SequenceBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SequenceBlocks").field("blocks", &self.blocks).field("len", &self.len).finish()
    }
}
