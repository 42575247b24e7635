//! `loragate worker`: the candle engine and a coordinator behind vLLM's own gRPC protocol, one worker of a fleet. The
//! binary builds the coordinator (with the setting groups it shares with `serve`); `loragate-worker`'s front only
//! translates vLLM's calls into calls on it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use loragate_core::{Coordinator, CoordinatorConfig, Limits};
use loragate_engine::EngineConfig;
use loragate_net::ConnectionLimits;
use loragate_worker::{WorkerConfig, WorkerListeners, serve_worker};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::ServeError;
use crate::model::{ModelSource, ResolvedModel};
use crate::serve::open_adapter_store;
use crate::settings::{Authentication, GateDeadlines, coordinator_config};
use crate::startup::{ShutdownSignals, bind, join_error, load_engine};

/// Everything `loragate worker` needs.
#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// gRPC address (port 0 picks a free port).
    pub grpc_addr: SocketAddr,
    /// The HTTP address serving `GET /metrics` (`--http-addr`; port 0 picks a free port), if any.
    pub http_addr: Option<SocketAddr>,
    /// The model.
    pub model: ModelSource,
    /// The base model's served name (default: the directory's name, or `loragate-demo`).
    pub served_model_name: Option<String>,
    /// The only directory `LoadLora` may read from (default for the demo: its adapters directory).
    pub adapter_root: Option<PathBuf>,
    /// The longest a request waits while generation is paused (`--gate-max-wait`); the pause deadlines, which the
    /// worker's command line does not set, are the coordinator's defaults there.
    pub deadlines: GateDeadlines,
    /// Caps on admitted and held requests (`--max-in-flight`, `--max-held`).
    pub limits: Limits,
    /// The connection cap and timeouts (`--max-connections`, `--header-read-timeout`, `--idle-timeout`).
    pub connections: ConnectionLimits,
    /// The keys: the API key may call `vllm.Inference`, the admin key everything (the fleet coordinator's
    /// `--worker-key`). The worker's command line takes no tenant keys.
    pub authentication: Authentication,
    /// The most adapters loaded at once (`--max-loras`; `None`: no cap).
    pub max_loras: Option<usize>,
    /// Whether the `Shutdown` RPC may stop the worker.
    pub enable_shutdown_rpc: bool,
    /// How the engine runs.
    pub engine: EngineConfig,
}

/// A running worker. It stops on SIGINT/SIGTERM or (with `--enable-shutdown-rpc`) the `Shutdown` RPC: running
/// requests end with `ABORTED` and their tokens, held ones fail, then the server closes.
pub struct RunningWorker {
    grpc_addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    served_model_name: String,
    shutdown: CancellationToken,
    served: JoinHandle<Result<(), loragate_worker::WorkerServeError>>,
    signals: ShutdownSignals,
}

impl RunningWorker {
    /// Binds the addresses (first, so that a port clash fails before the model loads), loads the model, starts the
    /// coordinator over it and serves it.
    pub async fn start(settings: WorkerSettings) -> Result<Self, ServeError> {
        let signals = ShutdownSignals::listen();
        let (grpc, grpc_addr) = bind(settings.grpc_addr).await?;
        let http = match settings.http_addr {
            Some(requested) => Some(bind(requested).await?),
            None => None,
        };
        let http_addr = http.as_ref().map(|(_, bound)| *bound);
        let model = ResolvedModel::of(&settings.model).await?;
        let served_model_name = settings.served_model_name.clone().unwrap_or_else(|| model.name.clone());
        let adapter_root = model.adapter_root(settings.adapter_root.clone(), false)?;
        let keys = settings.authentication.keyring()?;
        let engine = load_engine(&model.path, settings.engine.clone()).await?;
        // Versions a fleet coordinator pushes (no shared filesystem) are kept in a temporary store: a worker keeps no
        // state across restarts, and its coordinator re-delivers the fleet's versions when it rejoins.
        let adapter_store = open_adapter_store(None, settings.engine.max_adapter_bytes).await?;
        let coordinator_config = CoordinatorConfig {
            adapter_store: Some(adapter_store),
            ..coordinator_config(settings.deadlines, settings.limits, keys, adapter_root, &served_model_name)
        };
        let coordinator = Coordinator::start(Arc::new(engine), coordinator_config).await?;
        let shutdown = CancellationToken::new();
        let config = WorkerConfig {
            served_model_name: served_model_name.clone(),
            max_running_requests: settings.engine.max_batch_size as u64,
            connections: settings.connections,
            max_loras: settings.max_loras,
            shutdown_rpc: settings.enable_shutdown_rpc,
            shutdown: shutdown.clone(),
        };
        let listeners = WorkerListeners { grpc, http: http.map(|(http, _)| http) };
        let served = tokio::spawn(serve_worker(listeners, coordinator, config));
        tracing::info!(%grpc_addr, ?http_addr, model = %served_model_name, "worker serving vLLM's gRPC protocol");
        Ok(Self { grpc_addr, http_addr, served_model_name, shutdown, served, signals })
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The bound HTTP address (`GET /metrics`), if the worker has one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
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
