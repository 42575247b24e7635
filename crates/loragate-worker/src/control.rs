//! `vllm.Control`: discovery, `Abort`, the LoRA lifecycle and the engine-wide pause, with vLLM's semantics, each a
//! call on the coordinator: `Abort` aborts by request id, `PauseGeneration` is the coordinator's global pause in its
//! mode, `LoadLora` a load (a loaded name is `ALREADY_EXISTS`, past `--max-loras` `RESOURCE_EXHAUSTED`), `UnloadLora`
//! an unload (which frees the adapter's weights). `Shutdown` stops the worker only if it was started with
//! `--enable-shutdown-rpc`. Weight transfer, sleep and KV-event RPCs answer `UNIMPLEMENTED` (a loragate worker swaps
//! adapters, not base weights, and keeps no KV cache between requests).

use std::sync::Arc;

use loragate_core::{AdapterName, Coordinator, CoreError, KvPolicy, PauseMode, Principal, RequestId};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use vllm_proto as pb;

use crate::error::WorkerError;
use crate::loras::{LoraRecord, LoraTable};

/// What `GetServerInfo` and `GetModelInfo` report, and whether `Shutdown` is allowed.
pub(crate) struct ServerFacts {
    pub(crate) served_model_name: Arc<str>,
    pub(crate) instance_id: String,
    pub(crate) max_running_requests: u64,
    pub(crate) supports_lora: bool,
    pub(crate) shutdown_rpc: bool,
}

/// The `vllm.Control` service of a worker.
pub(crate) struct ControlService {
    coordinator: Coordinator,
    loras: LoraTable,
    facts: ServerFacts,
    shutdown: CancellationToken,
}

impl ControlService {
    pub(crate) fn new(
        coordinator: Coordinator,
        loras: LoraTable,
        facts: ServerFacts,
        shutdown: CancellationToken,
    ) -> Self {
        Self { coordinator, loras, facts, shutdown }
    }

    /// Loads `request.lora_name` from `request.source_path`. The load and its record run on a task of their own, so
    /// a caller that goes away midway leaves the table and the coordinator agreeing.
    async fn load(&self, request: pb::LoadLoraRequest) -> Result<LoraRecord, WorkerError> {
        let name = AdapterName::parse(&request.lora_name)?;
        if !self.facts.supports_lora {
            return Err(WorkerError::LoraDisabled);
        }
        if request.source_path.is_empty() {
            return Err(WorkerError::invalid("source_path", "is required"));
        }
        let reservation = self.loras.reserve_load(name.as_str())?;
        let coordinator = self.coordinator.clone();
        let loaded = tokio::spawn(async move {
            // `vllm.Control` needs the admin key (`RequireKey`), which may load from anywhere under the root.
            coordinator.load_adapter_at(&Principal::Admin, &name, &request.source_path).await?;
            tracing::info!(lora = %name, path = %request.source_path, "LoRA adapter loaded");
            Ok::<_, WorkerError>(reservation.commit(request.source_path))
        });
        loaded.await.unwrap_or(Err(WorkerError::Core(CoreError::ShuttingDown)))
    }

    /// Unloads `lora_name` (its weights are freed), on a task of its own like [`ControlService::load`].
    async fn unload(&self, lora_name: &str) -> Result<LoraRecord, WorkerError> {
        if lora_name.trim().is_empty() {
            return Err(WorkerError::invalid("lora_name", "is required"));
        }
        let reservation = self.loras.reserve_unload(lora_name)?;
        let name = AdapterName::parse(lora_name)?;
        let coordinator = self.coordinator.clone();
        let unloaded = tokio::spawn(async move {
            coordinator.unload_adapter(&name).await?;
            tracing::info!(lora = %name, "LoRA adapter unloaded");
            Ok::<_, WorkerError>(reservation.commit())
        });
        unloaded.await.unwrap_or(Err(WorkerError::Core(CoreError::ShuttingDown)))
    }
}

fn adapter(record: LoraRecord) -> pb::LoraAdapter {
    pb::LoraAdapter { lora_id: record.lora_id, lora_name: record.lora_name, source_path: record.source_path }
}

fn unimplemented<T>(rpc: &'static str) -> Result<Response<T>, Status> {
    Err(WorkerError::Unimplemented(rpc).into())
}

#[tonic::async_trait]
impl pb::control_server::Control for ControlService {
    async fn get_server_info(
        &self,
        _request: Request<pb::GetServerInfoRequest>,
    ) -> Result<Response<pb::ServerInfo>, Status> {
        Ok(Response::new(pb::ServerInfo {
            engine_version: format!("loragate {}", env!("CARGO_PKG_VERSION")),
            api_version: "vllm".into(),
            instance_id: self.facts.instance_id.clone(),
            parallelism: Some(pb::ParallelismInfo {
                tensor_parallel_size: 1,
                pipeline_parallel_size: 1,
                data_parallel_size: 1,
                decode_context_parallel_size: 1,
                world_size: 1,
                data_parallel_size_local: 1,
                ..Default::default()
            }),
            max_model_len: self.coordinator.model_info().context_length,
            max_running_requests: self.facts.max_running_requests,
            rl_capabilities: Some(pb::RlCapabilities::default()),
            proto_version: vllm_proto::VERSION.into(),
            ..Default::default()
        }))
    }

    async fn get_model_info(
        &self,
        _request: Request<pb::GetModelInfoRequest>,
    ) -> Result<Response<pb::ModelInfo>, Status> {
        Ok(Response::new(pb::ModelInfo {
            model_id: self.facts.served_model_name.to_string(),
            served_model_name: self.facts.served_model_name.to_string(),
            supports_text_input: false,
            supports_token_ids_input: true,
            supports_lora: self.facts.supports_lora,
            ..Default::default()
        }))
    }

    async fn shutdown(&self, _request: Request<pb::ShutdownRequest>) -> Result<Response<pb::ShutdownResponse>, Status> {
        if !self.facts.shutdown_rpc {
            return Err(WorkerError::ShutdownDisabled.into());
        }
        tracing::info!("shutdown requested over vllm.Control");
        self.shutdown.cancel();
        Ok(Response::new(pb::ShutdownResponse {}))
    }

    async fn abort(&self, request: Request<pb::AbortRequest>) -> Result<Response<pb::AbortResponse>, Status> {
        let request_ids = request.into_inner().request_ids;
        // Ids that cannot name a request name none running (vLLM ignores unknown ids).
        let ids: Vec<RequestId> = request_ids
            .iter()
            .filter(|id| !id.is_empty())
            .filter_map(|id| RequestId::parse_or_generate(id).ok())
            .collect();
        if !ids.is_empty() {
            self.coordinator.abort_requests(&ids).await;
        }
        Ok(Response::new(pb::AbortResponse {}))
    }

    async fn load_lora(&self, request: Request<pb::LoadLoraRequest>) -> Result<Response<pb::LoadLoraResponse>, Status> {
        let record = self.load(request.into_inner()).await?;
        Ok(Response::new(pb::LoadLoraResponse { adapter: Some(adapter(record)) }))
    }

    async fn unload_lora(
        &self,
        request: Request<pb::UnloadLoraRequest>,
    ) -> Result<Response<pb::UnloadLoraResponse>, Status> {
        let record = self.unload(&request.into_inner().lora_name).await?;
        Ok(Response::new(pb::UnloadLoraResponse { adapter: Some(adapter(record)) }))
    }

    async fn list_loras(
        &self,
        _request: Request<pb::ListLorasRequest>,
    ) -> Result<Response<pb::ListLorasResponse>, Status> {
        let adapters = self.loras.loaded().into_iter().map(adapter).collect();
        Ok(Response::new(pb::ListLorasResponse { adapters }))
    }

    async fn get_kv_event_sources(
        &self,
        _request: Request<pb::GetKvEventSourcesRequest>,
    ) -> Result<Response<pb::GetKvEventSourcesResponse>, Status> {
        unimplemented("GetKvEventSources")
    }

    async fn pause_generation(
        &self,
        request: Request<pb::PauseGenerationRequest>,
    ) -> Result<Response<pb::PauseGenerationResponse>, Status> {
        let (mode, kv_policy) = match pb::PauseMode::try_from(request.into_inner().mode) {
            Ok(pb::PauseMode::Unspecified | pb::PauseMode::Abort) => (PauseMode::Abort, KvPolicy::Recompute),
            Ok(pb::PauseMode::Wait) => (PauseMode::Wait, KvPolicy::Recompute),
            // vLLM's keep freezes the running requests where they are, keys and values kept, until
            // `ResumeGeneration` (`clear_cache` clears only its prefix cache): the core's keep pause, each running
            // request stopped and continued on resume in the same stream, its keys and values kept where the
            // engine can park them (else recomputed).
            Ok(pb::PauseMode::Keep) => (PauseMode::Keep, KvPolicy::Reuse),
            Err(_) => return Err(WorkerError::invalid("mode", "is not a PauseMode").into()),
        };
        self.coordinator.pause_all(mode, kv_policy, None).await.map_err(WorkerError::from)?;
        Ok(Response::new(pb::PauseGenerationResponse {}))
    }

    async fn resume_generation(
        &self,
        _request: Request<pb::ResumeGenerationRequest>,
    ) -> Result<Response<pb::ResumeGenerationResponse>, Status> {
        self.coordinator.resume_all().await.map_err(WorkerError::from)?;
        Ok(Response::new(pb::ResumeGenerationResponse {}))
    }

    async fn is_paused(
        &self,
        _request: Request<pb::IsPausedRequest>,
    ) -> Result<Response<pb::IsPausedResponse>, Status> {
        let paused = self.coordinator.is_paused_globally().await.map_err(WorkerError::from)?;
        Ok(Response::new(pb::IsPausedResponse { paused }))
    }

    async fn sleep(&self, _request: Request<pb::SleepRequest>) -> Result<Response<pb::SleepResponse>, Status> {
        unimplemented("Sleep")
    }

    async fn wake_up(&self, _request: Request<pb::WakeUpRequest>) -> Result<Response<pb::WakeUpResponse>, Status> {
        unimplemented("WakeUp")
    }

    async fn is_sleeping(
        &self,
        _request: Request<pb::IsSleepingRequest>,
    ) -> Result<Response<pb::IsSleepingResponse>, Status> {
        unimplemented("IsSleeping")
    }

    async fn init_weight_transfer_engine(
        &self,
        _request: Request<pb::InitWeightTransferEngineRequest>,
    ) -> Result<Response<pb::InitWeightTransferEngineResponse>, Status> {
        unimplemented("InitWeightTransferEngine")
    }

    async fn start_weight_update(
        &self,
        _request: Request<pb::StartWeightUpdateRequest>,
    ) -> Result<Response<pb::StartWeightUpdateResponse>, Status> {
        unimplemented("StartWeightUpdate")
    }

    async fn start_draft_weight_update(
        &self,
        _request: Request<pb::StartDraftWeightUpdateRequest>,
    ) -> Result<Response<pb::StartDraftWeightUpdateResponse>, Status> {
        unimplemented("StartDraftWeightUpdate")
    }

    async fn update_weights(
        &self,
        _request: Request<pb::UpdateWeightsRequest>,
    ) -> Result<Response<pb::UpdateWeightsResponse>, Status> {
        unimplemented("UpdateWeights")
    }

    async fn finish_weight_update(
        &self,
        _request: Request<pb::FinishWeightUpdateRequest>,
    ) -> Result<Response<pb::FinishWeightUpdateResponse>, Status> {
        unimplemented("FinishWeightUpdate")
    }

    async fn update_weight_version(
        &self,
        _request: Request<pb::UpdateWeightVersionRequest>,
    ) -> Result<Response<pb::UpdateWeightVersionResponse>, Status> {
        unimplemented("UpdateWeightVersion")
    }

    async fn get_weight_version(
        &self,
        _request: Request<pb::GetWeightVersionRequest>,
    ) -> Result<Response<pb::GetWeightVersionResponse>, Status> {
        unimplemented("GetWeightVersion")
    }
}
