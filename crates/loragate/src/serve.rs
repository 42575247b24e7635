//! `loragate serve`: the engine (in-process, or a fleet of workers), the coordinator and both fronts, started
//! together in named steps (bind, open the state, start the engine or the fleet, the coordinator and the initial
//! adapters, spawn the fronts) and stopped gracefully.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::select_all;
use loragate_core::{AdapterStore, Coordinator, CoordinatorConfig, StateError, StateStore};
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
mod version_fetch;

use self::backend::Backend;
pub use self::config::ServeConfig;
use self::fronts::{FrontSettings, Fronts, Listeners};
use self::version_fetch::HttpVersionFetcher;

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
    /// Binds both addresses (first, so that a port clash fails before the model loads), opens the state, loads the
    /// model (or starts the fleet of workers), starts the coordinator with the start-up adapters, and spawns the
    /// fronts.
    pub async fn start(config: ServeConfig) -> Result<Self, ServeError> {
        let signals = ShutdownSignals::listen();
        let listeners = Listeners::bind(config.grpc_addr, config.http_addr).await?;
        let model = ResolvedModel::of(&config.model).await?;
        let served_model_name = config.served_model_name.clone().unwrap_or_else(|| model.name.clone());
        let auth = config.authentication.keyring()?;
        if auth.is_enabled() {
            tracing::info!("authentication is on: callers must present a key");
        }
        let chat_template = model.chat_template().await?;
        let (state, state_dir) = open_state(&config, &served_model_name).await?;

        let in_fleet = config.fleet.is_enabled();
        let adapter_root = model.adapter_root(config.adapters.root.clone(), in_fleet)?;
        let backend = Backend::start(&model, &config.engine, &config.fleet, adapter_root.as_ref()).await?;
        let engine_facts = backend.in_process.as_ref().map(|(facts, _)| (&config.engine, facts));
        crate::model_facts::log_model_facts(
            &model.path,
            &served_model_name,
            backend.engine.model_info(),
            engine_facts,
            &chat_template,
        );

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
            ..coordinator_config(config.deadlines, config.limits, auth, adapter_root, &served_model_name)
        };
        let coordinator = Coordinator::start(backend.engine.clone(), coordinator_config).await?;
        adapters::load_initial_adapters(&coordinator, adapters).await?;
        // What `ListReplicas` shows the other replicas sharing the state.
        let (grpc_addr, http_addr) = (listeners.grpc_addr, listeners.http_addr);
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
        let Fronts { draining, stop, tasks: fronts } = Fronts::spawn(listeners, &coordinator, front_settings).await?;
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
