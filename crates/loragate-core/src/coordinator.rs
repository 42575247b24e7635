//! The coordinator: the one entry point the fronts use. It validates nothing itself (requests arrive validated),
//! finds the adapter, admits through its gate, starts the engine, and routes control operations to the adapter's
//! actor or the manager.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use futures::future::join_all;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef, SpawnErr};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::adapter::{AbortReport, AdapterHandle, AdapterStatus, Ending, Retirement};
use crate::adapter_source::{AdapterRoot, AdapterSource};
use crate::auth::Keyring;
use crate::engine::{Engine, ModelInfo};
use crate::error::{CoreError, Field};
use crate::ids::{AdapterKey, AdapterName, AdapterVersion};
use crate::limits::{Limits, LoadSnapshot, ServerLoad};
use crate::manager::{AdapterManager, AdapterMap, ManagerArgs, ManagerMsg};
use crate::metrics::CoreMetrics;
use crate::sample_stream::SampleStream;
use crate::sampling::{RawSampleRequest, SampleRequest};

/// Tunables of the coordinator.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// The longest a sampling request is held at a paused adapter's gate (clients may ask for less).
    pub max_gate_hold: Duration,
    /// How long an abort waits for its requests to be handed back before reporting the stragglers.
    pub abort_ack_timeout: Duration,
    /// The only directory `LoadLoraAdapter` may read from; `None` refuses every load by path.
    pub adapter_root: Option<AdapterRoot>,
    /// Caps on admitted and held sampling requests.
    pub limits: Limits,
    /// Who may do what, for every front (authentication is off with [`Keyring::open`]).
    pub auth: Keyring,
    /// Names no adapter may be loaded under: the base model's served names (an adapter under one could not be
    /// addressed, since the name samples the base model).
    pub reserved_names: Vec<String>,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            max_gate_hold: Duration::from_secs(120),
            abort_ack_timeout: Duration::from_secs(10),
            adapter_root: None,
            limits: Limits::default(),
            auth: Keyring::open(),
            reserved_names: Vec::new(),
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
    manager: ActorRef<ManagerMsg>,
    shutting_down: CancellationToken,
    live: Arc<LiveRequests>,
    metrics: Arc<CoreMetrics>,
    load: Arc<ServerLoad>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.manager.stop(Some("coordinator dropped".into()));
    }
}

impl Coordinator {
    /// Starts the adapter manager over `engine`, with the base model ready to serve.
    pub async fn start(engine: Arc<dyn Engine>, config: CoordinatorConfig) -> Result<Self, SpawnErr> {
        let published: AdapterMap = Arc::new(DashMap::new());
        let metrics = Arc::new(CoreMetrics::default());
        let load = ServerLoad::new(config.limits);
        let args = ManagerArgs {
            engine: engine.clone(),
            published: published.clone(),
            metrics: metrics.clone(),
            server_load: load.clone(),
        };
        let (manager, _join) = Actor::spawn(None, AdapterManager, args).await?;
        let inner = Inner {
            engine,
            config,
            published,
            manager,
            shutting_down: CancellationToken::new(),
            live: Arc::default(),
            metrics,
            load,
        };
        Ok(Self { inner: Arc::new(inner) })
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
        SampleRequest::parse(raw, self.model_info())
    }

    /// The adapter (or base model) `key` names.
    pub fn adapter(&self, key: &AdapterKey) -> Result<AdapterHandle, CoreError> {
        self.inner.published.get(key).map(|handle| handle.clone()).ok_or_else(|| CoreError::UnknownAdapter(key.clone()))
    }

    /// The loaded adapter `name` names.
    pub fn lora(&self, name: &AdapterName) -> Result<AdapterHandle, CoreError> {
        self.adapter(&AdapterKey::Lora(name.clone()))
    }

    /// When a request arriving now must stop waiting at a gate: its client's deadline, capped by the server's
    /// maximum hold.
    pub fn gate_deadline(&self, client_deadline: Option<Instant>) -> Instant {
        let server_limit = Instant::now() + self.inner.config.max_gate_hold;
        client_deadline.map_or(server_limit, |client| client.min(server_limit))
    }

    /// Samples: waits at the adapter's gate (until `hold_until` at most), registers the request, starts the engine.
    pub async fn sample(&self, request: SampleRequest, hold_until: Instant) -> Result<SampleStream, CoreError> {
        if self.inner.shutting_down.is_cancelled() {
            return Err(CoreError::ShuttingDown);
        }
        let live = LiveRequests::enter(&self.inner.live);
        let adapter = self.adapter(request.adapter())?;
        let admission = adapter.admit(request.id().clone(), hold_until).await?;
        let num_samples = request.num_samples();
        match self.inner.engine.generate(request, admission.cancel_token().clone()).await {
            Ok(events) => {
                let metrics = (adapter.cell().metrics.clone(), adapter.cell().labels.clone());
                Ok(SampleStream::new(num_samples, events, admission, live, metrics))
            }
            Err(err) => {
                admission.hand_back(Ending::Failed);
                Err(err.into())
            }
        }
    }

    /// Pauses `name` and aborts its admitted requests; see [`AdapterHandle::abort`].
    pub async fn abort(&self, name: &AdapterName) -> Result<AbortReport, CoreError> {
        self.lora(name)?.abort(self.inner.config.abort_ack_timeout).await
    }

    /// Reopens `name`; returns whether it was paused.
    pub async fn resume(&self, name: &AdapterName) -> Result<bool, CoreError> {
        self.lora(name)?.resume().await
    }

    /// Long-polls until `name` is open; returns whether it is still paused after `timeout`.
    pub async fn wait_unpaused(&self, name: &AdapterName, timeout: Duration) -> Result<bool, CoreError> {
        self.lora(name)?.wait_unpaused(timeout).await
    }

    /// Resolves a requested adapter path against the adapter root.
    pub async fn resolve_adapter_path(&self, requested: &str) -> Result<AdapterSource, CoreError> {
        match &self.inner.config.adapter_root {
            Some(root) => root.resolve(requested).await,
            None => Err(CoreError::invalid(
                Field::Path,
                "this server loads no adapters by path (start it with --adapter-root DIR)",
            )),
        }
    }

    /// Loads weights under `name` (new, or a swap); returns the new version. On error the old weights stay served.
    pub async fn load_adapter(&self, name: &AdapterName, source: AdapterSource) -> Result<AdapterVersion, CoreError> {
        if self.inner.shutting_down.is_cancelled() {
            return Err(CoreError::ShuttingDown);
        }
        self.check_loadable_name(name)?;
        let key = AdapterKey::Lora(name.clone());
        let name = name.clone();
        match self.inner.manager.call(|reply| ManagerMsg::Load { name, source, reply }, None).await {
            Ok(CallResult::Success(result)) => result,
            _ => Err(CoreError::AdapterUnavailable(key)),
        }
    }

    /// Loads weights under `name` from `requested_path` (resolved against the adapter root, see
    /// [`Coordinator::resolve_adapter_path`]); what `LoadLoraAdapter` does. The name is checked before the path.
    pub async fn load_adapter_at(&self, name: &AdapterName, requested_path: &str) -> Result<AdapterVersion, CoreError> {
        self.check_loadable_name(name)?;
        let source = self.resolve_adapter_path(requested_path).await?;
        self.load_adapter(name, source).await
    }

    /// Refuses the names reserved for the base model.
    fn check_loadable_name(&self, name: &AdapterName) -> Result<(), CoreError> {
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
        let key = AdapterKey::Lora(name.clone());
        let unload = {
            let name = name.clone();
            self.inner.manager.call(|reply| ManagerMsg::Unload { name, reply }, None).await
        };
        let pending = match unload {
            Ok(CallResult::Success(result)) => result?,
            _ => return Err(CoreError::AdapterUnavailable(key)),
        };
        let report = pending.wait(self.inner.config.abort_ack_timeout).await;
        if !report.unacknowledged.is_empty() {
            tracing::warn!(adapter = %name, unacknowledged = ?report.unacknowledged, "unload did not see every request handed back");
        }
        // Its requests were handed back: nothing records under its name any more.
        self.inner.metrics.forget_adapter(&key);
        self.inner.engine.unload_adapter(name).await?;
        Ok(())
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

    /// Whether [`Coordinator::shutdown`] has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.is_cancelled()
    }

    /// Stops serving: admits nothing new, lets running requests finish for up to `grace`, then aborts the rest
    /// (handing back their partial output) and fails held submissions and waiters with "shutting down".
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.shutting_down.cancel();
        let _ = tokio::time::timeout(grace, self.inner.live.all_done()).await;
        let handles: Vec<AdapterHandle> = self.inner.published.iter().map(|entry| entry.value().clone()).collect();
        let ack_timeout = self.inner.config.abort_ack_timeout;
        join_all(handles.iter().map(|handle| async move {
            if let Ok(pending) = handle.retire(Retirement::ShuttingDown).await {
                pending.wait(ack_timeout).await;
            }
        }))
        .await;
        let _ = self.inner.manager.stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(5))).await;
    }
}

/// Counts sampling requests between arrival and their stream's end, so shutdown can wait for them.
#[derive(Default)]
pub(crate) struct LiveRequests {
    count: AtomicUsize,
    idle: Notify,
}

impl LiveRequests {
    fn enter(this: &Arc<Self>) -> LiveRequest {
        this.count.fetch_add(1, Ordering::AcqRel);
        LiveRequest(this.clone())
    }

    async fn all_done(&self) {
        loop {
            let idle = self.idle.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// One live sampling request (see [`LiveRequests`]).
pub(crate) struct LiveRequest(Arc<LiveRequests>);

impl Drop for LiveRequest {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests;
