//! The engine's metrics on `/metrics` ([`MetricsSource`]): the KV cache under vLLM's names — its use, the prefix
//! cache's queries and hits in tokens, preemptions, its configuration — present at zero from the start, and under
//! `loragate_engine_` the prompt positions prefilled (prefix hits left out). Read from the cache's own counters
//! before every scrape.

use std::sync::atomic::AtomicU64;

use loragate_core::MetricsSource;
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{CandleEngine, EngineFacts, KvCacheStats};

/// vLLM's `cache_config_info` labels this engine has.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheConfigLabels {
    block_size: String,
    num_gpu_blocks: String,
    enable_prefix_caching: String,
}

/// The terms of the fitted step cost.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepCostLabels {
    term: &'static str,
}

/// The metrics, set from the cache's counters at each scrape.
pub(super) struct KvCacheMetrics {
    usage: Gauge<f64, AtomicU64>,
    prefix_queries: Counter,
    prefix_hits: Counter,
    preemptions: Counter,
    prefilled_tokens: Counter,
    config: Family<CacheConfigLabels, Gauge>,
    step_cost: Family<StepCostLabels, Gauge<f64, AtomicU64>>,
    /// Serialises refreshes: counters are brought up to the cache's by their difference.
    refreshing: Mutex<()>,
}

impl KvCacheMetrics {
    /// The metrics of an engine started with `facts`.
    pub(super) fn new(facts: &EngineFacts) -> Self {
        let config: Family<CacheConfigLabels, Gauge> = Family::default();
        let labels = CacheConfigLabels {
            block_size: facts.block_size.to_string(),
            num_gpu_blocks: facts.kv_cache_blocks.to_string(),
            enable_prefix_caching: facts.prefix_caching.to_string(),
        };
        config.get_or_create(&labels).set(1);
        Self {
            usage: Gauge::default(),
            prefix_queries: Counter::default(),
            prefix_hits: Counter::default(),
            preemptions: Counter::default(),
            prefilled_tokens: Counter::default(),
            config,
            step_cost: Family::default(),
            refreshing: Mutex::new(()),
        }
    }

    /// Sets every metric from `stats` and the fitted step cost.
    pub(super) fn refresh(&self, stats: &KvCacheStats, cost: crate::StepCost) {
        let _serialised = self.refreshing.lock();
        for (term, seconds) in
            [("base", cost.base), ("decode_row", cost.per_decode_row), ("prefill_token", cost.per_prefill_token)]
        {
            self.step_cost.get_or_create(&StepCostLabels { term }).set(seconds);
        }
        self.usage.set(stats.usage());
        for (counter, total) in [
            (&self.prefix_queries, stats.prefix_cache_queries),
            (&self.prefix_hits, stats.prefix_cache_hits),
            (&self.preemptions, stats.preemptions),
            (&self.prefilled_tokens, stats.prefilled_tokens),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }
}

impl MetricsSource for CandleEngine {
    fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix("engine");
        registry.register(
            "prompt_tokens_prefilled",
            "Prompt positions computed by prefill (prefix cache hits left out; preempted sequences' recomputation in)",
            self.metrics.prefilled_tokens.clone(),
        );
        registry.register(
            "step_cost_seconds",
            "What an engine step costs, as the engine fits it to its timed steps: seconds per step (term=base), per \
             decode row and per prompt token; --max-step-slowdown sizes prompt chunks by it",
            self.metrics.step_cost.clone(),
        );
    }

    fn register_vllm(&self, registry: &mut Registry) {
        let metrics = &self.metrics;
        registry.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage: the fraction of its blocks in use (1 means 100 percent)",
            metrics.usage.clone(),
        );
        registry.register(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in prompt tokens looked up",
            metrics.prefix_queries.clone(),
        );
        registry.register(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in prompt tokens found",
            metrics.prefix_hits.clone(),
        );
        registry.register(
            "vllm:num_preemptions",
            "Sequences preempted because the KV cache was full (recomputed later)",
            metrics.preemptions.clone(),
        );
        registry.register(
            "vllm:cache_config_info",
            "Information of the KV cache's configuration",
            metrics.config.clone(),
        );
    }

    fn refresh(&self) {
        self.metrics.refresh(&self.kv_cache_stats(), self.step_cost());
    }
}
