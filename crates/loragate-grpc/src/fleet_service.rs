//! `loragate.v1.Fleet`: the workers of a fleet, behind the [`FleetControl`] trait. The trait lives here, where it is
//! consumed; the fleet crate implements it. A server without a fleet does not serve the service.

use std::sync::Arc;

use loragate_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::status::status_from_fleet;

/// Where a worker stands in the fleet. Only `Ready` workers get traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkerState {
    /// Being brought to the fleet's adapter set (loads what it lacks, unloads stale `NAME@V` copies).
    Joining,
    /// Serving.
    Ready,
    /// Its health check or a stream failed; it gets nothing until it answers again and has caught up.
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
    /// Its address exactly as given.
    pub address: String,
    /// Where it stands.
    pub state: WorkerState,
    /// Sequences the fleet runs on it now.
    pub in_flight: u32,
    /// The adapters loaded on it, by engine-side name (`NAME@VERSION`), sorted.
    pub adapters: Vec<String>,
    /// Why it last failed; empty if it never did.
    pub last_error: String,
}

/// A consistent snapshot of a fleet's membership.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetSnapshot {
    /// Grows on every membership change.
    pub epoch: u64,
    /// Every worker, in the order they joined.
    pub workers: Vec<WorkerSnapshot>,
}

/// What a membership change can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetControlError {
    /// A request field is invalid.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// No worker has that address.
    #[error("no worker {0} in the fleet")]
    UnknownWorker(String),
    /// A worker with that address is in the fleet.
    #[error("worker {0} is already in the fleet")]
    WorkerExists(String),
    /// The fleet cannot answer now (it is stopping).
    #[error("the fleet is not available: {0}")]
    Unavailable(String),
}

/// The membership of a fleet, as the `Fleet` service drives it.
#[tonic::async_trait]
pub trait FleetControl: Send + Sync + 'static {
    /// A consistent snapshot of the workers and the epoch.
    fn snapshot(&self) -> FleetSnapshot;

    /// Adds the worker at `address` (JOINING until it is healthy and caught up).
    async fn add_worker(&self, address: &str) -> Result<(), FleetControlError>;

    /// Removes the worker at `address`; with `drain`, once its running requests finished.
    async fn remove_worker(&self, address: &str, drain: bool) -> Result<(), FleetControlError>;
}

/// The `Fleet` service over a fleet.
#[derive(Clone)]
pub struct FleetService {
    fleet: Arc<dyn FleetControl>,
}

impl FleetService {
    /// A service driving `fleet`.
    pub fn new(fleet: Arc<dyn FleetControl>) -> Self {
        Self { fleet }
    }
}

fn wire_state(state: WorkerState) -> pb::WorkerState {
    match state {
        WorkerState::Joining => pb::WorkerState::Joining,
        WorkerState::Ready => pb::WorkerState::Ready,
        WorkerState::Unhealthy => pb::WorkerState::Unhealthy,
        WorkerState::Draining => pb::WorkerState::Draining,
    }
}

#[tonic::async_trait]
impl pb::fleet_server::Fleet for FleetService {
    async fn list_workers(
        &self,
        _request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        let snapshot = self.fleet.snapshot();
        let workers = snapshot
            .workers
            .into_iter()
            .map(|worker| pb::Worker {
                address: worker.address,
                state: wire_state(worker.state).into(),
                in_flight: worker.in_flight,
                adapters: worker.adapters,
                last_error: worker.last_error,
            })
            .collect();
        Ok(Response::new(pb::ListWorkersResponse { epoch: snapshot.epoch, workers }))
    }

    async fn add_worker(
        &self,
        request: Request<pb::AddWorkerRequest>,
    ) -> Result<Response<pb::AddWorkerResponse>, Status> {
        self.fleet.add_worker(&request.get_ref().address).await.map_err(status_from_fleet)?;
        Ok(Response::new(pb::AddWorkerResponse {}))
    }

    async fn remove_worker(
        &self,
        request: Request<pb::RemoveWorkerRequest>,
    ) -> Result<Response<pb::RemoveWorkerResponse>, Status> {
        let request = request.into_inner();
        self.fleet.remove_worker(&request.address, request.drain).await.map_err(status_from_fleet)?;
        Ok(Response::new(pb::RemoveWorkerResponse {}))
    }
}
