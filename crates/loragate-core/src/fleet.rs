//! The fleet's domain as the fronts see it: where each worker stands ([`WorkerState`]), snapshots of the membership
//! ([`FleetSnapshot`], [`WorkerSnapshot`]), the membership changes the `Fleet` service drives ([`FleetControl`], with
//! its errors), and the [`MetricsSource`] through which an engine adds its own series to `/metrics`.
//!
//! They live here, beside the [`Engine`](crate::Engine) trait, so that an engine crate (the fleet) implements them
//! without depending on a front, and the fronts consume them without depending on the engine.

use std::time::SystemTime;

use prometheus_client::registry::Registry;

/// Where a worker stands in a fleet. Only `Ready` workers get traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkerState {
    /// Being brought to the fleet's adapter set (loads what it lacks, unloads stale `NAME@V` copies).
    Joining,
    /// Serving.
    Ready,
    /// A health check, a stream or a catch-up failed; it gets nothing until it answers again (after its back-off,
    /// and its probation when it failed repeatedly) and has caught up.
    Unhealthy,
    /// Being removed: no new traffic; it leaves once its running requests finished.
    Draining,
}

impl WorkerState {
    /// Every state.
    pub const ALL: [Self; 4] = [Self::Joining, Self::Ready, Self::Unhealthy, Self::Draining];

    /// The lowercase name used in metrics labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Joining => "joining",
            Self::Ready => "ready",
            Self::Unhealthy => "unhealthy",
            Self::Draining => "draining",
        }
    }
}

/// One worker as `ListWorkers` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSnapshot {
    /// Its canonical address (`grpc://127.0.0.1:9001`, `vllm+http://gpu-1:8000`): the scheme names its protocol.
    pub address: String,
    /// Where it stands.
    pub state: WorkerState,
    /// Sequences the fleet runs on it now.
    pub in_flight: u32,
    /// The adapters loaded on it, by engine-side name (`NAME@VERSION`), sorted.
    pub adapters: Vec<String>,
    /// Why it last failed; empty if it never did.
    pub last_error: String,
    /// Failures in a row (health checks, streams, catch-ups) since it last proved stable.
    pub consecutive_failures: u32,
    /// When it is probed next, if a back-off delays its next health check; `None` while it is checked every
    /// health interval.
    pub next_probe: Option<SystemTime>,
}

/// A consistent snapshot of a fleet's membership.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetSnapshot {
    /// Grows on every membership change.
    pub epoch: u64,
    /// Every worker, in the order they joined.
    pub workers: Vec<WorkerSnapshot>,
}

/// What a membership change can fail with. Each front maps it to its transport in one place.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetControlError {
    /// A request field is invalid.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it (never a credential).
        reason: String,
    },
    /// No worker has that address.
    #[error("no worker {0} in the fleet")]
    UnknownWorker(String),
    /// A worker at that address (or one resolving to the same socket address) is in the fleet.
    #[error("{0}")]
    WorkerExists(String),
    /// The fleet holds as many workers as it may (`--max-workers`).
    #[error("the fleet already has {max} workers, its limit (--max-workers)")]
    TooManyWorkers {
        /// The limit.
        max: usize,
    },
    /// This server runs no fleet: its model runs in-process.
    #[error(
        "this server runs its model in-process and has no fleet; start it with `loragate serve --worker URL` to \
         front workers"
    )]
    NoFleet,
    /// The fleet cannot answer now (it is stopping).
    #[error("the fleet is not available: {0}")]
    Unavailable(String),
}

impl FleetControlError {
    /// What kind of failure this is (see [`CoreError::class`](crate::CoreError::class)).
    pub fn class(&self) -> crate::ErrorClass {
        use crate::ErrorClass;
        match self {
            Self::InvalidArgument { .. } => ErrorClass::Invalid,
            Self::UnknownWorker(_) => ErrorClass::NotFound,
            Self::WorkerExists(_) => ErrorClass::AlreadyExists,
            Self::TooManyWorkers { .. } => ErrorClass::Overloaded,
            Self::NoFleet => ErrorClass::Precondition,
            Self::Unavailable(_) => ErrorClass::Unavailable,
        }
    }
}

/// The membership of a fleet, as the `Fleet` service drives it. Implemented by the fleet engine.
#[async_trait::async_trait]
pub trait FleetControl: Send + Sync + 'static {
    /// A consistent snapshot of the workers and the epoch.
    fn snapshot(&self) -> FleetSnapshot;

    /// Adds the worker at `address` (JOINING until it is healthy and caught up).
    async fn add_worker(&self, address: &str) -> Result<(), FleetControlError>;

    /// Removes the worker at `address`; with `drain`, once its running requests finished.
    async fn remove_worker(&self, address: &str, drain: bool) -> Result<(), FleetControlError>;
}

/// More metrics for `/metrics` from outside the fronts (a fleet's per-worker metrics, the engine's KV cache):
/// registered once in the server's registry (under the `loragate` prefix, and under vLLM's names for those vLLM
/// has), and refreshed before every scrape.
pub trait MetricsSource: Send + Sync + 'static {
    /// Registers the metrics (give them a sub-registry prefix of their own).
    fn register(&self, registry: &mut Registry);

    /// Registers the metrics published under vLLM's names (`vllm:…`), in a registry without prefix whose series
    /// carry vLLM's `model_name` label. None by default.
    fn register_vllm(&self, registry: &mut Registry) {
        let _ = registry;
    }

    /// Brings state gauges up to date; called before every scrape. Must not block.
    fn refresh(&self);
}
