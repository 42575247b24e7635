//! `loragate.v1.LoraControl`: pause/abort, resume, wait, load, unload and list, each on one adapter.

use loragate_core::{Action, AdapterKey, AdapterName, Coordinator, CoreError, parse_timeout_s};
use loragate_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::auth::caller_of;
use crate::convert::adapter_status;
use crate::status::status_from_core;

/// The `LoraControl` service over a coordinator.
#[derive(Clone)]
pub struct LoraControlService {
    coordinator: Coordinator,
}

impl LoraControlService {
    /// A service driving `coordinator`.
    pub fn new(coordinator: Coordinator) -> Self {
        Self { coordinator }
    }
}

impl LoraControlService {
    /// The adapter a request names, once its caller is known to be allowed `action` on it.
    fn authorized<T>(&self, request: &Request<T>, raw_name: &str, action: Action) -> Result<AdapterName, Status> {
        let name = AdapterName::parse(raw_name).map_err(status_from_core)?;
        let principal = caller_of(request, self.coordinator.auth())?;
        principal.authorize(action, &AdapterKey::Lora(name.clone())).map_err(status_from_core)?;
        Ok(name)
    }
}

fn answer<T>(result: Result<T, CoreError>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(status_from_core)
}

#[tonic::async_trait]
impl pb::lora_control_server::LoraControl for LoraControlService {
    async fn abort_lora_requests(
        &self,
        request: Request<pb::AbortLoraRequestsRequest>,
    ) -> Result<Response<pb::AbortLoraRequestsResponse>, Status> {
        let name = self.authorized(&request, &request.get_ref().lora_name, Action::Control)?;
        answer(self.coordinator.abort(&name).await.map(|report| {
            if !report.unacknowledged.is_empty() {
                tracing::warn!(adapter = %name, unacknowledged = ?report.unacknowledged, "abort acknowledgement timed out");
            }
            pb::AbortLoraRequestsResponse {
                aborted_count: u32::try_from(report.aborted.len()).unwrap_or(u32::MAX),
                aborted_request_ids: report.aborted.iter().map(ToString::to_string).collect(),
                unacknowledged_request_ids: report.unacknowledged.iter().map(ToString::to_string).collect(),
            }
        }))
    }

    async fn resume_lora_requests(
        &self,
        request: Request<pb::ResumeLoraRequestsRequest>,
    ) -> Result<Response<pb::ResumeLoraRequestsResponse>, Status> {
        let name = self.authorized(&request, &request.get_ref().lora_name, Action::Control)?;
        answer(self.coordinator.resume(&name).await.map(|was_paused| pb::ResumeLoraRequestsResponse { was_paused }))
    }

    async fn wait_lora_unpaused(
        &self,
        request: Request<pb::WaitLoraUnpausedRequest>,
    ) -> Result<Response<pb::WaitLoraUnpausedResponse>, Status> {
        let name = self.authorized(&request, &request.get_ref().lora_name, Action::Sample)?;
        let timeout = parse_timeout_s(request.get_ref().timeout_s).map_err(status_from_core)?;
        answer(
            self.coordinator.wait_unpaused(&name, timeout).await.map(|paused| pb::WaitLoraUnpausedResponse { paused }),
        )
    }

    async fn load_lora_adapter(
        &self,
        request: Request<pb::LoadLoraAdapterRequest>,
    ) -> Result<Response<pb::LoadLoraAdapterResponse>, Status> {
        let name = self.authorized(&request, &request.get_ref().lora_name, Action::Control)?;
        let loaded = self.coordinator.load_adapter_at(&name, &request.get_ref().path).await;
        if let Ok(version) = &loaded {
            tracing::info!(adapter = %name, %version, "adapter loaded");
        }
        answer(loaded.map(|version| pb::LoadLoraAdapterResponse { version: version.0 }))
    }

    async fn unload_lora_adapter(
        &self,
        request: Request<pb::UnloadLoraAdapterRequest>,
    ) -> Result<Response<pb::UnloadLoraAdapterResponse>, Status> {
        let name = self.authorized(&request, &request.get_ref().lora_name, Action::Control)?;
        answer(self.coordinator.unload_adapter(&name).await.map(|()| pb::UnloadLoraAdapterResponse {}))
    }

    async fn list_lora_adapters(
        &self,
        request: Request<pb::ListLoraAdaptersRequest>,
    ) -> Result<Response<pb::ListLoraAdaptersResponse>, Status> {
        let principal = caller_of(&request, self.coordinator.auth())?;
        let listed = self.coordinator.list_adapters().await.into_iter();
        // A tenant sees the adapters it may sample, not other tenants'.
        let adapters = listed.filter(|status| principal.may_see(&status.key)).map(adapter_status).collect();
        Ok(Response::new(pb::ListLoraAdaptersResponse { adapters }))
    }
}
