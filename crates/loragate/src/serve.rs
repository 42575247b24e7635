//! `loragate serve`: the engine, the coordinator and both fronts, started together and stopped gracefully.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::select_all;
use loragate_core::{AdapterName, AdapterRoot, AdapterSource, Coordinator, CoordinatorConfig, CoreError};
use loragate_engine::{CandleEngine, DEMO_MODEL_NAME, DemoError, EngineConfig, EngineLoadError, ensure_demo_files};
use loragate_http::{HttpFront, TextCodec};
use loragate_tinker::{TinkerConfig, TinkerFront};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::text_codec::TokenizerCodec;

/// Which model to serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// The built-in demo model with its `meow` and `woof` adapters, generated into (and reused from) `cache_dir`.
    Demo {
        /// Where the demo files are cached.
        cache_dir: PathBuf,
    },
    /// A Hugging Face model directory.
    Directory(PathBuf),
}

/// An adapter loaded at start (`--adapter NAME=DIR`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitialAdapter {
    /// Its name.
    pub name: AdapterName,
    /// Its PEFT directory (trusted: named by the operator).
    pub dir: PathBuf,
}

/// Everything `loragate serve` needs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// gRPC address (port 0 picks a free port).
    pub grpc_addr: SocketAddr,
    /// HTTP address (port 0 picks a free port).
    pub http_addr: SocketAddr,
    /// The model.
    pub model: ModelSource,
    /// The base model's name over HTTP (default: the directory's name, or `loragate-demo`).
    pub served_model_name: Option<String>,
    /// Adapters to load at start.
    pub adapters: Vec<InitialAdapter>,
    /// The only directory `LoadLoraAdapter` may read from (default for the demo: its adapters directory).
    pub adapter_root: Option<PathBuf>,
    /// The longest hold at a paused adapter's gate.
    pub gate_max_wait: Duration,
    /// How long an abort waits for hand-backs.
    pub abort_ack_timeout: Duration,
    /// The longest drain of a wait-mode pause without a caller deadline.
    pub max_pause_drain: Duration,
    /// How long running requests may finish on shutdown before the rest are aborted.
    pub shutdown_grace: Duration,
    /// How the engine runs.
    pub engine: EngineConfig,
    /// The Tinker API front's settings (its routes share the HTTP listener).
    pub tinker: TinkerConfig,
}

impl ServeConfig {
    /// The demo model on the contract's default addresses.
    pub fn demo(cache_dir: PathBuf) -> Self {
        Self {
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 50051)),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            model: ModelSource::Demo { cache_dir },
            served_model_name: None,
            adapters: Vec::new(),
            adapter_root: None,
            gate_max_wait: Duration::from_secs(120),
            abort_ack_timeout: Duration::from_secs(10),
            max_pause_drain: Duration::from_secs(600),
            shutdown_grace: Duration::from_secs(10),
            engine: EngineConfig::default(),
            tinker: TinkerConfig::default(),
        }
    }
}

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The demo model could not be generated.
    #[error(transparent)]
    Demo(#[from] DemoError),
    /// The model could not be loaded.
    #[error(transparent)]
    Engine(#[from] EngineLoadError),
    /// `--adapter-root` is not a readable directory.
    #[error("--adapter-root {path}: {source}")]
    AdapterRoot {
        /// The directory.
        path: PathBuf,
        /// Why it cannot be used.
        #[source]
        source: std::io::Error,
    },
    /// An `--adapter` could not be loaded.
    #[error("--adapter {name}={}: {source}", dir.display())]
    Adapter {
        /// Its name.
        name: AdapterName,
        /// Its directory.
        dir: PathBuf,
        /// Why it failed.
        #[source]
        source: CoreError,
    },
    /// The coordinator's actors could not start.
    #[error("starting the coordinator: {0}")]
    Coordinator(#[from] ractor::SpawnErr),
    /// The Tinker front's futures store could not start.
    #[error("starting the Tinker front: {0}")]
    Tinker(#[source] ractor::SpawnErr),
    /// A listener could not be bound.
    #[error("binding {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error(transparent)]
    Grpc(#[from] loragate_grpc::GrpcServeError),
    /// The HTTP server failed.
    #[error(transparent)]
    Http(#[from] loragate_http::HttpServeError),
    /// A blocking start-up task panicked.
    #[error("start-up task failed: {0}")]
    Startup(String),
}

/// A running server. [`RunningServer::shutdown`] stops it gracefully.
pub struct RunningServer {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    served_model_name: String,
    coordinator: Coordinator,
    shutdown_grace: Duration,
    draining: CancellationToken,
    stop: CancellationToken,
    fronts: Vec<JoinHandle<Result<(), ServeError>>>,
}

impl RunningServer {
    /// Loads the model and the start-up adapters, binds both addresses and starts serving.
    pub async fn start(config: ServeConfig) -> Result<Self, ServeError> {
        let (model_dir, mut adapters, default_root, default_name) = match &config.model {
            ModelSource::Demo { cache_dir } => {
                let cache_dir = cache_dir.clone();
                let files = blocking(move || ensure_demo_files(&cache_dir)).await??;
                let demo_adapters = vec![
                    InitialAdapter { name: demo_name("meow"), dir: files.meow_dir.clone() },
                    InitialAdapter { name: demo_name("woof"), dir: files.woof_dir.clone() },
                ];
                (files.model_dir, demo_adapters, Some(files.adapters_dir), DEMO_MODEL_NAME.to_owned())
            }
            ModelSource::Directory(dir) => (dir.clone(), Vec::new(), None, directory_name(dir)),
        };
        adapters.retain(|demo| !config.adapters.iter().any(|given| given.name == demo.name));
        adapters.extend(config.adapters.iter().cloned());
        let served_model_name = config.served_model_name.clone().unwrap_or(default_name);

        let engine_config = config.engine.clone();
        let engine = blocking(move || CandleEngine::load(&model_dir, engine_config)).await??;
        let codec: Arc<dyn TextCodec> = Arc::new(TokenizerCodec::new(engine.tokenizer().cloned()));
        let adapter_root = match config.adapter_root.clone().or(default_root) {
            Some(path) => Some(AdapterRoot::new(&path).map_err(|source| ServeError::AdapterRoot { path, source })?),
            None => None,
        };
        let coordinator_config = CoordinatorConfig {
            max_gate_hold: config.gate_max_wait,
            abort_ack_timeout: config.abort_ack_timeout,
            max_pause_drain: config.max_pause_drain,
            adapter_root,
        };
        let coordinator = Coordinator::start(Arc::new(engine), coordinator_config).await?;
        for InitialAdapter { name, dir } in adapters {
            let loaded = coordinator.load_adapter(&name, AdapterSource::trusted(&dir)).await;
            let version = loaded.map_err(|source| ServeError::Adapter { name: name.clone(), dir, source })?;
            tracing::info!(adapter = %name, %version, "adapter loaded");
        }

        let grpc_listener = bind(config.grpc_addr).await?;
        let grpc_addr = local_addr(&grpc_listener, config.grpc_addr)?;
        let http_listener = bind(config.http_addr).await?;
        let http_addr = local_addr(&http_listener, config.http_addr)?;

        let (draining, stop) = (CancellationToken::new(), CancellationToken::new());
        let grpc = tokio::spawn(loragate_grpc::serve_grpc(
            grpc_listener,
            coordinator.clone(),
            draining.clone().cancelled_owned(),
            stop.clone().cancelled_owned(),
        ));
        let tinker = TinkerFront::start(coordinator.clone(), served_model_name.clone(), codec.clone(), config.tinker)
            .await
            .map_err(ServeError::Tinker)?;
        let http_front =
            HttpFront::new(coordinator.clone(), served_model_name.clone(), codec).with_routes(tinker.routes());
        let http = tokio::spawn(loragate_http::serve_http(
            http_listener,
            http_front,
            draining.clone().cancelled_owned(),
            stop.clone().cancelled_owned(),
        ));
        let fronts = vec![
            tokio::spawn(async move { grpc.await.map_err(join_error)?.map_err(ServeError::from) }),
            tokio::spawn(async move { http.await.map_err(join_error)?.map_err(ServeError::from) }),
        ];
        tracing::info!(%grpc_addr, %http_addr, model = %served_model_name, "serving");
        Ok(Self {
            grpc_addr,
            http_addr,
            served_model_name,
            coordinator,
            shutdown_grace: config.shutdown_grace,
            draining,
            stop,
            fronts,
        })
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// What HTTP calls the base model.
    pub fn served_model_name(&self) -> &str {
        &self.served_model_name
    }

    /// The coordinator behind both fronts.
    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    /// Serves until SIGINT or SIGTERM (or a front fails), then shuts down gracefully.
    pub async fn run_until_signal(mut self) -> Result<(), ServeError> {
        let front_ended = select_all(self.fronts.iter_mut());
        let outcome = tokio::select! {
            () = shutdown_signal() => {
                tracing::info!(grace = ?self.shutdown_grace, "shutting down: admitting nothing new, finishing what runs");
                Ok(())
            }
            (ended, index, _) = front_ended => {
                self.fronts.remove(index);
                match ended.map_err(join_error).and_then(|served| served) {
                    Ok(()) => Err(ServeError::Startup("a server stopped on its own".into())),
                    Err(err) => Err(err),
                }
            }
        };
        self.shutdown().await;
        outcome
    }

    /// Stops gracefully: health turns NOT_SERVING, nothing new is admitted, running requests get the shutdown grace
    /// to finish, the rest are aborted and handed back, held requests fail with UNAVAILABLE, then the servers stop.
    pub async fn shutdown(self) {
        self.draining.cancel();
        self.coordinator.shutdown(self.shutdown_grace).await;
        self.stop.cancel();
        for front in self.fronts {
            match tokio::time::timeout(Duration::from_secs(10), front).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => tracing::error!(%err, "a server failed while stopping"),
                Ok(Err(err)) => tracing::error!(%err, "a server task panicked"),
                Err(_) => tracing::warn!("a server did not stop within 10 s"),
            }
        }
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(err) => {
                tracing::warn!(%err, "cannot listen for SIGTERM; only SIGINT stops the server");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

async fn bind(address: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(address).await.map_err(|source| ServeError::Bind { address, source })
}

fn local_addr(listener: &TcpListener, address: SocketAddr) -> Result<SocketAddr, ServeError> {
    listener.local_addr().map_err(|source| ServeError::Bind { address, source })
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, ServeError> {
    tokio::task::spawn_blocking(work).await.map_err(join_error)
}

fn join_error(err: tokio::task::JoinError) -> ServeError {
    ServeError::Startup(err.to_string())
}

fn demo_name(name: &str) -> AdapterName {
    AdapterName::parse(name).expect("the demo adapter names are valid")
}

fn directory_name(dir: &Path) -> String {
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    canonical.file_name().map_or_else(|| "model".to_owned(), |name| name.to_string_lossy().into_owned())
}
