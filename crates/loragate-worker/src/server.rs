//! Assembles the worker's gRPC server: `vllm.Inference`, `vllm.Control` and `grpc.health.v1`.

use std::sync::Arc;
use std::time::Duration;

use loragate_core::{AdapterRoot, Engine};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use vllm_proto::control_server::ControlServer;
use vllm_proto::inference_server::InferenceServer;

use crate::control::{ControlService, ServerFacts};
use crate::inference::InferenceService;
use crate::state::{PauseMode, WorkerHandle};

/// How long a stopping worker waits for its aborted requests to be handed back before it closes connections.
const STOP_ABORT_WAIT: Duration = Duration::from_secs(10);

/// How a worker serves.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The base model's name: what `GenerateRequest.model` may name (empty works too) and `GetModelInfo` reports.
    pub served_model_name: String,
    /// The only directory `LoadLora` may read adapters from (relative paths are taken from it); `None` refuses
    /// every load with `FAILED_PRECONDITION`, as vLLM does when LoRA is disabled.
    pub adapter_root: Option<AdapterRoot>,
    /// What `GetServerInfo.max_running_requests` reports (the engine's batch size).
    pub max_running_requests: u64,
    /// Cancelled to stop the worker: by its owner (a signal), or by the `Shutdown` RPC.
    pub shutdown: CancellationToken,
}

/// Why the worker could not serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerServeError {
    /// The state actor could not start.
    #[error("starting the worker's state actor: {0}")]
    Spawn(#[from] ractor::SpawnErr),
    /// The transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves `engine` over vLLM's gRPC protocol on `listener` until `config.shutdown` is cancelled. Stopping turns
/// health to `NOT_SERVING`, aborts the running requests (each ends with `ABORTED` after its tokens), then closes.
pub async fn serve_worker(
    listener: TcpListener,
    engine: Arc<dyn Engine>,
    config: WorkerConfig,
) -> Result<(), WorkerServeError> {
    let state = WorkerHandle::start(engine.clone(), config.adapter_root.clone()).await?;
    let served_model_name: Arc<str> = config.served_model_name.into();
    let facts = ServerFacts {
        served_model_name: served_model_name.clone(),
        instance_id: format!("loragate-{:016x}", rand_id()),
        max_running_requests: config.max_running_requests,
        supports_lora: config.adapter_root.is_some(),
    };
    let inference = InferenceServer::new(InferenceService::new(engine.clone(), state.clone(), served_model_name));
    let control = ControlServer::new(ControlService::new(engine, state.clone(), facts, config.shutdown.clone()));

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<InferenceServer<InferenceService>>().await;
    health.set_serving::<ControlServer<ControlService>>().await;
    let stop = {
        let (shutdown, state) = (config.shutdown.clone(), state.clone());
        async move {
            shutdown.cancelled().await;
            health.set_not_serving::<InferenceServer<InferenceService>>().await;
            health.set_not_serving::<ControlServer<ControlService>>().await;
            health.set_service_status("", ServingStatus::NotServing).await;
            if tokio::time::timeout(STOP_ABORT_WAIT, state.pause(PauseMode::Abort)).await.is_err() {
                tracing::warn!("stopping: some aborted requests were not handed back in time");
            }
        }
    };
    let served = Server::builder()
        .tcp_nodelay(true)
        .max_concurrent_streams(None)
        .add_service(health_service)
        .add_service(inference)
        .add_service(control)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), stop)
        .await;
    state.stop();
    Ok(served?)
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests;
