//! The fleet's Prometheus metrics, per worker (label `worker`, its canonical address: never a credential), under
//! `loragate_fleet_`: events are counted where they happen (dispatch, tokens, failures, aborts, stages); the state,
//! in-flight and failure gauges and the epoch are set from the membership snapshot before every scrape. A worker's
//! series go when it leaves the fleet, so membership churn cannot grow them without bound. Nothing is global: every
//! fleet owns its metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::address::WorkerAddress;
use crate::membership::Roster;

/// Labels of per-worker metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WorkerLabels {
    /// The worker's canonical address.
    worker: String,
}

/// Labels of the per-worker state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerStateLabels {
    worker: String,
    state: &'static str,
}

/// Labels of adapter stagings.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    outcome: &'static str,
}

/// The fleet's metrics. Cheap to clone (every family shares its storage).
#[derive(Clone, Default)]
pub struct FleetMetrics {
    sequences: Family<WorkerLabels, Counter>,
    tokens: Family<WorkerLabels, Counter>,
    sequence_failures: Family<WorkerLabels, Counter>,
    health_check_failures: Family<WorkerLabels, Counter>,
    abort_calls: Family<WorkerLabels, Counter>,
    aborted_sequences: Family<WorkerLabels, Counter>,
    in_flight: Family<WorkerLabels, Gauge>,
    consecutive_failures: Family<WorkerLabels, Gauge>,
    state: Family<WorkerStateLabels, Gauge>,
    epoch: Gauge,
    stages: Family<StageLabels, Counter>,
}

impl FleetMetrics {
    /// Registers the metrics in `registry` (give it the `fleet` prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register("worker_sequences", "Sequences dispatched to each worker", self.sequences.clone());
        registry.register("worker_tokens", "Tokens received from each worker", self.tokens.clone());
        registry.register(
            "worker_sequence_failures",
            "Sequences ended by their worker failing (handed back as aborted with their tokens)",
            self.sequence_failures.clone(),
        );
        registry.register(
            "worker_health_check_failures",
            "Failed health checks of each worker",
            self.health_check_failures.clone(),
        );
        registry.register(
            "worker_abort_calls",
            "Batched abort calls to each worker (gRPC Abort, /inference/v1/abort_requests, /abort_request)",
            self.abort_calls.clone(),
        );
        registry.register(
            "worker_aborted_sequences",
            "Sequences whose abort was sent to each worker",
            self.aborted_sequences.clone(),
        );
        registry.register("worker_in_flight", "Sequences running on each worker now", self.in_flight.clone());
        registry.register(
            "worker_consecutive_failures",
            "Failures in a row of each worker (health checks, streams, catch-ups)",
            self.consecutive_failures.clone(),
        );
        registry.register("worker_state", "1 for each worker's current state, 0 for the others", self.state.clone());
        registry.register("epoch", "The membership epoch", self.epoch.clone());
        registry.register("adapter_stages", "Adapter versions staged on the fleet, by outcome", self.stages.clone());
    }

    /// The counters of one worker.
    pub(crate) fn worker(&self, address: &WorkerAddress) -> WorkerCounters {
        let labels = WorkerLabels { worker: address.to_string() };
        WorkerCounters {
            sequences: self.sequences.get_or_create(&labels).clone(),
            tokens: self.tokens.get_or_create(&labels).clone(),
            sequence_failures: self.sequence_failures.get_or_create(&labels).clone(),
            health_check_failures: self.health_check_failures.get_or_create(&labels).clone(),
            abort_calls: self.abort_calls.get_or_create(&labels).clone(),
            aborted_sequences: self.aborted_sequences.get_or_create(&labels).clone(),
            labels,
        }
    }

    /// Drops the series of a worker that left the fleet.
    pub(crate) fn forget(&self, address: &WorkerAddress) {
        let labels = WorkerLabels { worker: address.to_string() };
        let families = [
            &self.sequences,
            &self.tokens,
            &self.sequence_failures,
            &self.health_check_failures,
            &self.abort_calls,
            &self.aborted_sequences,
        ];
        for family in families {
            family.remove(&labels);
        }
    }

    /// Counts one staging of an adapter version (`committed` or `rolled_back`).
    pub(crate) fn record_stage(&self, committed: bool) {
        let outcome = if committed { "committed" } else { "rolled_back" };
        self.stages.get_or_create(&StageLabels { outcome }).inc();
    }

    /// Sets the gauges from a membership snapshot (workers that left disappear from them).
    pub(crate) fn set_gauges(&self, roster: &Roster) {
        self.in_flight.clear();
        self.consecutive_failures.clear();
        self.state.clear();
        self.epoch.set(i64::try_from(roster.epoch).unwrap_or(i64::MAX));
        for worker in &roster.workers {
            let worker_name = worker.link.address().to_string();
            let in_flight = i64::from(worker.link.in_flight());
            let labels = WorkerLabels { worker: worker_name.clone() };
            self.in_flight.get_or_create(&labels).set(in_flight);
            self.consecutive_failures.get_or_create(&labels).set(i64::from(worker.failures.consecutive_failures()));
            for state in loragate_core::WorkerState::ALL {
                let labels = WorkerStateLabels { worker: worker_name.clone(), state: state.as_str() };
                self.state.get_or_create(&labels).set(i64::from(worker.state == state));
            }
        }
    }
}

/// One worker's counters, bound to its label.
#[derive(Clone)]
pub(crate) struct WorkerCounters {
    labels: WorkerLabels,
    sequences: Counter,
    tokens: Counter,
    sequence_failures: Counter,
    health_check_failures: Counter,
    abort_calls: Counter,
    aborted_sequences: Counter,
}

impl WorkerCounters {
    /// The worker's label value.
    pub(crate) fn worker(&self) -> &str {
        &self.labels.worker
    }

    pub(crate) fn record_sequence(&self) {
        self.sequences.inc();
    }

    pub(crate) fn record_tokens(&self, count: usize) {
        self.tokens.inc_by(count as u64);
    }

    pub(crate) fn record_sequence_failure(&self) {
        self.sequence_failures.inc();
    }

    pub(crate) fn record_health_check_failure(&self) {
        self.health_check_failures.inc();
    }

    pub(crate) fn record_abort_call(&self, sequences: usize) {
        self.abort_calls.inc();
        self.aborted_sequences.inc_by(sequences as u64);
    }
}
