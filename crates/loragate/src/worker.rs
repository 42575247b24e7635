//! `loragate worker`: the candle engine and a coordinator behind vLLM's own gRPC protocol, one worker of a fleet. The
//! binary builds the coordinator; `loragate-worker`'s front only translates vLLM's calls into calls on it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use loragate_core::{AdapterRoot, Coordinator, CoordinatorConfig, Key, Keyring, Limits, TenantKeys};
use loragate_engine::{CandleEngine, EngineConfig};
use loragate_net::ConnectionLimits;
use loragate_worker::{WorkerConfig, WorkerListeners, serve_worker};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::serve::{ModelSource, ResolvedModel, ServeError, ShutdownSignals, bind, blocking, join_error, local_addr};

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
    /// The longest a request waits while generation is paused (`--gate-max-wait`).
    pub gate_max_wait: Duration,
    /// Caps on admitted and held requests (`--max-in-flight`, `--max-held`).
    pub limits: Limits,
    /// The most connections open at once.
    pub max_connections: usize,
    /// How long a new connection may take to send its first request head.
    pub header_read_timeout: Duration,
    /// How long a connection may stay without a request in progress.
    pub idle_timeout: Duration,
    /// May call `vllm.Inference`.
    pub api_key: Option<Key>,
    /// May call everything (the fleet coordinator's `--worker-key`).
    pub admin_key: Option<Key>,
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
    /// Binds the address (first, so that a port clash fails before the model loads), loads the model, starts the
    /// coordinator over it and serves it.
    pub async fn start(settings: WorkerSettings) -> Result<Self, ServeError> {
        let signals = ShutdownSignals::listen();
        let listener = bind(settings.grpc_addr).await?;
        let grpc_addr = local_addr(&listener, settings.grpc_addr)?;
        let http = match settings.http_addr {
            Some(requested) => {
                let http = bind(requested).await?;
                let bound = local_addr(&http, requested)?;
                Some((http, bound))
            }
            None => None,
        };
        let http_addr = http.as_ref().map(|(_, bound)| *bound);
        let model = ResolvedModel::of(&settings.model).await?;
        let served_model_name = settings.served_model_name.clone().unwrap_or_else(|| model.name.clone());
        let adapter_root = match settings.adapter_root.clone().or_else(|| model.adapter_root.clone()) {
            Some(path) => Some(AdapterRoot::new(&path).map_err(|source| ServeError::AdapterRoot { path, source })?),
            None => None,
        };
        let keys = Keyring::new(settings.api_key.clone(), settings.admin_key.clone(), TenantKeys::default())?;
        let (path, engine_config) = (model.path.clone(), settings.engine.clone());
        let engine = blocking(move || CandleEngine::load(&path, engine_config)).await??;
        let coordinator_config = CoordinatorConfig {
            max_gate_hold: settings.gate_max_wait,
            adapter_root,
            limits: settings.limits,
            auth: keys,
            reserved_names: vec![served_model_name.clone()],
            ..CoordinatorConfig::default()
        };
        let coordinator = Coordinator::start(Arc::new(engine), coordinator_config).await?;
        let shutdown = CancellationToken::new();
        let config = WorkerConfig {
            served_model_name: served_model_name.clone(),
            max_running_requests: settings.engine.max_batch_size as u64,
            connections: ConnectionLimits::new(
                settings.max_connections,
                settings.header_read_timeout,
                settings.idle_timeout,
            ),
            max_loras: settings.max_loras,
            shutdown_rpc: settings.enable_shutdown_rpc,
            shutdown: shutdown.clone(),
        };
        let listeners = WorkerListeners { grpc: listener, http: http.map(|(http, _)| http) };
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
