//! `loragate.v1.LoraControl`: pause/abort, resume, wait, load, unload and list, each on one adapter, and the list of
//! replicas sharing the state.

use loragate_core::{
    Action, AdapterKey, AdapterName, Coordinator, CoreError, PauseId, PauseMode, PauseRequest, PushHeader,
    StalenessPolicy, parse_timeout_s,
};
use loragate_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::auth::caller_of;
use crate::convert::{adapter_status, kv_policy, pause_mode, sha256, staleness, wire_kv_policy};
use crate::grpc_timeout::client_deadline;
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

    /// The adapter a request names, once its caller is known to be allowed `action` on it.
    fn authorized<T>(&self, request: &Request<T>, raw_name: &str, action: Action) -> Result<AdapterName, Status> {
        let name = AdapterName::parse(raw_name).map_err(status_from_core)?;
        let principal = caller_of(request, self.coordinator.auth())?;
        principal.authorize(action, &AdapterKey::Lora(name.clone())).map_err(status_from_core)?;
        Ok(name)
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
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
        let deadline = client_deadline(request.metadata().as_ref());
        let name = self.authorized(&request, &request.get_ref().lora_name, Action::Control)?;
        let wire = request.into_inner();
        let mode = pause_mode(wire.mode, PauseMode::Abort).map_err(status_from_core)?;
        let kv_policy = kv_policy(wire.kv_policy).map_err(status_from_core)?;
        let pause = PauseRequest::parse(mode, &wire.owner, wire.lease_s).map_err(status_from_core)?;
        let pause = pause.with_kv_policy(kv_policy);
        answer(self.coordinator.pause(&name, pause, deadline).await.map(|report| pb::AbortLoraRequestsResponse {
            aborted_count: count(report.aborted.len()),
            aborted_request_ids: report.aborted.iter().map(ToString::to_string).collect(),
            unacknowledged_request_ids: report.unacknowledged.iter().map(ToString::to_string).collect(),
            pause_id: report.pause_id.to_string(),
            kept_count: count(report.kept.len()),
            kv_policy: wire_kv_policy(report.kv_policy).into(),
        }))
    }

    async fn resume_lora_requests(
        &self,
        request: Request<pb::ResumeLoraRequestsRequest>,
    ) -> Result<Response<pb::ResumeLoraRequestsResponse>, Status> {
        let name = self.authorized(&request, &request.get_ref().lora_name, Action::Control)?;
        let pause_id = PauseId::parse(&request.get_ref().pause_id).map_err(status_from_core)?;
        answer(self.coordinator.resume(&name, pause_id).await.map(|report| pb::ResumeLoraRequestsResponse {
            was_paused: report.was_paused,
            still_paused: report.still_paused,
        }))
    }

    async fn swap_lora_adapter(
        &self,
        request: Request<pb::SwapLoraAdapterRequest>,
    ) -> Result<Response<pb::SwapLoraAdapterResponse>, Status> {
        let deadline = client_deadline(request.metadata().as_ref());
        let name = self.authorized(&request, &request.get_ref().lora_name, Action::Control)?;
        let caller = caller_of(&request, self.coordinator.auth())?;
        let wire = request.into_inner();
        let mode = pause_mode(wire.mode, PauseMode::Keep).map_err(status_from_core)?;
        let kv_policy = kv_policy(wire.kv_policy).map_err(status_from_core)?;
        self.coordinator.check_loadable_name(&name).map_err(status_from_core)?;
        let source = self.coordinator.resolve_adapter_path(&caller, &wire.path).await.map_err(status_from_core)?;
        let swapped = self.coordinator.swap_adapter(&name, source, mode, kv_policy, deadline).await;
        answer(swapped.map(|swap| pb::SwapLoraAdapterResponse {
            version: swap.installed.version.0,
            aborted_count: count(swap.aborted),
            kept_count: count(swap.kept),
            kv_policy: wire_kv_policy(swap.kv_policy).into(),
            sha256: sha256(&swap.installed),
        }))
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
        let caller = caller_of(&request, self.coordinator.auth())?;
        let loaded = self.coordinator.load_adapter_at(&caller, &name, &request.get_ref().path).await;
        answer(
            loaded.map(|version| pb::LoadLoraAdapterResponse { version: version.version.0, sha256: sha256(&version) }),
        )
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

    async fn list_replicas(
        &self,
        request: Request<pb::ListReplicasRequest>,
    ) -> Result<Response<pb::ListReplicasResponse>, Status> {
        // The replicas' addresses describe the deployment, not any adapter: the admin key's (replicas fetch pushed
        // versions from each other with it), not a tenant's.
        caller_of(&request, self.coordinator.auth())?.may(Action::Admin).map_err(status_from_core)?;
        answer(self.coordinator.replicas().await.map(|replicas| {
            pb::ListReplicasResponse {
                replicas: replicas
                    .into_iter()
                    .map(|replica| pb::Replica {
                        id: replica.id,
                        grpc_addr: replica.grpc_addr,
                        http_addr: replica.http_addr,
                        self_: replica.this_replica,
                    })
                    .collect(),
            }
        }))
    }

    async fn push_lora_adapter(
        &self,
        request: Request<tonic::Streaming<pb::PushLoraAdapterRequest>>,
    ) -> Result<Response<pb::PushLoraAdapterResponse>, Status> {
        let deadline = client_deadline(request.metadata().as_ref());
        let principal = caller_of(&request, self.coordinator.auth())?;
        let mut parts = request.into_inner();
        let header = match parts.message().await?.and_then(|message| message.part) {
            Some(pb::push_lora_adapter_request::Part::Header(header)) => header,
            _ => return Err(Status::invalid_argument("the first message of a push must be its header")),
        };
        let name = AdapterName::parse(&header.lora_name).map_err(status_from_core)?;
        principal.authorize(Action::Control, &AdapterKey::Lora(name.clone())).map_err(status_from_core)?;
        let mode = pause_mode(header.mode, PauseMode::Keep).map_err(status_from_core)?;
        let kv = kv_policy(header.kv_policy).map_err(status_from_core)?;
        let declared =
            PushHeader::parse(header.adapter_config_json.into_bytes(), &header.sha256, Some(header.total_bytes))
                .map_err(status_from_core)?;
        // Dropping the upload (an error, or the client gone) removes what was received.
        let mut upload = self.coordinator.begin_push(&name, declared).await.map_err(status_from_core)?;
        while let Some(message) = parts.message().await? {
            match message.part {
                Some(pb::push_lora_adapter_request::Part::Chunk(chunk)) => {
                    upload.write(&chunk).await.map_err(status_from_core)?;
                }
                Some(pb::push_lora_adapter_request::Part::Header(_)) => {
                    return Err(Status::invalid_argument("a push has one header, in its first message"));
                }
                None => {}
            }
        }
        let pushed = self.coordinator.finish_push(upload, mode, kv, deadline).await;
        answer(pushed.map(|swap| pb::PushLoraAdapterResponse {
            version: swap.installed.version.0,
            sha256: sha256(&swap.installed),
            aborted_count: count(swap.aborted),
            kept_count: count(swap.kept),
            kv_policy: wire_kv_policy(swap.kv_policy).into(),
        }))
    }

    async fn set_lora_staleness(
        &self,
        request: Request<pb::SetLoraStalenessRequest>,
    ) -> Result<Response<pb::SetLoraStalenessResponse>, Status> {
        let name = self.authorized(&request, &request.get_ref().lora_name, Action::Control)?;
        let wire = request.into_inner();
        let policy = StalenessPolicy::parse(wire.max_staleness, wire.batch_size).map_err(status_from_core)?;
        let set = self.coordinator.set_staleness(&name, policy).await;
        answer(set.map(|status| pb::SetLoraStalenessResponse { staleness: status.map(staleness) }))
    }
}
