//! `loragate worker`: the candle engine behind vLLM's own gRPC protocol, one worker of a fleet.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use loragate_core::AdapterRoot;
use loragate_engine::{CandleEngine, EngineConfig};
use loragate_worker::{WorkerConfig, serve_worker};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::serve::{ModelSource, ResolvedModel, ServeError, ShutdownSignals, bind, blocking, join_error, local_addr};

/// Everything `loragate worker` needs.
#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// gRPC address (port 0 picks a free port).
    pub grpc_addr: SocketAddr,
    /// The model.
    pub model: ModelSource,
    /// The base model's served name (default: the directory's name, or `loragate-demo`).
    pub served_model_name: Option<String>,
    /// The only directory `LoadLora` may read from (default for the demo: its adapters directory).
    pub adapter_root: Option<PathBuf>,
    /// How the engine runs.
    pub engine: EngineConfig,
}

/// A running worker. It stops on SIGINT/SIGTERM or the `Shutdown` RPC: running requests end with `ABORTED` and
/// their tokens, then the server closes.
pub struct RunningWorker {
    grpc_addr: SocketAddr,
    served_model_name: String,
    shutdown: CancellationToken,
    served: JoinHandle<Result<(), loragate_worker::WorkerServeError>>,
    signals: ShutdownSignals,
}

impl RunningWorker {
    /// Binds the address (first, so that a port clash fails before the model loads), loads the model and starts
    /// serving.
    pub async fn start(settings: WorkerSettings) -> Result<Self, ServeError> {
        let signals = ShutdownSignals::listen();
        let listener = bind(settings.grpc_addr).await?;
        let grpc_addr = local_addr(&listener, settings.grpc_addr)?;
        let model = ResolvedModel::of(&settings.model).await?;
        let served_model_name = settings.served_model_name.clone().unwrap_or_else(|| model.name.clone());
        let adapter_root = match settings.adapter_root.clone().or_else(|| model.adapter_root.clone()) {
            Some(path) => Some(AdapterRoot::new(&path).map_err(|source| ServeError::AdapterRoot { path, source })?),
            None => None,
        };
        let (path, engine_config) = (model.path.clone(), settings.engine.clone());
        let engine = blocking(move || CandleEngine::load(&path, engine_config)).await??;
        let shutdown = CancellationToken::new();
        let config = WorkerConfig {
            served_model_name: served_model_name.clone(),
            adapter_root,
            max_running_requests: settings.engine.max_batch_size as u64,
            shutdown: shutdown.clone(),
        };
        let served = tokio::spawn(serve_worker(listener, Arc::new(engine), config));
        tracing::info!(%grpc_addr, model = %served_model_name, "worker serving vLLM's gRPC protocol");
        Ok(Self { grpc_addr, served_model_name, shutdown, served, signals })
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The base model's served name.
    pub fn served_model_name(&self) -> &str {
        &self.served_model_name
    }

    /// Serves until SIGINT, SIGTERM or the `Shutdown` RPC, then stops.
    pub async fn run_until_signal(mut self) -> Result<(), ServeError> {
        tokio::select! {
            () = self.signals.received() => self.shutdown.cancel(),
            () = self.shutdown.cancelled() => {}
        }
        tracing::info!("worker stopping: aborting running requests");
        Ok(self.served.await.map_err(join_error)??)
    }
}
