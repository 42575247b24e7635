//! `loragate serve`: the engine (in-process, or a fleet of workers), the coordinator and both fronts, started
//! together and stopped gracefully.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::select_all;
use loragate_core::{
    AdapterName, AdapterRoot, AdapterSource, Coordinator, CoordinatorConfig, CoreError, Engine, FleetControl, Key,
    KeyConfigError, Keyring, Limits, Reconciled, StartError, StateError, TenantKeys,
};
use loragate_engine::{
    CandleEngine, DEMO_MODEL_NAME, DemoError, EngineConfig, EngineLoadError, ModelFormat, Tokenizer, ensure_demo_files,
    gguf_chat_template, read_model_info,
};
use loragate_fleet::{FleetConfig, FleetEngine, FleetError, WorkerAddress};
use loragate_http::{ChatTemplate, HttpFront};
use loragate_net::ConnectionLimits;
use loragate_text::TextCodec;
use loragate_tinker::{TinkerConfig, TinkerFront};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::state_dir::StateLocation;
use crate::text_codec::TokenizerCodec;

/// Which model to serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// The built-in demo model with its `meow` and `woof` adapters, generated into (and reused from) `cache_dir`.
    Demo {
        /// Where the demo files are cached.
        cache_dir: PathBuf,
    },
    /// A Hugging Face model directory or a GGUF file.
    Path(PathBuf),
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
    /// The base model's name over HTTP (default: the directory's name or the GGUF file's stem, or `loragate-demo`).
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
    /// Caps on admitted and held sampling requests.
    pub limits: Limits,
    /// The most connections open at once, both fronts together.
    pub max_connections: usize,
    /// How long a new connection may take to send its first request head.
    pub header_read_timeout: Duration,
    /// How long a connection may stay without a request in progress.
    pub idle_timeout: Duration,
    /// Who may do what (off unless some key is given).
    pub authentication: Authentication,
    /// How the engine runs.
    pub engine: EngineConfig,
    /// Workers to front instead of running the engine in-process (`--worker`); empty for the in-process engine.
    pub workers: Vec<WorkerAddress>,
    /// How often the workers' health is checked.
    pub worker_health_interval: Duration,
    /// Failures in a row after which a worker's probes back off and it must pass that many checks to serve again.
    pub worker_failure_threshold: u32,
    /// How long a fleet coordinator waits at start for a first worker to be ready.
    pub worker_wait: Duration,
    /// The most workers the fleet holds.
    pub max_workers: usize,
    /// Where the workers mount the adapter root (default: where the coordinator names it).
    pub worker_adapter_root: Option<PathBuf>,
    /// The key presented to the workers (`--worker-key`).
    pub worker_key: Option<Key>,
    /// Where adapters, versions and pauses are recorded to survive a restart (`--state-dir`), or shared with other
    /// replicas (`--state etcd://…`).
    pub state: StateLocation,
    /// With a shared state: the TTL of this replica's registration (`--replica-lease`), how long after its death
    /// pauses stop waiting for it.
    pub replica_lease: Duration,
    /// The Tinker API front's settings (its routes share the HTTP listener).
    pub tinker: TinkerConfig,
    /// How often the stats line is logged (`--log-stats-interval`); `None` for never.
    pub log_stats_interval: Option<Duration>,
}

/// The keys of `--api-key`, `--admin-key` and `--tenant-keys`; any one turns authentication on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Authentication {
    /// May sample.
    pub api_key: Option<Key>,
    /// May do everything.
    pub admin_key: Option<Key>,
    /// A JSON file of tenant keys (see `docs/security.md`).
    pub tenant_keys: Option<PathBuf>,
}

impl Authentication {
    /// The keyring these keys make (reading the tenant file).
    pub fn keyring(&self) -> Result<Keyring, KeyConfigError> {
        let tenants = match &self.tenant_keys {
            Some(path) => TenantKeys::read(path)?,
            None => TenantKeys::default(),
        };
        Keyring::new(self.api_key.clone(), self.admin_key.clone(), tenants)
    }
}

impl ServeConfig {
    /// The demo model on the contract's default addresses, with its state in memory only.
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
            limits: Limits::default(),
            max_connections: loragate_net::DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: loragate_net::DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: loragate_net::DEFAULT_IDLE_TIMEOUT,
            authentication: Authentication::default(),
            engine: EngineConfig::default(),
            workers: Vec::new(),
            worker_health_interval: Duration::from_secs(2),
            worker_failure_threshold: 3,
            worker_wait: Duration::from_secs(60),
            max_workers: 256,
            worker_adapter_root: None,
            worker_key: None,
            state: StateLocation::Memory,
            replica_lease: Duration::from_secs(5),
            tinker: TinkerConfig::default(),
            log_stats_interval: None,
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
    /// `--adapter-root` is not a readable directory (or, with workers, not a path the workers can be sent).
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
    /// The keys cannot be used.
    #[error("authentication keys: {0}")]
    Keys(#[from] KeyConfigError),
    /// The coordinator could not start (its actors, or the recorded state it puts back).
    #[error(transparent)]
    Coordinator(#[from] StartError),
    /// The state directory (or the shared state) cannot be used.
    #[error("--state-dir / --state: {0}")]
    State(#[from] StateError),
    /// This replica's addresses could not be announced to the others sharing the state.
    #[error("--state: announcing this replica: {0}")]
    Announce(String),
    /// The Tinker front's futures store could not start.
    #[error("starting the Tinker front: {0}")]
    Tinker(#[source] loragate_tinker::StartError),
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
    /// The fleet of workers could not start (no worker became ready).
    #[error("--worker: {0}")]
    Fleet(#[from] FleetError),
    /// With workers, an `--adapter` path leaves the adapter root (or has `..`).
    #[error("--adapter {name}={}: the path leaves the adapter root {}", dir.display(), root.display())]
    AdapterOutsideRoot {
        /// Its name.
        name: AdapterName,
        /// Its path.
        dir: PathBuf,
        /// The adapter root.
        root: PathBuf,
    },
    /// The worker could not serve.
    #[error(transparent)]
    Worker(#[from] loragate_worker::WorkerServeError),
}

/// A running server. [`RunningServer::shutdown`] stops it gracefully.
pub struct RunningServer {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    served_model_name: String,
    state_dir: Option<PathBuf>,
    coordinator: Coordinator,
    shutdown_grace: Duration,
    draining: CancellationToken,
    stop: CancellationToken,
    fronts: Vec<JoinHandle<Result<(), ServeError>>>,
    signals: ShutdownSignals,
}

impl RunningServer {
    /// Binds both addresses (first, so that a port clash fails before the model loads), loads the model (or starts
    /// the fleet of workers) and the start-up adapters, and starts serving.
    pub async fn start(config: ServeConfig) -> Result<Self, ServeError> {
        let signals = ShutdownSignals::listen();
        let grpc_listener = bind(config.grpc_addr).await?;
        let grpc_addr = local_addr(&grpc_listener, config.grpc_addr)?;
        let http_listener = bind(config.http_addr).await?;
        let http_addr = local_addr(&http_listener, config.http_addr)?;
        let model = ResolvedModel::of(&config.model).await?;
        let served_model_name = config.served_model_name.clone().unwrap_or_else(|| model.name.clone());
        let auth = config.authentication.keyring()?;
        if auth.is_enabled() {
            tracing::info!("authentication is on: callers must present a key");
        }
        let template_path = model.path.clone();
        let chat_template = blocking(move || chat_template(&template_path)).await?;
        let in_fleet = !config.workers.is_empty();
        // A pause waits for the other replicas as long as for its own requests, plus a dead replica's lease.
        let replica_ack_timeout = config.abort_ack_timeout + config.replica_lease;
        let (state, state_dir) =
            config.state.open(&served_model_name, config.replica_lease, replica_ack_timeout).await?;
        if let Some(dir) = &state_dir {
            tracing::info!(state_dir = %dir.display(), "recording adapters, versions and pauses");
        }
        let adapter_root_dir = config.adapter_root.clone().or_else(|| model.adapter_root.clone());
        let adapter_root = match adapter_root_dir.clone() {
            // A fleet's coordinator need not hold the files: the root is the workers' tree, checked by components.
            Some(path) if in_fleet => Some(
                // Canonical where it exists here (a shared mount, or the demo's directory), else as written.
                std::fs::canonicalize(&path)
                    .or_else(|_| std::path::absolute(&path))
                    .and_then(AdapterRoot::remote)
                    .map_err(|source| ServeError::AdapterRoot { path, source })?,
            ),
            Some(path) => Some(AdapterRoot::new(&path).map_err(|source| ServeError::AdapterRoot { path, source })?),
            None => None,
        };
        let backend = if in_fleet {
            Backend::fleet(&model, &config, adapter_root.as_ref()).await?
        } else {
            Backend::in_process(&model, &config).await?
        };
        crate::model_facts::log_model_facts(
            &model.path,
            &served_model_name,
            backend.engine.model_info(),
            (!in_fleet).then_some(&config.engine),
            &chat_template,
        );
        let demo: Vec<InitialAdapter> = model
            .demo_adapters
            .iter()
            .filter(|demo| !config.adapters.iter().any(|given| given.name == demo.name))
            .cloned()
            .collect();
        let adapters = if in_fleet {
            // Paths as the workers see them: absolute, inside the adapter root if there is one (the demo's adapters
            // are its `meow` and `woof`).
            let mut adapters = Vec::with_capacity(demo.len() + config.adapters.len());
            for demo in demo {
                adapters.push(for_workers(demo, true, adapter_root.as_ref()).await?);
            }
            for given in &config.adapters {
                adapters.push(for_workers(given.clone(), false, adapter_root.as_ref()).await?);
            }
            adapters
        } else {
            demo.into_iter().chain(config.adapters.iter().cloned()).collect()
        };

        let coordinator_config = CoordinatorConfig {
            max_gate_hold: config.gate_max_wait,
            abort_ack_timeout: config.abort_ack_timeout,
            max_pause_drain: config.max_pause_drain,
            adapter_root,
            limits: config.limits,
            auth,
            reserved_names: vec![served_model_name.clone()],
            state,
        };
        let coordinator = Coordinator::start(backend.engine.clone(), coordinator_config).await?;
        for InitialAdapter { name, dir } in adapters {
            let reconciled = coordinator.reconcile_adapter(&name, AdapterSource::trusted(&dir)).await;
            match reconciled.map_err(|source| ServeError::Adapter { name: name.clone(), dir, source })? {
                // The coordinator logs the load.
                Reconciled::Loaded(_) => {}
                Reconciled::Kept(version) => tracing::info!(adapter = %name, %version, "adapter kept as recorded"),
            }
        }
        let codec: Arc<dyn TextCodec> = Arc::new(TokenizerCodec::new(backend.tokenizer));

        // What `ListReplicas` shows the other replicas sharing the state.
        coordinator.announce(grpc_addr, http_addr).await.map_err(|err| ServeError::Announce(err.to_string()))?;

        // One cap over both fronts: it protects the process's file descriptors.
        let connections =
            ConnectionLimits::new(config.max_connections, config.header_read_timeout, config.idle_timeout);
        let (draining, stop) = (CancellationToken::new(), CancellationToken::new());
        let fleet_control = backend.fleet.clone().map(|fleet| fleet as Arc<dyn FleetControl>);
        let grpc = tokio::spawn(loragate_grpc::serve_grpc_with(
            grpc_listener,
            coordinator.clone(),
            connections.clone(),
            fleet_control,
            draining.clone().cancelled_owned(),
            stop.clone().cancelled_owned(),
        ));
        let tinker = TinkerFront::start(coordinator.clone(), served_model_name.clone(), codec.clone(), config.tinker)
            .await
            .map_err(ServeError::Tinker)?;
        let mut http_front = HttpFront::new(coordinator.clone(), served_model_name.clone(), codec)
            .with_connection_limits(connections)
            .with_routes(tinker.routes());
        match chat_template {
            Ok(Some(template)) => http_front = http_front.with_chat_template(template),
            Ok(None) => {}
            Err(err) => tracing::warn!(%err, "the model's chat template is unusable; /v1/chat/completions answers 400"),
        }
        if let Some(fleet) = &backend.fleet {
            http_front = http_front.with_metrics_source(fleet.clone());
        }
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
        if let Some(interval) = config.log_stats_interval {
            tokio::spawn(crate::stats_log::log_stats(coordinator.clone(), interval, draining.clone()));
        }
        tracing::info!(%grpc_addr, %http_addr, model = %served_model_name, "serving");
        Ok(Self {
            grpc_addr,
            http_addr,
            served_model_name,
            state_dir,
            coordinator,
            shutdown_grace: config.shutdown_grace,
            draining,
            stop,
            fronts,
            signals,
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

    /// Where the state is recorded (`None`: in memory only).
    pub fn state_dir(&self) -> Option<&Path> {
        self.state_dir.as_deref()
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
            () = self.signals.received() => {
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

/// The model's files, wherever they come from.
pub(crate) struct ResolvedModel {
    /// The Hugging Face directory or GGUF file.
    pub(crate) path: PathBuf,
    /// The demo's adapters (none for a directory).
    pub(crate) demo_adapters: Vec<InitialAdapter>,
    /// The default adapter root (the demo's adapters directory).
    pub(crate) adapter_root: Option<PathBuf>,
    /// The default served name.
    pub(crate) name: String,
}

impl ResolvedModel {
    /// Generates the demo files if needed (blocking work off the runtime).
    pub(crate) async fn of(source: &ModelSource) -> Result<Self, ServeError> {
        Ok(match source {
            ModelSource::Demo { cache_dir } => {
                let cache_dir = cache_dir.clone();
                let files = blocking(move || ensure_demo_files(&cache_dir)).await??;
                let demo_adapters = vec![
                    InitialAdapter { name: demo_name("meow"), dir: files.meow_dir.clone() },
                    InitialAdapter { name: demo_name("woof"), dir: files.woof_dir.clone() },
                ];
                Self {
                    path: files.model_dir,
                    demo_adapters,
                    adapter_root: Some(files.adapters_dir),
                    name: DEMO_MODEL_NAME.to_owned(),
                }
            }
            ModelSource::Path(path) => {
                Self { path: path.clone(), demo_adapters: Vec::new(), adapter_root: None, name: model_name(path) }
            }
        })
    }
}

/// What runs the model: the in-process engine, or a fleet of workers.
struct Backend {
    engine: Arc<dyn Engine>,
    tokenizer: Option<Tokenizer>,
    fleet: Option<Arc<FleetEngine>>,
}

impl Backend {
    async fn in_process(model: &ResolvedModel, config: &ServeConfig) -> Result<Self, ServeError> {
        let (path, engine_config) = (model.path.clone(), config.engine.clone());
        let engine = blocking(move || CandleEngine::load(&path, engine_config)).await??;
        let tokenizer = engine.tokenizer().cloned();
        Ok(Self { engine: Arc::new(engine), tokenizer, fleet: None })
    }

    /// The fleet, once at least one worker is ready (waiting up to `--worker-wait` for one). The model's files supply
    /// only the limits and tokenizer; adapter paths go to the workers absolute, those inside the adapter root under
    /// the workers' mount of it (`--worker-adapter-root`).
    async fn fleet(
        model: &ResolvedModel,
        config: &ServeConfig,
        adapter_root: Option<&AdapterRoot>,
    ) -> Result<Self, ServeError> {
        let (path, max_context) = (model.path.clone(), config.engine.max_context_length);
        let (info, tokenizer) = blocking(move || {
            Ok::<_, EngineLoadError>((read_model_info(&path, max_context)?, Tokenizer::for_model(&path)?))
        })
        .await??;
        let fleet_config = FleetConfig {
            health_interval: config.worker_health_interval,
            failure_threshold: config.worker_failure_threshold,
            max_workers: config.max_workers,
            join_timeout: config.worker_wait,
            adapter_root: adapter_root.map(|root| root.path().to_owned()),
            worker_adapter_root: config.worker_adapter_root.clone(),
            worker_key: config.worker_key.clone(),
            ..FleetConfig::default()
        };
        let fleet = Arc::new(FleetEngine::start(info, config.workers.clone(), fleet_config).await?);
        fleet.wait_ready().await?;
        Ok(Self { engine: fleet.clone(), tokenizer, fleet: Some(fleet) })
    }
}

/// An adapter loaded at start as a fleet's workers are sent it, without touching the filesystem (the path is the
/// workers'): inside the adapter root if there is one (relative paths taken from it, no `..`, an absolute path under
/// it; the demo's adapters are the root's `meow` and `woof`), else absolute (relative to the current directory).
async fn for_workers(
    adapter: InitialAdapter,
    is_demo: bool,
    root: Option<&AdapterRoot>,
) -> Result<InitialAdapter, ServeError> {
    let InitialAdapter { name, dir } = adapter;
    let Some(root) = root else {
        let absolute = std::path::absolute(&dir).map_err(|source| ServeError::AdapterRoot { path: dir, source })?;
        return Ok(InitialAdapter { name, dir: absolute });
    };
    let requested = if is_demo { PathBuf::from(name.as_str()) } else { dir.clone() };
    match root.resolve(&requested.to_string_lossy()).await {
        Ok(source) => Ok(InitialAdapter { name, dir: source.dir().to_owned() }),
        Err(_) => Err(ServeError::AdapterOutsideRoot { name, dir, root: root.path().to_owned() }),
    }
}

/// SIGINT and SIGTERM, listened for from the moment this is made: made before the ready line is printed, so a signal
/// sent right after it is never left to the default disposition (which would kill the process without a graceful
/// shutdown).
pub(crate) struct ShutdownSignals {
    #[cfg(unix)]
    signals: Vec<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    /// Starts listening (needs a running Tokio runtime).
    pub(crate) fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let signals = [SignalKind::interrupt(), SignalKind::terminate()]
                .into_iter()
                .filter_map(|kind| {
                    signal(kind).inspect_err(|err| tracing::warn!(%err, "cannot listen for a shutdown signal")).ok()
                })
                .collect();
            Self { signals }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Resolves at the first SIGINT or SIGTERM.
    pub(crate) async fn received(&mut self) {
        #[cfg(unix)]
        {
            if self.signals.is_empty() {
                return std::future::pending().await;
            }
            let received = self.signals.iter_mut().map(|signal| Box::pin(signal.recv()));
            let _ = select_all(received).await;
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub(crate) async fn bind(address: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(address).await.map_err(|source| ServeError::Bind { address, source })
}

pub(crate) fn local_addr(listener: &TcpListener, address: SocketAddr) -> Result<SocketAddr, ServeError> {
    listener.local_addr().map_err(|source| ServeError::Bind { address, source })
}

pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, ServeError> {
    tokio::task::spawn_blocking(work).await.map_err(join_error)
}

pub(crate) fn join_error(err: tokio::task::JoinError) -> ServeError {
    ServeError::Startup(err.to_string())
}

fn demo_name(name: &str) -> AdapterName {
    AdapterName::parse(name).expect("the demo adapter names are valid")
}

/// The default served name: a directory's name, a GGUF file's stem (`SmolLM2-135M-Instruct.Q4_1` for
/// `SmolLM2-135M-Instruct.Q4_1.gguf`).
fn model_name(path: &Path) -> String {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let name = match ModelFormat::of(&canonical) {
        ModelFormat::HuggingFace => canonical.file_name(),
        ModelFormat::Gguf => canonical.file_stem(),
    };
    name.map_or_else(|| "model".to_owned(), |name| name.to_string_lossy().into_owned())
}

/// The model's chat template: a Hugging Face directory's `chat_template.jinja` or `tokenizer_config.json`, a GGUF
/// file's `tokenizer.chat_template`. The error says why it is unusable (chat then answers 400).
fn chat_template(path: &Path) -> Result<Option<ChatTemplate>, String> {
    match ModelFormat::of(path) {
        ModelFormat::HuggingFace => ChatTemplate::from_model_dir(path).map_err(|err| err.to_string()),
        ModelFormat::Gguf => match gguf_chat_template(path).map_err(|err| err.to_string())? {
            Some(source) => ChatTemplate::new(source.template, source.bos_token, source.eos_token)
                .map(Some)
                .map_err(|err| err.to_string()),
            None => Ok(None),
        },
    }
}
