//! The coordinator: the one entry point the fronts use. It validates nothing itself (requests arrive validated),
//! finds the adapter, admits through its gate, starts the engine, and routes control operations to the adapter's
//! actor or the manager.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use futures::future::join_all;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::adapter::{AdapterHandle, Admitted};
use crate::adapter_source::{AdapterRoot, AdapterSource};
use crate::adapter_store::AdapterStore;
use crate::auth::{Keyring, Principal};
use crate::contract::{
    AbortReport, AdapterKey, AdapterName, AdapterStatus, CoreError, Ending, Field, KvPolicy, ModelInfo, PauseId,
    PauseMode, PauseOwner, PauseReport, PauseRequest, RequestId, ResumeReport, Retirement, ShutdownReport,
    StalenessPolicy, StalenessStatus, VersionInfo,
};
use crate::engine::{Engine, Parking};
use crate::finished::{FinishedRequest, FinishedRequests};
use crate::gate_deadline::GateDeadline;
use crate::limits::{Limits, LoadSnapshot, ServerLoad};
use crate::manager::{AdapterManager, AdapterMap, ManagerArgs, ManagerHandle};
use crate::metrics::CoreMetrics;
use crate::sample_stream::{Driver, LiveRequests, SampleStream};
use crate::sampling::{RawSampleRequest, SampleRequest};
use crate::state::{MemoryStore, StateError, StateStore};
use crate::version_fetch::VersionFetcher;

mod abort;
mod fetch;
mod follow;
mod global_pause;
mod push;
mod restore;
mod swap;

pub use self::abort::AbortsRequested;
pub use self::push::PushUpload;
pub use self::restore::{Reconciled, RestoreReport, StartError};
pub use self::swap::SwapReport;

/// Tunables of the coordinator.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// The longest a sampling request is held at a paused adapter's gate (clients may ask for less).
    pub max_gate_hold: Duration,
    /// How long an abort waits for its requests to be handed back before reporting the stragglers.
    pub abort_ack_timeout: Duration,
    /// The longest a wait-mode pause waits for running requests to finish when its caller gave no deadline.
    pub max_pause_drain: Duration,
    /// The only directory `LoadLoraAdapter` may read from; `None` refuses every load by path.
    pub adapter_root: Option<AdapterRoot>,
    /// Caps on admitted and held sampling requests.
    pub limits: Limits,
    /// Who may do what, for every front (authentication is off with [`Keyring::open`]).
    pub auth: Keyring,
    /// Names no adapter may be loaded under: the base model's served names (an adapter under one could not be
    /// addressed, since the name samples the base model).
    pub reserved_names: Vec<String>,
    /// Where adapters, versions and pauses are recorded to survive a restart (see [`crate::state`]); in memory by
    /// default.
    pub state: Arc<dyn StateStore>,
    /// How many versions of each adapter stay loaded and servable to exact pins (`NAME@V`): the current one and
    /// `retain_versions − 1` older ones (`--retain-versions`; at least 1).
    pub retain_versions: usize,
    /// Where pushed adapter versions are kept ([`Coordinator::begin_push`]); `None` refuses pushes.
    pub adapter_store: Option<AdapterStore>,
    /// How this replica fetches the files of versions other replicas sharing its state store pushed (into
    /// `adapter_store`); `None`: it reads their recorded path, as for a version loaded by path.
    pub version_fetcher: Option<Arc<dyn VersionFetcher>>,
    /// The most LoRA adapters loaded (or loading) at once (`--max-loras`, vLLM's name): a load under a new name
    /// past it is refused ([`CoreError::TooManyAdapters`]) until one is unloaded; `None`: no cap. Adapters put back
    /// from the recorded state at start count, but are never refused.
    pub max_loras: Option<usize>,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            max_gate_hold: Duration::from_secs(120),
            abort_ack_timeout: Duration::from_secs(10),
            max_pause_drain: Duration::from_secs(600),
            adapter_root: None,
            limits: Limits::default(),
            auth: Keyring::open(),
            reserved_names: Vec::new(),
            state: Arc::new(MemoryStore::new()),
            retain_versions: 1,
            adapter_store: None,
            version_fetcher: None,
            max_loras: None,
        }
    }
}

/// The coordinator. Cheap to clone; every clone drives the same adapters.
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Arc<dyn Engine>,
    config: CoordinatorConfig,
    published: AdapterMap,
    manager: ManagerHandle,
    shutting_down: CancellationToken,
    live: Arc<LiveRequests>,
    metrics: Arc<CoreMetrics>,
    load: Arc<ServerLoad>,
    /// The newest finished requests, for [`Coordinator::finished_request`].
    finished: Arc<FinishedRequests>,
    /// This server's addresses, once its fronts are bound ([`Coordinator::announce`]).
    addresses: std::sync::OnceLock<(std::net::SocketAddr, std::net::SocketAddr)>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.manager.stop("coordinator dropped");
    }
}

impl Coordinator {
    /// Starts the adapter manager over `engine`, with the base model ready to serve, and puts back what
    /// [`CoordinatorConfig::state`] recorded: each recorded adapter at its recorded version (loaded into `engine`
    /// again from its recorded path), its pauses, and the global pause.
    pub async fn start(engine: Arc<dyn Engine>, config: CoordinatorConfig) -> Result<Self, StartError> {
        let published: AdapterMap = Arc::new(DashMap::new());
        let metrics = Arc::new(CoreMetrics::default());
        if let Some(max_loras) = config.max_loras {
            metrics.set_max_loras(max_loras);
        }
        let load = ServerLoad::new(config.limits);
        let args = ManagerArgs {
            engine: engine.clone(),
            published: published.clone(),
            metrics: metrics.clone(),
            server_load: load.clone(),
            state: config.state.clone(),
            retain_versions: config.retain_versions,
            max_loras: config.max_loras,
        };
        let manager = AdapterManager::start(args).await?;
        let inner = Inner {
            engine,
            config,
            published,
            manager,
            shutting_down: CancellationToken::new(),
            live: Arc::default(),
            metrics,
            load,
            finished: Arc::default(),
            addresses: std::sync::OnceLock::new(),
        };
        let coordinator = Self { inner: Arc::new(inner) };
        // Before the restore reads the record: a change another replica makes meanwhile is applied after it.
        let remote_changes = coordinator.inner.config.state.remote_changes();
        let restored = coordinator.restore().await?;
        if let Some(changes) = remote_changes {
            coordinator.follow(changes);
        }
        coordinator.collect_store_garbage().await;
        if restored != RestoreReport::default() {
            tracing::info!(
                adapters = restored.adapters,
                without_weights = restored.without_weights,
                pauses = restored.pauses,
                "restored the recorded state"
            );
        }
        Ok(coordinator)
    }

    /// The served model's limits.
    pub fn model_info(&self) -> &ModelInfo {
        self.inner.engine.model_info()
    }

    /// The coordinator's configuration.
    pub fn config(&self) -> &CoordinatorConfig {
        &self.inner.config
    }

    /// The coordinator's metrics (register them in a Prometheus registry; refresh the state gauges with
    /// [`CoreMetrics::set_adapter_gauges`] from [`Coordinator::statuses`] when scraped).
    pub fn metrics(&self) -> &CoreMetrics {
        &self.inner.metrics
    }

    /// Who may do what: every front authenticates callers and authorises their requests with it.
    pub fn auth(&self) -> &Keyring {
        &self.inner.config.auth
    }

    /// How many sampling requests are admitted and held now, over every adapter and the base model (see
    /// [`Limits`]).
    pub fn load(&self) -> LoadSnapshot {
        self.inner.load.snapshot()
    }

    /// Validates a raw sampling request against the served model.
    pub fn parse_sample(&self, raw: RawSampleRequest) -> Result<SampleRequest, CoreError> {
        let request = SampleRequest::parse(raw, self.model_info())?;
        // `NAME@V` pins version V of NAME, unless an adapter is loaded under that very name (a fleet's worker holds
        // its versions as `NAME@V` adapters).
        match request.pin_spelled() {
            Some((name, version)) if self.adapter(request.adapter()).is_err() && self.lora(&name).is_ok() => {
                request.pinned(name, version)
            }
            _ => Ok(request),
        }
    }

    /// The adapter (or base model) `key` names.
    pub fn adapter(&self, key: &AdapterKey) -> Result<AdapterHandle, CoreError> {
        self.inner.published.get(key).map(|handle| handle.clone()).ok_or_else(|| CoreError::UnknownAdapter(key.clone()))
    }

    /// The loaded adapter `name` names.
    pub fn lora(&self, name: &AdapterName) -> Result<AdapterHandle, CoreError> {
        self.adapter(&AdapterKey::Lora(name.clone()))
    }

    /// The waiting limits of a request arriving now: its client's deadline, and the server's maximum hold per wait.
    pub fn gate_deadline(&self, client_deadline: Option<Instant>) -> GateDeadline {
        GateDeadline::new(client_deadline, self.inner.config.max_gate_hold)
    }

    /// Samples: waits at the adapter's gate (see [`GateDeadline`]), registers the request, starts the engine, and
    /// hands the request to its driver, which continues the sequences a keep-mode pause stops.
    pub async fn sample(&self, request: SampleRequest, deadline: GateDeadline) -> Result<SampleStream, CoreError> {
        if self.inner.shutting_down.is_cancelled() {
            return Err(CoreError::ShuttingDown);
        }
        let arrived = std::time::Instant::now();
        let live = LiveRequests::enter(&self.inner.live);
        let adapter = self.adapter(request.adapter())?;
        let (id, wanted, sequences) = (request.id().clone(), request.wanted(), request.num_samples());
        let Admitted { admission, pin, staleness } =
            adapter.admit_request(id, wanted, sequences, deadline.hold_until()).await?;
        let parking = Parking { park_on_cancel: admission.park_signal().clone(), resume_from: None };
        match self.inner.engine.generate_parking(request.clone(), admission.cancel_token().clone(), parking).await {
            Ok(events) => {
                let finished = self.inner.finished.clone();
                let driver =
                    Driver::new(self.inner.engine.clone(), adapter, request, deadline, live, arrived, finished)
                        .holding(pin, staleness);
                Ok(SampleStream::spawn(driver, admission, events))
            }
            Err(err) => {
                admission.hand_back(Ending::Failed);
                Err(err.into())
            }
        }
    }

    /// A recently finished request `id` (the newest [`crate::FINISHED_REQUESTS_KEPT`] are kept) that `caller` may
    /// read: its sequences' finish reasons and version segments. `None` when it is unknown, forgotten, still running
    /// or someone else's (callers cannot tell which).
    pub fn finished_request(&self, id: &RequestId, caller: &Principal) -> Option<Arc<FinishedRequest>> {
        self.inner.finished.find(id).filter(|request| request.readable_by(caller))
    }

    /// Sets (or, with `None`, clears) `name`'s staleness bound at its current version (see
    /// [`crate::StalenessPolicy`]); answers with the bound's state. Recorded like a pause.
    pub async fn set_staleness(
        &self,
        name: &AdapterName,
        policy: Option<StalenessPolicy>,
    ) -> Result<Option<StalenessStatus>, CoreError> {
        self.inner.config.state.check_available()?;
        let adapter = self.lora(name)?;
        adapter.set_staleness(policy).await?;
        Ok(adapter.status().await?.staleness)
    }

    /// Pauses `name` (see [`AdapterHandle::pause`]). A wait-mode pause waits until the caller's `client_deadline`,
    /// at most [`CoordinatorConfig::max_pause_drain`]. The request's KV policy is replaced by the one applied (see
    /// [`Coordinator::kv_policy_applied`]), which the report echoes.
    pub async fn pause(
        &self,
        name: &AdapterName,
        request: PauseRequest,
        client_deadline: Option<Instant>,
    ) -> Result<PauseReport, CoreError> {
        let kv_policy = self.kv_policy_applied(request.mode, request.kv_policy);
        let request = request.with_kv_policy(kv_policy);
        let (owner, lease) = (request.owner.clone(), request.lease);
        let adapter = self.lora(name)?;
        self.inner.config.state.check_available()?;
        let report =
            adapter.pause(request, self.inner.config.abort_ack_timeout, self.drain_until(client_deadline)).await?;
        // A swap's own pause is part of the swap, logged as one.
        if !matches!(owner, PauseOwner::Swap(_)) {
            tracing::info!(
                adapter = %name,
                mode = report.mode.as_str(),
                %owner,
                lease_s = lease.map_or(0.0, |lease| lease.as_secs_f64()),
                pause_id = %report.pause_id,
                kv_policy = report.kv_policy.as_str(),
                aborted = report.aborted.len(),
                kept = report.kept.len(),
                unacknowledged = report.unacknowledged.len(),
                "adapter paused"
            );
        }
        Ok(report)
    }

    /// Drops the engine's cached prompt prefixes that no running sequence uses ([`Engine::reset_prefix_cache`]);
    /// returns how many cache blocks were dropped.
    pub fn reset_prefix_cache(&self) -> usize {
        self.inner.engine.reset_prefix_cache()
    }

    /// The KV policy a pause in `mode` that asked for `requested` applies on this server's engine: REUSE only in
    /// keep mode on an engine that can park ([`Engine::can_park`]), RECOMPUTE otherwise.
    pub fn kv_policy_applied(&self, mode: PauseMode, requested: KvPolicy) -> KvPolicy {
        requested.applied(mode, self.inner.engine.can_park())
    }

    /// Pauses `name` in abort mode, anonymously: `AbortLoraRequests` as it was before pause modes.
    pub async fn abort(&self, name: &AdapterName) -> Result<PauseReport, CoreError> {
        self.pause(name, PauseRequest::new(PauseMode::Abort), None).await
    }

    /// Releases the pause `pause_id` of `name`, or every pause of it for `None`.
    pub async fn resume(&self, name: &AdapterName, pause_id: Option<PauseId>) -> Result<ResumeReport, CoreError> {
        let released = pause_id.as_ref().map_or_else(|| "(every pause)".to_owned(), PauseId::to_string);
        let adapter = self.lora(name)?;
        self.inner.config.state.check_available()?;
        let report = adapter.resume(pause_id).await?;
        let ResumeReport { was_paused, still_paused } = report;
        if was_paused {
            tracing::info!(adapter = %name, released, still_paused, "adapter resumed");
        } else {
            tracing::debug!(adapter = %name, released, "resume of an open adapter: nothing to do");
        }
        Ok(report)
    }

    /// Long-polls until `name` is open; returns whether it is still paused after `timeout`.
    pub async fn wait_unpaused(&self, name: &AdapterName, timeout: Duration) -> Result<bool, CoreError> {
        self.lora(name)?.wait_unpaused(timeout).await
    }

    fn drain_until(&self, client_deadline: Option<Instant>) -> Instant {
        let server_limit = Instant::now() + self.inner.config.max_pause_drain;
        client_deadline.map_or(server_limit, |client| client.min(server_limit))
    }

    /// Resolves a path `caller` asked to load from against the adapter root: a tenant key only within its own
    /// directories ([`Principal::check_adapter_path`]), checked as spelled before the disk is looked at (so a refusal
    /// says nothing about what exists outside them) and again once symlinks are resolved.
    pub async fn resolve_adapter_path(&self, caller: &Principal, requested: &str) -> Result<AdapterSource, CoreError> {
        let root = self.adapter_root()?;
        caller.check_adapter_path(root.path(), std::path::Path::new(requested), requested)?;
        let source = root.resolve(requested).await?;
        caller.check_adapter_path(root.path(), source.dir(), requested)?;
        Ok(source)
    }

    /// Resolves a recorded path against this replica's adapter root (no caller: the path was checked when it was
    /// loaded).
    pub(crate) async fn resolve_recorded_path(&self, recorded: &str) -> Result<AdapterSource, CoreError> {
        self.adapter_root()?.resolve(recorded).await
    }

    fn adapter_root(&self) -> Result<&AdapterRoot, CoreError> {
        self.inner.config.adapter_root.as_ref().ok_or_else(|| {
            CoreError::invalid(Field::Path, "this server loads no adapters by path (start it with --adapter-root DIR)")
        })
    }

    /// Loads weights under `name` (new, or a swap); returns the new version with its identity. On error the old
    /// weights stay served.
    /// A failed load logs one WARN with the adapter, the source and the reason.
    pub async fn load_adapter(&self, name: &AdapterName, source: AdapterSource) -> Result<VersionInfo, CoreError> {
        let origin = source.origin();
        let loaded = self.install_logged(name, source).await;
        if let Err(err) = &loaded {
            tracing::warn!(adapter = %name, source = %origin, reason = %err, "adapter load failed");
        }
        loaded
    }

    /// [`Coordinator::install`] with its INFO line once loaded: the source, the SHA-256, the size, the load time.
    async fn install_logged(&self, name: &AdapterName, source: AdapterSource) -> Result<VersionInfo, CoreError> {
        let started = std::time::Instant::now();
        let installed = self.install(name, source).await?;
        tracing::info!(
            adapter = %name,
            version = %installed.version,
            source = %installed.origin,
            sha256 = %installed.sha256.map(|sha| sha.to_hex()).unwrap_or_default(),
            bytes = installed.bytes.unwrap_or_default(),
            load_ms = started.elapsed().as_millis(),
            "adapter loaded"
        );
        Ok(installed)
    }

    /// [`Coordinator::load_adapter`] without its log line (a swap logs itself).
    async fn install(&self, name: &AdapterName, source: AdapterSource) -> Result<VersionInfo, CoreError> {
        if self.inner.shutting_down.is_cancelled() {
            return Err(CoreError::ShuttingDown);
        }
        self.check_loadable_name(name)?;
        self.inner.config.state.check_available()?;
        self.inner.manager.load(name.clone(), source).await
    }

    /// Loads weights under `name` from `requested_path` (resolved against the adapter root for `caller`, see
    /// [`Coordinator::resolve_adapter_path`]); what `LoadLoraAdapter` does. The name is checked before the path.
    pub async fn load_adapter_at(
        &self,
        caller: &Principal,
        name: &AdapterName,
        requested_path: &str,
    ) -> Result<VersionInfo, CoreError> {
        let resolved = match self.check_loadable_name(name) {
            Ok(()) => self.resolve_adapter_path(caller, requested_path).await,
            Err(err) => Err(err),
        };
        match resolved {
            Ok(source) => self.load_adapter(name, source).await,
            Err(err) => {
                tracing::warn!(adapter = %name, source = requested_path, reason = %err, "adapter load failed");
                Err(err)
            }
        }
    }

    /// Refuses the names reserved for the base model ([`CoordinatorConfig::reserved_names`]); every load does, and a
    /// front checks it before resolving a path so that the error names the name.
    pub fn check_loadable_name(&self, name: &AdapterName) -> Result<(), CoreError> {
        if self.inner.config.reserved_names.iter().any(|reserved| reserved == name.as_str()) {
            return Err(CoreError::invalid(
                Field::LoraName,
                format!("{name:?} is the base model's served name; an adapter under it could not be addressed"),
            ));
        }
        Ok(())
    }

    /// Unloads `name`: aborts its admitted requests (waiting for their hand-back), fails its held submissions and
    /// waiters, and frees its weights.
    pub async fn unload_adapter(&self, name: &AdapterName) -> Result<(), CoreError> {
        self.inner.config.state.check_available()?;
        let unloaded = self.unload(name, true).await;
        self.collect_store_garbage_in_background();
        unloaded
    }

    /// [`Coordinator::unload_adapter`], recording the unload unless another replica did (`record` false).
    async fn unload(&self, name: &AdapterName, record: bool) -> Result<(), CoreError> {
        let key = AdapterKey::Lora(name.clone());
        let unloading = self.inner.manager.unload(name.clone(), record).await?;
        // The rest runs on its own task, so a caller that goes away midway leaves no weights behind.
        let (engine, metrics) = (self.inner.engine.clone(), self.inner.metrics.clone());
        let (ack_timeout, name) = (self.inner.config.abort_ack_timeout, name.clone());
        let finish = tokio::spawn(async move {
            let (pending, recorded) = match unloading.retired.await.ok().and_then(Result::ok) {
                Some(retired) => (retired.pending, Some(retired.recorded)),
                None => (Default::default(), None),
            };
            pending.wait(ack_timeout).await.warn_if_unacknowledged(&key, "unload");
            // Its requests were handed back: nothing records under its name any more.
            metrics.forget_adapter(&key);
            // Only the unloaded adapter's versions: a reload of the name that raced this unload keeps its weights. A
            // load of the unloaded adapter still in progress removes its own weights once it sees the flag.
            unloading.cell.release_weights();
            engine.unload_adapter(&name, unloading.last_version).await?;
            if let Some(recorded) = recorded {
                recorded.await?;
            }
            tracing::info!(adapter = %name, "adapter unloaded");
            Ok::<(), CoreError>(())
        });
        match finish.await {
            Ok(result) => result,
            // Only a runtime shutting down cancels the task (nothing in it panics).
            Err(_) => Err(CoreError::ShuttingDown),
        }
    }

    /// Snapshots of every loaded adapter (not the base model), ordered by name.
    pub async fn list_adapters(&self) -> Vec<AdapterStatus> {
        let mut statuses = self.statuses().await;
        statuses.retain(|status| status.key != AdapterKey::Base);
        statuses
    }

    /// Snapshots of every published adapter and the base model, ordered (base model first).
    pub async fn statuses(&self) -> Vec<AdapterStatus> {
        let handles: Vec<AdapterHandle> = self.inner.published.iter().map(|entry| entry.value().clone()).collect();
        let mut statuses: Vec<AdapterStatus> =
            join_all(handles.iter().map(AdapterHandle::status)).await.into_iter().filter_map(Result::ok).collect();
        statuses.sort_by(|a, b| a.key.cmp(&b.key));
        statuses
    }

    /// Whether the state store works now (see [`StateStore::health`]): health checks report an error as unhealthy,
    /// since control calls cannot be recorded meanwhile.
    pub fn state_health(&self) -> Result<(), StateError> {
        self.inner.config.state.health()
    }

    /// Whether [`Coordinator::shutdown`] has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.is_cancelled()
    }

    /// Stops serving: admits nothing new, lets running requests finish for up to `grace`, then aborts the rest
    /// (handing back their partial output) and fails held submissions and waiters with "shutting down". Says how
    /// many requests it found, aborted and failed.
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        self.inner.shutting_down.cancel();
        let in_flight = self.statuses().await.iter().map(|status| status.in_flight as usize).sum();
        let _ = tokio::time::timeout(grace, self.inner.live.all_done()).await;
        let held =
            self.statuses().await.iter().map(|status| (status.held + status.waiting + status.kept) as usize).sum();
        let handles: Vec<AdapterHandle> = self.inner.published.iter().map(|entry| entry.value().clone()).collect();
        let ack_timeout = self.inner.config.abort_ack_timeout;
        let reports = join_all(handles.iter().map(|handle| async move {
            match handle.retire(Retirement::ShuttingDown).await {
                Ok(pending) => pending.wait(ack_timeout).await,
                Err(_) => AbortReport::default(),
            }
        }))
        .await;
        let mut report = ShutdownReport { in_flight, held, ..ShutdownReport::default() };
        for abort in reports {
            report.aborted += abort.aborted.len() + abort.kept.len();
            report.unacknowledged += abort.unacknowledged.len();
        }
        self.inner.manager.stop_and_wait("shutdown", Duration::from_secs(5)).await;
        if let Err(err) = self.inner.config.state.leave().await {
            tracing::warn!(%err, "could not leave the replicas sharing the state; they stop counting this one later");
        }
        report
    }
}

#[cfg(test)]
mod tests;
