//! `vllm.Control`: discovery, `Abort`, the LoRA lifecycle and the engine-wide pause, with vLLM's semantics.
//! Weight transfer, sleep and KV-event RPCs answer `UNIMPLEMENTED` (a loragate worker swaps adapters, not base
//! weights, and keeps no KV cache between requests).

use std::sync::Arc;

use loragate_core::Engine;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use vllm_proto as pb;

use crate::error::WorkerError;
use crate::state::{LoraRecord, PauseMode, WorkerHandle};

/// What `GetServerInfo` and `GetModelInfo` report.
pub(crate) struct ServerFacts {
    pub(crate) served_model_name: Arc<str>,
    pub(crate) instance_id: String,
    pub(crate) max_running_requests: u64,
    pub(crate) supports_lora: bool,
}

/// The `vllm.Control` service of a worker.
pub(crate) struct ControlService {
    engine: Arc<dyn Engine>,
    state: WorkerHandle,
    facts: ServerFacts,
    shutdown: CancellationToken,
}

impl ControlService {
    pub(crate) fn new(
        engine: Arc<dyn Engine>,
        state: WorkerHandle,
        facts: ServerFacts,
        shutdown: CancellationToken,
    ) -> Self {
        Self { engine, state, facts, shutdown }
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
            max_model_len: self.engine.model_info().context_length,
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
        tracing::info!("shutdown requested over vllm.Control");
        self.shutdown.cancel();
        Ok(Response::new(pb::ShutdownResponse {}))
    }

    async fn abort(&self, request: Request<pb::AbortRequest>) -> Result<Response<pb::AbortResponse>, Status> {
        let request_ids = request.into_inner().request_ids;
        if !request_ids.is_empty() {
            self.state.abort(request_ids).await?;
        }
        Ok(Response::new(pb::AbortResponse {}))
    }

    async fn load_lora(&self, request: Request<pb::LoadLoraRequest>) -> Result<Response<pb::LoadLoraResponse>, Status> {
        let request = request.into_inner();
        let record = self.state.load_lora(&request.lora_name, &request.source_path).await?;
        Ok(Response::new(pb::LoadLoraResponse { adapter: Some(adapter(record)) }))
    }

    async fn unload_lora(
        &self,
        request: Request<pb::UnloadLoraRequest>,
    ) -> Result<Response<pb::UnloadLoraResponse>, Status> {
        let record = self.state.unload_lora(&request.into_inner().lora_name).await?;
        Ok(Response::new(pb::UnloadLoraResponse { adapter: Some(adapter(record)) }))
    }

    async fn list_loras(
        &self,
        _request: Request<pb::ListLorasRequest>,
    ) -> Result<Response<pb::ListLorasResponse>, Status> {
        let adapters = self.state.list_loras().await?.into_iter().map(adapter).collect();
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
        let mode = match pb::PauseMode::try_from(request.into_inner().mode) {
            Ok(pb::PauseMode::Unspecified | pb::PauseMode::Abort) => PauseMode::Abort,
            Ok(pb::PauseMode::Wait) => PauseMode::Wait,
            Ok(pb::PauseMode::Keep) => return unimplemented("PAUSE_MODE_KEEP (freezing running sequences)"),
            Err(_) => return Err(WorkerError::invalid("mode", "is not a PauseMode").into()),
        };
        self.state.pause(mode).await?;
        Ok(Response::new(pb::PauseGenerationResponse {}))
    }

    async fn resume_generation(
        &self,
        _request: Request<pb::ResumeGenerationRequest>,
    ) -> Result<Response<pb::ResumeGenerationResponse>, Status> {
        self.state.resume().await?;
        Ok(Response::new(pb::ResumeGenerationResponse {}))
    }

    async fn is_paused(
        &self,
        _request: Request<pb::IsPausedRequest>,
    ) -> Result<Response<pb::IsPausedResponse>, Status> {
        Ok(Response::new(pb::IsPausedResponse { paused: self.state.is_paused() }))
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
