//! `loragate serve`: the engine (in-process, or a fleet of workers), the coordinator and both fronts, started
//! together in named steps said as they go (bind, then, while the HTTP listener answers 503 "starting": open the
//! state, start the engine or the fleet, the coordinator and the initial adapters; then spawn the fronts) and stopped
//! gracefully, saying what the stop aborted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::select_all;
use loragate_core::{AdapterStore, Coordinator, CoordinatorConfig, ShutdownReport, StateError, StateStore};
use loragate_http::StartingResponder;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::ServeError;
use crate::model::ResolvedModel;
use crate::settings::coordinator_config;
use crate::startup::{ShutdownSignals, join_error};

mod adapters;
mod backend;
mod config;
mod fronts;
mod steps;
mod version_fetch;

use self::backend::Backend;
pub use self::config::{EngineLayer, ServeConfig};
use self::fronts::{FrontSettings, Fronts, Listeners};
use self::steps::{StartupPlan, StartupSteps};
use self::version_fetch::HttpVersionFetcher;

/// A running server. [`RunningServer::shutdown`] stops it gracefully.
pub struct RunningServer {
    server: Serving,
    signals: ShutdownSignals,
}

/// What a started server holds, besides the signals that stop it.
struct Serving {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    served_model_name: String,
    state_dir: Option<PathBuf>,
    coordinator: Coordinator,
    shutdown_grace: Duration,
    draining: CancellationToken,
    stop: CancellationToken,
    fronts: Vec<JoinHandle<Result<(), ServeError>>>,
}

impl RunningServer {
    /// Binds both addresses (first, so that a port clash fails before the model loads), then, saying each step as it
    /// goes while the HTTP listener answers 503 `{"status": "starting"}`: opens the state, loads the model (or starts
    /// the fleet of workers), starts the coordinator with the start-up adapters, and spawns the fronts. SIGINT or
    /// SIGTERM meanwhile stops the start ([`ServeError::Interrupted`]).
    pub async fn start(config: ServeConfig) -> Result<Self, ServeError> {
        let mut signals = ShutdownSignals::listen();
        let listeners = Listeners::bind(config.grpc_addr, config.http_addr).await?;
        let plan = StartupPlan::of(&config);
        let steps = StartupSteps::announce(&plan, listeners.grpc_addr, listeners.http_addr);
        tokio::select! {
            started = start_serving(config, listeners, &plan, &steps) => {
                let server = started?;
                Ok(Self { server, signals })
            }
            () = signals.received() => {
                let step = steps.current();
                tracing::info!(%step, "shutdown complete: a signal stopped the start; nothing was served");
                Err(ServeError::Interrupted { step })
            }
        }
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.server.grpc_addr
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.server.http_addr
    }

    /// Where the state is recorded (`None`: in memory only).
    pub fn state_dir(&self) -> Option<&Path> {
        self.server.state_dir.as_deref()
    }

    /// What HTTP calls the base model.
    pub fn served_model_name(&self) -> &str {
        &self.server.served_model_name
    }

    /// The coordinator behind both fronts.
    pub fn coordinator(&self) -> &Coordinator {
        &self.server.coordinator
    }

    /// Serves until SIGINT or SIGTERM (or a front fails), then shuts down gracefully.
    pub async fn run_until_signal(mut self) -> Result<(), ServeError> {
        let server = &mut self.server;
        let front_ended = select_all(server.fronts.iter_mut());
        let outcome = tokio::select! {
            () = self.signals.received() => {
                tracing::info!(grace = ?server.shutdown_grace, "shutting down: admitting nothing new, finishing what runs");
                Ok(())
            }
            (ended, index, _) = front_ended => {
                server.fronts.remove(index);
                match ended.map_err(join_error).and_then(|served| served) {
                    Ok(()) => Err(ServeError::Startup("a server stopped on its own".into())),
                    Err(err) => Err(err),
                }
            }
        };
        self.shutdown().await;
        outcome
    }

    /// Stops gracefully: health and readiness turn 503 / NOT_SERVING, nothing new is admitted, running requests get
    /// the shutdown grace to finish, the rest are aborted and handed back, held requests fail with UNAVAILABLE, then
    /// the servers stop. Logs what it aborted, and a last line once done.
    pub async fn shutdown(self) {
        let server = self.server;
        server.draining.cancel();
        let report = server.coordinator.shutdown(server.shutdown_grace).await;
        log_shutdown_report(&report);
        server.stop.cancel();
        for front in server.fronts {
            match tokio::time::timeout(Duration::from_secs(10), front).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => tracing::error!(%err, "a server failed while stopping"),
                Ok(Err(err)) => tracing::error!(%err, "a server task panicked"),
                Err(_) => tracing::warn!("a server did not stop within 10 s"),
            }
        }
        tracing::info!("shutdown complete");
    }
}

/// Everything `start` does once the listeners are bound, each long part as a step of `plan`.
async fn start_serving(
    config: ServeConfig,
    listeners: Listeners,
    plan: &StartupPlan,
    steps: &StartupSteps,
) -> Result<Serving, ServeError> {
    let Listeners { grpc, http, grpc_addr, http_addr } = listeners;
    let starting = StartingResponder::spawn(http, steps.watch());
    let resolving = ResolvedModel::of(&config.model);
    let model = match &plan.model {
        Some(step) => steps.run(step, resolving).await?,
        None => resolving.await?,
    };
    let served_model_name = config.served_model_name.clone().unwrap_or_else(|| model.name.clone());
    let auth = config.authentication.keyring()?;
    if auth.is_enabled() {
        tracing::info!("authentication is on: callers must present a key");
    }
    let chat_template = model.chat_template().await?;
    let (state, state_dir) = steps.run(&plan.state, open_state(&config, &served_model_name)).await?;

    let in_fleet = config.fleet.is_enabled();
    let adapter_root = model.adapter_root(config.adapters.root.clone(), in_fleet)?;
    let backend =
        steps.run(&plan.backend, Backend::start(&model, &config.engine, &config.fleet, adapter_root.as_ref())).await?;
    let engine_facts = backend.in_process.as_ref().map(|(facts, _)| (&config.engine, facts));
    crate::model_facts::log_model_facts(
        &model.path,
        &served_model_name,
        backend.engine.model_info(),
        engine_facts,
        &chat_template,
    );

    let coordinator = steps
        .run(&plan.adapters, async {
            let initial = &config.adapters.initial;
            let adapters = adapters::initial_adapters(&model, initial, in_fleet, adapter_root.as_ref()).await?;
            let adapter_store = open_adapter_store(state_dir.as_deref(), config.engine.max_adapter_bytes).await?;
            let version_fetcher = HttpVersionFetcher::new(config.authentication.admin_key.clone())
                .map_err(|err| ServeError::State(StateError::Failed(format!("building the HTTP client: {err}"))))?;
            let coordinator_config = CoordinatorConfig {
                state,
                adapter_store: Some(adapter_store),
                version_fetcher: Some(Arc::new(version_fetcher)),
                retain_versions: config.adapters.retain_versions,
                max_loras: config.adapters.max_loras,
                ..coordinator_config(config.deadlines, config.limits, auth, adapter_root, &served_model_name)
            };
            let engine = match &config.engine_layer {
                Some(layer) => layer.wrap(backend.engine.clone()),
                None => backend.engine.clone(),
            };
            let coordinator = Coordinator::start(engine, coordinator_config).await?;
            adapters::load_initial_adapters(&coordinator, adapters).await?;
            Ok::<_, ServeError>(coordinator)
        })
        .await?;
    // What `ListReplicas` shows the other replicas sharing the state.
    coordinator.announce(grpc_addr, http_addr).await.map_err(|err| ServeError::Announce(err.to_string()))?;

    let front_settings = FrontSettings {
        served_model_name: served_model_name.clone(),
        connections: config.connections,
        tokenizer: backend.tokenizer,
        chat_template,
        fleet: backend.fleet,
        engine_metrics: backend.in_process.map(|(_, metrics)| metrics),
        tinker: config.tinker,
    };
    let http = starting.finish().await.map_err(|source| ServeError::Bind { address: http_addr, source })?;
    let listeners = Listeners { grpc, http, grpc_addr, http_addr };
    let Fronts { draining, stop, tasks: fronts } = Fronts::spawn(listeners, &coordinator, front_settings).await?;
    if let Some(interval) = config.log_stats_interval {
        tokio::spawn(crate::stats_log::log_stats(coordinator.clone(), interval, draining.clone()));
    }
    tracing::info!(%grpc_addr, %http_addr, model = %served_model_name, "serving");
    Ok(Serving {
        grpc_addr,
        http_addr,
        served_model_name,
        state_dir,
        coordinator,
        shutdown_grace: config.shutdown_grace,
        draining,
        stop,
        fronts,
    })
}

/// Logs what a shutdown found and did, as numbers an operator can act on.
fn log_shutdown_report(report: &ShutdownReport) {
    let ShutdownReport { in_flight, aborted, unacknowledged, held } = *report;
    let finished = in_flight.saturating_sub(aborted + unacknowledged);
    tracing::info!(
        in_flight,
        finished,
        aborted,
        unacknowledged,
        held,
        "shutdown: {in_flight} request(s) in flight at the signal: {finished} finished within the grace, {aborted} \
         aborted (handed back, retryable), {unacknowledged} not acknowledged in time; {held} held or waiting \
         failed with UNAVAILABLE"
    );
}

/// Opens the state the configuration names (a state directory, memory, or the state shared through etcd), and says
/// where it is recorded on disk, if it is.
async fn open_state(
    config: &ServeConfig,
    served_model_name: &str,
) -> Result<(Arc<dyn StateStore>, Option<PathBuf>), ServeError> {
    // A pause waits for the other replicas as long as for its own requests, plus a dead replica's lease.
    let replica_ack_timeout = config.deadlines.abort_ack_timeout + config.replica_lease;
    let (state, state_dir) = config.state.open(served_model_name, config.replica_lease, replica_ack_timeout).await?;
    if let Some(dir) = &state_dir {
        tracing::info!(state_dir = %dir.display(), "recording adapters, versions and pauses");
    }
    Ok((state, state_dir))
}

/// Opens the store of pushed adapter versions: `STATE_DIR/adapters/` when the state is kept in a directory (pushed
/// versions then survive a restart like the rest of the state), else a temporary directory removed when the server
/// stops (with `--state-dir none` or `--state etcd://…`, pushed versions last as long as the process).
pub(crate) async fn open_adapter_store(state_dir: Option<&Path>, max_bytes: u64) -> Result<AdapterStore, ServeError> {
    let dir = state_dir.map(|dir| dir.join("adapters"));
    let opened = tokio::task::spawn_blocking(move || match dir {
        Some(dir) => AdapterStore::open(&dir, max_bytes).map_err(|err| (Some(dir), err)),
        None => AdapterStore::temporary(max_bytes).map_err(|err| (None, err)),
    })
    .await
    .map_err(join_error)?;
    let store = opened.map_err(|(dir, err)| {
        let place = dir.map_or_else(|| "a temporary directory".to_owned(), |dir| dir.display().to_string());
        ServeError::State(StateError::Failed(format!("opening the adapter store in {place}: {err}")))
    })?;
    tracing::debug!(dir = %store.dir().display(), "pushed adapter versions are kept here");
    Ok(store)
}
