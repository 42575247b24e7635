//! `loragate.v1.Fleet`: the workers of a fleet, behind the core's [`FleetControl`] trait (the fleet engine implements
//! it). A server without a fleet serves the service too, answering `FAILED_PRECONDITION` saying why, so that
//! reflection never lists a service that only says `UNIMPLEMENTED`.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use loragate_core::{FleetControl, FleetControlError, WorkerState};
use loragate_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::status::status_from_fleet;

/// The `Fleet` service over a fleet, or over none (every call answers `FAILED_PRECONDITION`).
#[derive(Clone)]
pub struct FleetService {
    fleet: Option<Arc<dyn FleetControl>>,
}

impl FleetService {
    /// A service driving `fleet`; `None` for a server whose model runs in-process.
    pub fn new(fleet: Option<Arc<dyn FleetControl>>) -> Self {
        Self { fleet }
    }

    fn fleet(&self) -> Result<&Arc<dyn FleetControl>, Status> {
        self.fleet.as_ref().ok_or_else(|| status_from_fleet(FleetControlError::NoFleet))
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
        let snapshot = self.fleet()?.snapshot();
        let workers = snapshot
            .workers
            .into_iter()
            .map(|worker| pb::Worker {
                address: worker.address,
                state: wire_state(worker.state).into(),
                in_flight: worker.in_flight,
                adapters: worker.adapters,
                last_error: worker.last_error,
                consecutive_failures: worker.consecutive_failures,
                next_probe_unix_ms: worker.next_probe.map_or(0, |at| {
                    at.duration_since(UNIX_EPOCH)
                        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
                }),
            })
            .collect();
        Ok(Response::new(pb::ListWorkersResponse { epoch: snapshot.epoch, workers }))
    }

    async fn add_worker(
        &self,
        request: Request<pb::AddWorkerRequest>,
    ) -> Result<Response<pb::AddWorkerResponse>, Status> {
        self.fleet()?.add_worker(&request.get_ref().address).await.map_err(status_from_fleet)?;
        Ok(Response::new(pb::AddWorkerResponse {}))
    }

    async fn remove_worker(
        &self,
        request: Request<pb::RemoveWorkerRequest>,
    ) -> Result<Response<pb::RemoveWorkerResponse>, Status> {
        let request = request.into_inner();
        self.fleet()?.remove_worker(&request.address, request.drain).await.map_err(status_from_fleet)?;
        Ok(Response::new(pb::RemoveWorkerResponse {}))
    }
}
