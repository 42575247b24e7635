//! Pushed adapter versions: the one `loragate.v1.LoraControl` RPC a worker serves, `PushLoraAdapter`, on the same
//! port, channel and admin key as `vllm.Control`. A fleet coordinator streams a version's files to its workers with it
//! (no shared filesystem): the header names the engine-side `NAME@V`, the bytes are received into the worker's own
//! adapter store while they are hashed and checked against the worker's model, and the version is then loaded under
//! that name, listed by `ListLoras` with the source path `push:SHA256`. The answer carries the SHA-256 the worker
//! computed, which the coordinator checks against what it pushed. A name the worker holds already is
//! `ALREADY_EXISTS` (as `LoadLora`); a push that fails or is cut off leaves nothing behind. Every other
//! `LoraControl` RPC is `UNIMPLEMENTED` on a worker (its control surface is `vllm.Control`).

use loragate_core::{AdapterName, Coordinator, CoreError, KvPolicy, PauseMode, PushHeader};
use loragate_proto::v1 as pb;
use tonic::{Request, Response, Status, Streaming};

use crate::error::WorkerError;
use crate::loras::LoraTable;

/// The source path `ListLoras` reports for a version pushed with `sha256`.
pub(crate) fn pushed_source_path(sha256: &str) -> String {
    format!("push:{sha256}")
}

/// The worker's `loragate.v1.LoraControl` service: `PushLoraAdapter` only.
pub(crate) struct PushService {
    coordinator: Coordinator,
    loras: LoraTable,
}

impl PushService {
    pub(crate) fn new(coordinator: Coordinator, loras: LoraTable) -> Self {
        Self { coordinator, loras }
    }

    /// Receives one push and loads it as its header's `NAME@V`; the receipt and the load run on a task of their own
    /// once the bytes are in, so a caller gone after the last byte leaves the table and the coordinator agreeing.
    async fn push(
        &self,
        mut parts: Streaming<pb::PushLoraAdapterRequest>,
    ) -> Result<pb::PushLoraAdapterResponse, Status> {
        let header = match parts.message().await?.and_then(|message| message.part) {
            Some(pb::push_lora_adapter_request::Part::Header(header)) => header,
            _ => return Err(WorkerError::invalid("header", "the first message of a push must be its header").into()),
        };
        let name = AdapterName::parse(&header.lora_name).map_err(core)?;
        let declared =
            PushHeader::parse(header.adapter_config_json.into_bytes(), &header.sha256, Some(header.total_bytes))
                .map_err(core)?;
        let reservation = self.loras.reserve_load(name.as_str())?;
        // Dropping the upload (an error, or the caller gone) removes what was received.
        let mut upload = self.coordinator.begin_versioned_push(&name, declared).await.map_err(core)?;
        while let Some(message) = parts.message().await? {
            match message.part {
                Some(pb::push_lora_adapter_request::Part::Chunk(chunk)) => upload.write(&chunk).await.map_err(core)?,
                Some(pb::push_lora_adapter_request::Part::Header(_)) => {
                    return Err(WorkerError::invalid("header", "a push has one header, in its first message").into());
                }
                None => {}
            }
        }
        let coordinator = self.coordinator.clone();
        let installed = tokio::spawn(async move {
            let swap = coordinator.finish_push(upload, PauseMode::Keep, KvPolicy::default(), None).await?;
            let sha256 = swap.installed.sha256.map(|sha| sha.to_string()).unwrap_or_default();
            tracing::info!(lora = %name, %sha256, "pushed LoRA adapter loaded");
            reservation.commit(pushed_source_path(&sha256));
            Ok::<_, CoreError>(pb::PushLoraAdapterResponse {
                version: swap.installed.version.0,
                sha256,
                ..Default::default()
            })
        });
        installed.await.unwrap_or(Err(CoreError::ShuttingDown)).map_err(core)
    }
}

/// A core error as the worker answers it.
fn core(err: CoreError) -> Status {
    WorkerError::from(err).into()
}

fn unimplemented<T>(rpc: &'static str) -> Result<Response<T>, Status> {
    Err(WorkerError::Unimplemented(rpc).into())
}

#[tonic::async_trait]
impl pb::lora_control_server::LoraControl for PushService {
    async fn abort_lora_requests(
        &self,
        _request: Request<pb::AbortLoraRequestsRequest>,
    ) -> Result<Response<pb::AbortLoraRequestsResponse>, Status> {
        unimplemented("AbortLoraRequests (use vllm.Control)")
    }

    async fn resume_lora_requests(
        &self,
        _request: Request<pb::ResumeLoraRequestsRequest>,
    ) -> Result<Response<pb::ResumeLoraRequestsResponse>, Status> {
        unimplemented("ResumeLoraRequests (use vllm.Control)")
    }

    async fn swap_lora_adapter(
        &self,
        _request: Request<pb::SwapLoraAdapterRequest>,
    ) -> Result<Response<pb::SwapLoraAdapterResponse>, Status> {
        unimplemented("SwapLoraAdapter (use vllm.Control)")
    }

    async fn wait_lora_unpaused(
        &self,
        _request: Request<pb::WaitLoraUnpausedRequest>,
    ) -> Result<Response<pb::WaitLoraUnpausedResponse>, Status> {
        unimplemented("WaitLoraUnpaused (use vllm.Control)")
    }

    async fn load_lora_adapter(
        &self,
        _request: Request<pb::LoadLoraAdapterRequest>,
    ) -> Result<Response<pb::LoadLoraAdapterResponse>, Status> {
        unimplemented("LoadLoraAdapter (use vllm.Control's LoadLora)")
    }

    async fn unload_lora_adapter(
        &self,
        _request: Request<pb::UnloadLoraAdapterRequest>,
    ) -> Result<Response<pb::UnloadLoraAdapterResponse>, Status> {
        unimplemented("UnloadLoraAdapter (use vllm.Control's UnloadLora)")
    }

    async fn list_lora_adapters(
        &self,
        _request: Request<pb::ListLoraAdaptersRequest>,
    ) -> Result<Response<pb::ListLoraAdaptersResponse>, Status> {
        unimplemented("ListLoraAdapters (use vllm.Control's ListLoras)")
    }

    async fn list_replicas(
        &self,
        _request: Request<pb::ListReplicasRequest>,
    ) -> Result<Response<pb::ListReplicasResponse>, Status> {
        unimplemented("ListReplicas")
    }

    async fn push_lora_adapter(
        &self,
        request: Request<Streaming<pb::PushLoraAdapterRequest>>,
    ) -> Result<Response<pb::PushLoraAdapterResponse>, Status> {
        self.push(request.into_inner()).await.map(Response::new)
    }

    async fn set_lora_staleness(
        &self,
        _request: Request<pb::SetLoraStalenessRequest>,
    ) -> Result<Response<pb::SetLoraStalenessResponse>, Status> {
        unimplemented("SetLoraStaleness")
    }
}
