//! The coordinator's Prometheus metrics, per adapter (label `adapter`; the base model is `adapter=""`, as on the
//! wire): its own under the `loragate_` prefix ([`CoreMetrics::register`]) and the request metrics in vLLM's shape
//! under vLLM's names ([`CoreMetrics::register_vllm`]). Events are recorded where they happen (the gate, aborts, the
//! sample stream); the state gauges are set from a snapshot when metrics are scraped
//! ([`CoreMetrics::set_adapter_gauges`]). Every series of an adapter exists, at zero, from the moment it is served
//! (the base model's from the start) until it is unloaded. Every coordinator owns its own metrics; nothing is
//! global, so several servers can run in one process (tests do).

mod requests;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use self::requests::RequestMetrics;
use crate::contract::{AdapterKey, AdapterStatus, AdapterVersion, Limit};

/// Labels of per-adapter metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdapterLabels {
    /// The adapter's name; empty for the base model.
    pub adapter: String,
}

impl AdapterLabels {
    /// The labels of `key`.
    pub fn of(key: &AdapterKey) -> Self {
        Self { adapter: key.as_wire_str().to_owned() }
    }
}

/// Labels of per-version metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdapterVersionLabels {
    /// The adapter's name; empty for the base model.
    pub adapter: String,
    /// The adapter version.
    pub version: u64,
}

/// Labels of the overload counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    /// The limit's label ([`Limit::label`]).
    limit: &'static str,
}

/// Labels of the per-front counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FrontLabels {
    /// The front (`grpc`, `http`).
    front: &'static str,
}

type HistogramFamily = Family<AdapterLabels, Histogram, fn() -> Histogram>;

/// Durations from 1 ms to about 9 minutes.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

/// The coordinator's metrics. Cheap to clone (every family shares its storage).
#[derive(Clone)]
pub struct CoreMetrics {
    pauses: Family<AdapterLabels, Counter>,
    pause_duration: HistogramFamily,
    aborted_requests: Family<AdapterLabels, Counter>,
    kept_requests: Family<AdapterLabels, Counter>,
    lease_expiries: Family<AdapterLabels, Counter>,
    abort_acknowledgement: HistogramFamily,
    gate_hold: HistogramFamily,
    gate_hold_expired: Family<AdapterLabels, Counter>,
    generated_tokens: Family<AdapterVersionLabels, Counter>,
    overloaded: Family<LimitLabels, Counter>,
    body_read_timeouts: Family<FrontLabels, Counter>,
    paused: Family<AdapterLabels, Gauge>,
    in_flight: Family<AdapterLabels, Gauge>,
    held: Family<AdapterLabels, Gauge>,
    waiting: Family<AdapterLabels, Gauge>,
    kept: Family<AdapterLabels, Gauge>,
    version: Family<AdapterLabels, Gauge>,
    /// The request metrics in vLLM's shape.
    requests: RequestMetrics,
    /// The versions that have a `generated_tokens` series, per adapter, so that old versions and unloaded
    /// adapters can be removed (families cannot be listed).
    token_versions: Arc<Mutex<HashMap<String, BTreeSet<u64>>>>,
}

impl Default for CoreMetrics {
    fn default() -> Self {
        let histograms = || HistogramFamily::new_with_constructor(seconds_histogram as fn() -> Histogram);
        Self {
            pauses: Family::default(),
            pause_duration: histograms(),
            aborted_requests: Family::default(),
            kept_requests: Family::default(),
            lease_expiries: Family::default(),
            abort_acknowledgement: histograms(),
            gate_hold: histograms(),
            gate_hold_expired: Family::default(),
            generated_tokens: Family::default(),
            overloaded: Family::default(),
            body_read_timeouts: Family::default(),
            paused: Family::default(),
            in_flight: Family::default(),
            held: Family::default(),
            waiting: Family::default(),
            kept: Family::default(),
            version: Family::default(),
            requests: RequestMetrics::default(),
            token_versions: Arc::default(),
        }
    }
}

impl CoreMetrics {
    /// Registers every metric in `registry` (give it the `loragate` prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register("pauses", "Times the adapter's gate was closed by a pause", self.pauses.clone());
        registry.register_with_unit(
            "pause_duration",
            "How long the adapter's gate stayed closed, observed when it reopens",
            Unit::Seconds,
            self.pause_duration.clone(),
        );
        registry.register(
            "aborted_requests",
            "Requests handed back with FINISH_REASON_ABORT by an abort",
            self.aborted_requests.clone(),
        );
        registry.register(
            "kept_requests",
            "Requests stopped in the engine by a keep-mode pause, to be continued by the core",
            self.kept_requests.clone(),
        );
        registry.register(
            "pause_lease_expiries",
            "Pauses that ended because their lease ran out (no resume came)",
            self.lease_expiries.clone(),
        );
        registry.register_with_unit(
            "abort_acknowledgement",
            "From an abort to the hand-back of every request it cancelled",
            Unit::Seconds,
            self.abort_acknowledgement.clone(),
        );
        registry.register_with_unit(
            "gate_hold",
            "How long sampling requests were held at a closed gate",
            Unit::Seconds,
            self.gate_hold.clone(),
        );
        registry.register(
            "gate_hold_expired",
            "Sampling requests that gave up at a closed gate (UNAVAILABLE / 503)",
            self.gate_hold_expired.clone(),
        );
        registry.register(
            "generated_tokens",
            "Tokens generated, by adapter version (the two newest versions of each loaded adapter are kept)",
            self.generated_tokens.clone(),
        );
        // Every counter is present from the start, at zero (dashboards and alerts see a series before its event).
        for limit in [Limit::InFlight, Limit::Held, Limit::InFlightPerAdapter, Limit::HeldPerAdapter] {
            drop(self.overloaded.get_or_create(&LimitLabels { limit: limit.label() }));
        }
        for front in ["grpc", "http"] {
            drop(self.body_read_timeouts.get_or_create(&FrontLabels { front }));
        }
        registry.register(
            "overloaded",
            "Sampling requests refused because a limit was reached (RESOURCE_EXHAUSTED / 429), by limit",
            self.overloaded.clone(),
        );
        registry.register(
            "request_body_timeouts",
            "Requests whose body did not arrive within the gate deadline (--gate-max-wait), by front",
            self.body_read_timeouts.clone(),
        );
        registry.register("paused", "1 while the adapter's gate is closed", self.paused.clone());
        registry.register("in_flight", "Admitted requests, queued or running", self.in_flight.clone());
        registry.register("held", "Sampling requests held at the adapter's gate", self.held.clone());
        registry.register("waiting", "WaitLoraUnpaused callers", self.waiting.clone());
        registry.register("kept", "Requests kept by a pause, waiting to continue", self.kept.clone());
        registry.register("version", "The adapter's current weights version", self.version.clone());
    }

    /// Registers the request metrics in vLLM's shape under vLLM's names (`vllm:num_requests_running`, …) in
    /// `registry`, which must have no prefix.
    pub fn register_vllm(&self, registry: &mut Registry) {
        self.requests.register(registry);
    }

    /// Prompt tokens of admitted requests and tokens generated, over every adapter, since the start.
    pub fn token_totals(&self) -> (u64, u64) {
        self.requests.token_totals()
    }

    /// Creates every per-adapter series of `labels` at zero (the adapter is now served).
    pub(crate) fn start_series(&self, labels: &AdapterLabels) {
        for counter in
            [&self.pauses, &self.aborted_requests, &self.kept_requests, &self.lease_expiries, &self.gate_hold_expired]
        {
            drop(counter.get_or_create(labels));
        }
        for histogram in [&self.pause_duration, &self.abort_acknowledgement, &self.gate_hold] {
            drop(histogram.get_or_create(labels));
        }
        self.requests.start_series(labels);
    }

    /// The request metrics in vLLM's shape.
    pub(crate) fn requests(&self) -> &RequestMetrics {
        &self.requests
    }

    /// Reports `--max-loras` as `vllm:lora_requests_info`'s `max_lora` (set once, at start).
    pub(crate) fn set_max_loras(&self, max_loras: usize) {
        self.requests.set_max_loras(max_loras);
    }

    /// Sets the state gauges from a snapshot of every adapter (adapters no longer listed disappear).
    pub fn set_adapter_gauges(&self, statuses: &[AdapterStatus]) {
        self.requests.set_gauges(statuses);
        for gauges in [&self.paused, &self.in_flight, &self.held, &self.waiting, &self.kept, &self.version] {
            gauges.clear();
        }
        for status in statuses {
            let labels = AdapterLabels::of(&status.key);
            self.paused.get_or_create(&labels).set(i64::from(status.paused));
            self.in_flight.get_or_create(&labels).set(i64::from(status.in_flight));
            self.held.get_or_create(&labels).set(i64::from(status.held));
            self.waiting.get_or_create(&labels).set(i64::from(status.waiting));
            self.kept.get_or_create(&labels).set(i64::from(status.kept));
            self.version.get_or_create(&labels).set(i64::try_from(status.version.0).unwrap_or(i64::MAX));
        }
    }

    /// Tokens generated so far by `adapter` at `version` (0 once the series was dropped as too old).
    pub fn generated_tokens(&self, adapter: &AdapterKey, version: AdapterVersion) -> u64 {
        let labels = AdapterVersionLabels { adapter: adapter.as_wire_str().to_owned(), version: version.0 };
        self.generated_tokens.get(&labels).map_or(0, |counter| counter.get())
    }

    pub(crate) fn record_pause(&self, labels: &AdapterLabels) {
        self.pauses.get_or_create(labels).inc();
    }

    pub(crate) fn record_reopen(&self, labels: &AdapterLabels, paused_for: std::time::Duration) {
        self.pause_duration.get_or_create(labels).observe(paused_for.as_secs_f64());
    }

    /// Records a pause's hand-backs: `aborted` handed back aborted, `kept` kept, all within `acknowledged_in`.
    pub(crate) fn record_abort(
        &self,
        labels: &AdapterLabels,
        aborted: usize,
        kept: usize,
        acknowledged_in: std::time::Duration,
    ) {
        self.aborted_requests.get_or_create(labels).inc_by(aborted as u64);
        self.kept_requests.get_or_create(labels).inc_by(kept as u64);
        self.abort_acknowledgement.get_or_create(labels).observe(acknowledged_in.as_secs_f64());
    }

    pub(crate) fn record_lease_expiry(&self, labels: &AdapterLabels) {
        self.lease_expiries.get_or_create(labels).inc();
    }

    pub(crate) fn record_gate_hold(&self, labels: &AdapterLabels, held_for: std::time::Duration, expired: bool) {
        self.gate_hold.get_or_create(labels).observe(held_for.as_secs_f64());
        if expired {
            self.gate_hold_expired.get_or_create(labels).inc();
        }
    }

    /// Counts a request whose body did not arrive in time on `front` (`grpc`, `http`).
    pub fn record_body_read_timeout(&self, front: &'static str) {
        self.body_read_timeouts.get_or_create(&FrontLabels { front }).inc();
    }

    /// Requests on `front` whose body did not arrive in time, so far.
    pub fn body_read_timeouts(&self, front: &'static str) -> u64 {
        self.body_read_timeouts.get(&FrontLabels { front }).map_or(0, |counter| counter.get())
    }

    pub(crate) fn record_overload(&self, limit: Limit) {
        self.overloaded.get_or_create(&LimitLabels { limit: limit.label() }).inc();
    }

    pub(crate) fn record_tokens(&self, labels: &AdapterLabels, version: AdapterVersion, count: usize) {
        self.requests.record_generated(labels, count);
        let labels = AdapterVersionLabels { adapter: labels.adapter.clone(), version: version.0 };
        if let Some(counter) = self.generated_tokens.get(&labels) {
            counter.inc_by(count as u64);
            return;
        }
        self.token_versions.lock().entry(labels.adapter.clone()).or_default().insert(version.0);
        self.generated_tokens.get_or_create(&labels).inc_by(count as u64);
    }

    /// Keeps the per-version series bounded: once `current` is installed, only it and the version before it keep
    /// their series (tokens of older versions still running recreate theirs until the next install).
    pub(crate) fn forget_old_versions(&self, labels: &AdapterLabels, current: AdapterVersion) {
        let mut token_versions = self.token_versions.lock();
        let Some(versions) = token_versions.get_mut(&labels.adapter) else { return };
        let keep_from = current.0.saturating_sub(1);
        let stale: Vec<u64> = versions.range(..keep_from).copied().collect();
        for version in stale {
            versions.remove(&version);
            self.generated_tokens.remove(&AdapterVersionLabels { adapter: labels.adapter.clone(), version });
        }
    }

    /// Removes every series of `adapter` (it was unloaded), so that names loaded and unloaded over time do not
    /// accumulate.
    pub(crate) fn forget_adapter(&self, adapter: &AdapterKey) {
        let labels = AdapterLabels::of(adapter);
        // Every per-adapter family (a test fails if one is missing: an unloaded adapter's series must all go).
        for counter in
            [&self.pauses, &self.aborted_requests, &self.kept_requests, &self.lease_expiries, &self.gate_hold_expired]
        {
            counter.remove(&labels);
        }
        for histogram in [&self.pause_duration, &self.abort_acknowledgement, &self.gate_hold] {
            histogram.remove(&labels);
        }
        for gauge in [&self.paused, &self.in_flight, &self.held, &self.waiting, &self.kept, &self.version] {
            gauge.remove(&labels);
        }
        self.requests.forget(&labels);
        let versions = self.token_versions.lock().remove(&labels.adapter).unwrap_or_default();
        for version in versions {
            self.generated_tokens.remove(&AdapterVersionLabels { adapter: labels.adapter.clone(), version });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::AdapterName;

    fn exposition(metrics: &CoreMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(registry.sub_registry_with_prefix("loragate"));
        metrics.register_vllm(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        text
    }

    #[test]
    fn recorded_events_and_gauges_appear_under_the_loragate_prefix() {
        let metrics = CoreMetrics::default();
        let meow = AdapterLabels::of(&AdapterKey::Lora(AdapterName::parse("meow").expect("name")));
        metrics.record_pause(&meow);
        metrics.record_abort(&meow, 3, 2, std::time::Duration::from_millis(2));
        metrics.record_lease_expiry(&meow);
        metrics.record_tokens(&meow, AdapterVersion(1), 5);
        let key = AdapterKey::Lora(AdapterName::parse("meow").expect("name"));
        assert_eq!(metrics.generated_tokens(&key, AdapterVersion(1)), 5);
        assert_eq!(metrics.generated_tokens(&key, AdapterVersion(2)), 0);
        metrics.set_adapter_gauges(&[AdapterStatus {
            key: AdapterKey::Lora(AdapterName::parse("meow").expect("name")),
            version: AdapterVersion(1),
            paused: true,
            in_flight: 2,
            running: 1,
            held: 1,
            waiting: 4,
            kept: 2,
            pauses: Vec::new(),
            weights_error: None,
            versions: Vec::new(),
            staleness: None,
        }]);
        let text = exposition(&metrics);
        for line in [
            "loragate_pauses_total{adapter=\"meow\"} 1",
            "loragate_aborted_requests_total{adapter=\"meow\"} 3",
            "loragate_generated_tokens_total{adapter=\"meow\",version=\"1\"} 5",
            "loragate_paused{adapter=\"meow\"} 1",
            "loragate_in_flight{adapter=\"meow\"} 2",
            "loragate_held{adapter=\"meow\"} 1",
            "loragate_waiting{adapter=\"meow\"} 4",
            "loragate_kept{adapter=\"meow\"} 2",
            "loragate_kept_requests_total{adapter=\"meow\"} 2",
            "loragate_pause_lease_expiries_total{adapter=\"meow\"} 1",
            "vllm:generation_tokens_total{adapter=\"meow\"} 5",
            "vllm:num_requests_running{adapter=\"meow\"} 1",
            // Held 1, kept 2, and 1 of the 2 admitted not producing yet.
            "vllm:num_requests_waiting{adapter=\"meow\"} 4",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(text.contains("loragate_abort_acknowledgement_seconds_count{adapter=\"meow\"} 1"), "{text}");
    }

    #[test]
    fn every_series_of_a_served_adapter_is_there_at_zero_before_its_first_request() {
        let metrics = CoreMetrics::default();
        metrics.start_series(&AdapterLabels::of(&AdapterKey::Base));
        let text = exposition(&metrics);
        for line in [
            "vllm:num_requests_running{adapter=\"\"} 0",
            "vllm:num_requests_waiting{adapter=\"\"} 0",
            "vllm:prompt_tokens_total{adapter=\"\"} 0",
            "vllm:generation_tokens_total{adapter=\"\"} 0",
            "vllm:time_to_first_token_seconds_count{adapter=\"\"} 0",
            "vllm:inter_token_latency_seconds_count{adapter=\"\"} 0",
            "vllm:e2e_request_latency_seconds_count{adapter=\"\"} 0",
            "loragate_pauses_total{adapter=\"\"} 0",
            "loragate_aborted_requests_total{adapter=\"\"} 0",
            "loragate_gate_hold_seconds_count{adapter=\"\"} 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn request_latencies_land_in_vllms_histograms() {
        let metrics = CoreMetrics::default();
        let meow = AdapterLabels { adapter: "meow".into() };
        let requests = metrics.requests();
        requests.record_prompt(&meow, 7);
        requests.record_first_token(&meow, std::time::Duration::from_millis(30));
        // Two tokens 8 ms after the previous ones: two gaps of 4 ms.
        requests.record_inter_token(&meow, std::time::Duration::from_millis(8), 2);
        requests.record_end(&meow, std::time::Duration::from_millis(700));
        metrics.record_tokens(&meow, AdapterVersion(1), 3);
        assert_eq!(metrics.token_totals(), (7, 3));
        let text = exposition(&metrics);
        for line in [
            "vllm:prompt_tokens_total{adapter=\"meow\"} 7",
            "vllm:generation_tokens_total{adapter=\"meow\"} 3",
            "vllm:time_to_first_token_seconds_bucket{le=\"0.04\",adapter=\"meow\"} 1",
            "vllm:time_to_first_token_seconds_bucket{le=\"0.02\",adapter=\"meow\"} 0",
            "vllm:inter_token_latency_seconds_count{adapter=\"meow\"} 2",
            "vllm:inter_token_latency_seconds_bucket{le=\"0.005\",adapter=\"meow\"} 2",
            "vllm:inter_token_latency_seconds_bucket{le=\"0.0025\",adapter=\"meow\"} 0",
            "vllm:e2e_request_latency_seconds_bucket{le=\"0.8\",adapter=\"meow\"} 1",
            "vllm:e2e_request_latency_seconds_bucket{le=\"0.5\",adapter=\"meow\"} 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn per_version_series_stay_bounded() {
        let metrics = CoreMetrics::default();
        let meow = AdapterLabels { adapter: "meow".into() };
        for version in 1..=10 {
            metrics.record_tokens(&meow, AdapterVersion(version), 1);
            metrics.forget_old_versions(&meow, AdapterVersion(version));
        }
        let text = exposition(&metrics);
        assert!(text.contains("version=\"10\"") && text.contains("version=\"9\""), "{text}");
        assert!(!text.contains("version=\"8\""), "{text}");

        // Versions with gaps (failed loads) and stragglers of old versions stay bounded too.
        for version in [13, 17, 18, 25] {
            metrics.record_tokens(&meow, AdapterVersion(version), 1);
            metrics.record_tokens(&meow, AdapterVersion(version - 3), 1);
            metrics.forget_old_versions(&meow, AdapterVersion(version));
        }
        let series = exposition(&metrics).matches("loragate_generated_tokens_total{").count();
        assert!(series <= 3, "{}", exposition(&metrics));
    }

    #[tokio::test]
    async fn adapters_loaded_and_unloaded_over_time_leave_no_series_behind() {
        use crate::coordinator::CoordinatorConfig;
        use crate::sampling::RawSampleRequest;
        use crate::testing::{ScriptedEngine, coordinator_with_adapters};

        let coordinator = coordinator_with_adapters(ScriptedEngine::new(3), CoordinatorConfig::default(), &[]).await;
        let mut sizes = Vec::new();
        for round in 0..60 {
            let name = AdapterName::parse(&format!("tenant-{round}")).expect("name");
            let source = crate::adapter_source::AdapterSource::trusted(format!("/a/{name}"));
            coordinator.load_adapter(&name, source.clone()).await.expect("load");
            coordinator.load_adapter(&name, source).await.expect("swap");
            let raw = RawSampleRequest {
                lora_name: name.to_string(),
                prompt_token_ids: vec![1],
                max_tokens: Some(2),
                ..Default::default()
            };
            let request = coordinator.parse_sample(raw).expect("valid");
            let stream = coordinator.sample(request, coordinator.gate_deadline(None)).await.expect("admitted");
            stream.collect_output().await.expect("sampled");
            coordinator.abort(&name).await.expect("pause");
            let keep = crate::contract::PauseRequest::parse(crate::contract::PauseMode::Keep, "trainer", 60.0)
                .expect("a keep pause with a lease");
            coordinator.pause(&name, keep, None).await.expect("pause in keep mode");
            coordinator.resume(&name, None).await.expect("resume");
            coordinator.unload_adapter(&name).await.expect("unload");
            coordinator.metrics().set_adapter_gauges(&coordinator.statuses().await);
            // Series, not bytes: counters' values grow a digit now and then.
            sizes.push(exposition(coordinator.metrics()).lines().count());
        }
        let text = exposition(coordinator.metrics());
        assert!(!text.contains("tenant-"), "an unloaded adapter's series remain:\n{text}");
        assert_eq!(sizes.first(), sizes.last(), "the exposition gains series with every adapter ever loaded");
    }
}
