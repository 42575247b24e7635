//! What the engine reports of itself: the facts of its start (the KV cache's size, how the weights are kept) and
//! the KV cache's use and counters, which the server's metrics publish under vLLM's names.

use std::sync::atomic::Ordering;

use crate::model::BlockPool;

/// What an engine runs with, fixed at its start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineFacts {
    /// Blocks of the KV cache that sequences can take (vLLM's `num_gpu_blocks`).
    pub kv_cache_blocks: usize,
    /// The KV cache's bytes (every block, the one kept zero included).
    pub kv_cache_bytes: u64,
    /// Positions per block.
    pub block_size: usize,
    /// Whether requests reuse cached prefixes.
    pub prefix_caching: bool,
    /// How the weights are held: their format and whether they are kept quantized (`"Q4_1 kept quantized"`,
    /// `"f32"`).
    pub weights: String,
}

/// The KV cache's use now, and its counters since the engine started.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvCacheStats {
    /// Positions per block.
    pub block_size: usize,
    /// Blocks sequences can take.
    pub blocks: usize,
    /// Blocks referenced by running, waiting-to-resume or parked sequences.
    pub used_blocks: usize,
    /// Unreferenced blocks that hold a cached prefix (taken back by a request with that prefix, else evicted
    /// least recently used first).
    pub cached_blocks: usize,
    /// Prompt tokens looked up in the prefix cache (vLLM's `prefix_cache_queries`).
    pub prefix_cache_queries: u64,
    /// Of those, tokens found (vLLM's `prefix_cache_hits`).
    pub prefix_cache_hits: u64,
    /// Sequences preempted because the cache was full (vLLM's `num_preemptions`).
    pub preemptions: u64,
    /// Prompt positions computed by prefill, prefix hits left out.
    pub prefilled_tokens: u64,
}

impl KvCacheStats {
    /// The fraction of the blocks in use (vLLM's `kv_cache_usage_perc`, a fraction in 0..=1 despite its name).
    pub fn usage(&self) -> f64 {
        if self.blocks == 0 { 0.0 } else { self.used_blocks as f64 / self.blocks as f64 }
    }

    pub(crate) fn of(pool: &BlockPool) -> Self {
        let usage = pool.usage();
        let counters = pool.counters();
        let read = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        Self {
            block_size: pool.block_size(),
            blocks: usage.total,
            used_blocks: usage.used,
            cached_blocks: usage.cached,
            prefix_cache_queries: read(&counters.prefix_queries),
            prefix_cache_hits: read(&counters.prefix_hits),
            preemptions: read(&counters.preemptions),
            prefilled_tokens: read(&counters.prefilled_tokens),
        }
    }
}
