//! The request metrics in vLLM's shape and under vLLM's names (`vllm:num_requests_running`, …), so that dashboards,
//! alerts and autoscalers written for vLLM read loragate unchanged; per adapter (label `adapter`, bounded as the
//! `loragate_*` series are), with the buckets vLLM uses.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::AdapterLabels;
use crate::contract::{AdapterKey, AdapterStatus, FinishReason};

/// Labels of `vllm:request_success_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FinishLabels {
    /// `stop`, `length` or `abort` ([`FinishReason::as_str`]).
    finished_reason: &'static str,
}

/// Labels of `vllm:lora_requests_info`, as vLLM writes them and the Kubernetes inference gateway's endpoint picker
/// reads them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoraInfoLabels {
    /// How many adapters the server holds at once (here: the adapters loaded).
    max_lora: String,
    /// The adapters requests run on now, comma-separated: every loaded adapter whose gate is open.
    running_lora_adapters: String,
    /// The adapters whose requests wait, comma-separated: every paused adapter (so that the picker prefers a
    /// replica where it is open).
    waiting_lora_adapters: String,
}

type TimestampGauge = Gauge<f64, AtomicU64>;

type HistogramFamily = Family<AdapterLabels, Histogram, fn() -> Histogram>;

/// vLLM's `time_to_first_token_seconds` buckets.
fn time_to_first_token_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
        160.0, 640.0, 2560.0,
    ])
}

/// vLLM's `inter_token_latency_seconds` buckets, with 1, 2.5 and 5 ms in front (a small model decodes that fast).
fn inter_token_latency_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0,
    ])
}

/// vLLM's `e2e_request_latency_seconds` buckets.
fn e2e_request_latency_histogram() -> Histogram {
    Histogram::new([
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
        1920.0, 7680.0,
    ])
}

/// The vLLM-shaped request metrics. Cheap to clone (every family shares its storage).
#[derive(Clone)]
pub(crate) struct RequestMetrics {
    running: Family<AdapterLabels, Gauge>,
    waiting: Family<AdapterLabels, Gauge>,
    time_to_first_token: HistogramFamily,
    inter_token_latency: HistogramFamily,
    e2e_request_latency: HistogramFamily,
    prompt_tokens: Family<AdapterLabels, Counter>,
    generation_tokens: Family<AdapterLabels, Counter>,
    success: Family<FinishLabels, Counter>,
    lora_info: Family<LoraInfoLabels, TimestampGauge>,
    /// `--max-loras`, reported as `max_lora` when set (else the number of adapters loaded).
    max_loras: Arc<std::sync::OnceLock<usize>>,
    totals: Arc<TokenTotals>,
}

/// Tokens over every adapter since the start (for the periodic stats line).
#[derive(Debug, Default)]
struct TokenTotals {
    prompt: AtomicU64,
    generation: AtomicU64,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        Self {
            running: Family::default(),
            waiting: Family::default(),
            time_to_first_token: HistogramFamily::new_with_constructor(
                time_to_first_token_histogram as fn() -> Histogram,
            ),
            inter_token_latency: HistogramFamily::new_with_constructor(
                inter_token_latency_histogram as fn() -> Histogram,
            ),
            e2e_request_latency: HistogramFamily::new_with_constructor(
                e2e_request_latency_histogram as fn() -> Histogram,
            ),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            success: Family::default(),
            lora_info: Family::default(),
            max_loras: Arc::default(),
            totals: Arc::default(),
        }
    }
}

impl RequestMetrics {
    /// Registers the metrics in `registry` under vLLM's names (give it no prefix).
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register("vllm:num_requests_running", "Admitted requests producing tokens", self.running.clone());
        registry.register(
            "vllm:num_requests_waiting",
            "Requests not producing tokens yet or for now: held at the gate, kept by a pause, or admitted and queued \
             or prefilling",
            self.waiting.clone(),
        );
        registry.register_with_unit(
            "vllm:time_to_first_token",
            "From a request's arrival (gate hold included) to its first token",
            Unit::Seconds,
            self.time_to_first_token.clone(),
        );
        registry.register_with_unit(
            "vllm:inter_token_latency",
            "Between consecutive tokens of a sequence (a pause that kept it included)",
            Unit::Seconds,
            self.inter_token_latency.clone(),
        );
        registry.register_with_unit(
            "vllm:e2e_request_latency",
            "From a request's arrival (gate hold included) to its end (finished or aborted)",
            Unit::Seconds,
            self.e2e_request_latency.clone(),
        );
        registry.register("vllm:prompt_tokens", "Prompt tokens of admitted requests", self.prompt_tokens.clone());
        registry.register("vllm:generation_tokens", "Tokens generated", self.generation_tokens.clone());
        for reason in [FinishReason::Stop, FinishReason::Length, FinishReason::Abort] {
            drop(self.success.get_or_create(&FinishLabels { finished_reason: reason.as_str() }));
        }
        registry.register(
            "vllm:request_success",
            "Sequences ended, by finish reason (an aborted one counts as abort each time it is handed back)",
            self.success.clone(),
        );
        registry.register(
            "vllm:lora_requests_info",
            "The adapters served: running (open) and waiting (paused); the value is the unix time of the scrape",
            self.lora_info.clone(),
        );
    }

    /// Counts a sequence that ended with `reason`.
    pub(crate) fn record_finish(&self, reason: FinishReason) {
        self.success.get_or_create(&FinishLabels { finished_reason: reason.as_str() }).inc();
    }

    /// Creates every series of `labels` at zero, so that a new adapter's series exist before its first request.
    pub(crate) fn start_series(&self, labels: &AdapterLabels) {
        for gauge in [&self.running, &self.waiting] {
            drop(gauge.get_or_create(labels));
        }
        for histogram in [&self.time_to_first_token, &self.inter_token_latency, &self.e2e_request_latency] {
            drop(histogram.get_or_create(labels));
        }
        for counter in [&self.prompt_tokens, &self.generation_tokens] {
            drop(counter.get_or_create(labels));
        }
    }

    /// Reports `max_loras` (`--max-loras`) as `vllm:lora_requests_info`'s `max_lora` (set once, at start).
    pub(crate) fn set_max_loras(&self, max_loras: usize) {
        let _ = self.max_loras.set(max_loras);
    }

    /// Sets `vllm:lora_requests_info` from a snapshot of every adapter: one series, valued now (unix seconds).
    fn set_lora_info(&self, statuses: &[AdapterStatus]) {
        let mut running = Vec::new();
        let mut waiting = Vec::new();
        for status in statuses {
            let AdapterKey::Lora(name) = &status.key else { continue };
            if status.paused { waiting.push(name.as_str()) } else { running.push(name.as_str()) }
        }
        running.sort_unstable();
        waiting.sort_unstable();
        let labels = LoraInfoLabels {
            max_lora: self.max_loras.get().copied().unwrap_or(running.len() + waiting.len()).to_string(),
            running_lora_adapters: running.join(","),
            waiting_lora_adapters: waiting.join(","),
        };
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |since| since.as_secs_f64());
        self.lora_info.clear();
        self.lora_info.get_or_create(&labels).set(now);
    }

    /// Sets the gauges from a snapshot of every adapter.
    pub(crate) fn set_gauges(&self, statuses: &[AdapterStatus]) {
        self.set_lora_info(statuses);
        for gauge in [&self.running, &self.waiting] {
            gauge.clear();
        }
        for status in statuses {
            let labels = AdapterLabels::of(&status.key);
            let queued = status.in_flight.saturating_sub(status.running);
            let waiting = status.held.saturating_add(status.kept).saturating_add(queued);
            self.running.get_or_create(&labels).set(i64::from(status.running));
            self.waiting.get_or_create(&labels).set(i64::from(waiting));
        }
    }

    pub(crate) fn record_prompt(&self, labels: &AdapterLabels, tokens: usize) {
        self.prompt_tokens.get_or_create(labels).inc_by(tokens as u64);
        self.totals.prompt.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    pub(crate) fn record_generated(&self, labels: &AdapterLabels, tokens: usize) {
        self.generation_tokens.get_or_create(labels).inc_by(tokens as u64);
        self.totals.generation.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    pub(crate) fn record_first_token(&self, labels: &AdapterLabels, after: Duration) {
        self.time_to_first_token.get_or_create(labels).observe(after.as_secs_f64());
    }

    /// Records `tokens` tokens of one sequence that came `gap` after its previous ones (each the share of the gap).
    pub(crate) fn record_inter_token(&self, labels: &AdapterLabels, gap: Duration, tokens: usize) {
        if tokens == 0 {
            return;
        }
        let histogram = self.inter_token_latency.get_or_create(labels);
        let each = gap.as_secs_f64() / tokens as f64;
        for _ in 0..tokens {
            histogram.observe(each);
        }
    }

    pub(crate) fn record_end(&self, labels: &AdapterLabels, after: Duration) {
        self.e2e_request_latency.get_or_create(labels).observe(after.as_secs_f64());
    }

    /// Prompt and generated tokens over every adapter since the start.
    pub(crate) fn token_totals(&self) -> (u64, u64) {
        (self.totals.prompt.load(Ordering::Relaxed), self.totals.generation.load(Ordering::Relaxed))
    }

    /// Removes every series of `labels`.
    pub(crate) fn forget(&self, labels: &AdapterLabels) {
        for gauge in [&self.running, &self.waiting] {
            gauge.remove(labels);
        }
        for histogram in [&self.time_to_first_token, &self.inter_token_latency, &self.e2e_request_latency] {
            histogram.remove(labels);
        }
        for counter in [&self.prompt_tokens, &self.generation_tokens] {
            counter.remove(labels);
        }
    }
}
