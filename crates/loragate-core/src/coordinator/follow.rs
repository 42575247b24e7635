//! Following the other replicas of a shared state store: the changes they make ([`RemoteChange`]) are applied to
//! this replica's engine and gates without being recorded again, in the order the store delivers them. Gate changes
//! (pauses made and ended) are applied in order before the next change is read; engine work (loading another
//! replica's new version) and waiting for hand-backs run on their own tasks, so a slow load never delays a pause.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use futures::future::BoxFuture;
use tokio::sync::mpsc;

use super::{Coordinator, Inner};
use crate::adapter::{ReleaseTarget, Servable};
use crate::adapter_source::{AdapterSource, CONFIG_FILE, WEIGHTS_FILE};
use crate::contract::{
    AbortReport, AdapterKey, AdapterName, AdapterVersion, CoreError, PauseId, PauseOwner, Sha256, StalenessPolicy,
};
use crate::manager::RestoredAdapter;
use crate::state::{PauseRecord, RecordedSource, RecordedState, RemoteChange, ReplicaRecord};

impl Coordinator {
    /// Applies the other replicas' changes until the store's stream ends or the coordinator is dropped.
    pub(super) fn follow(&self, mut changes: mpsc::UnboundedReceiver<RemoteChange>) {
        let inner: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            while let Some(change) = changes.recv().await {
                let Some(inner) = inner.upgrade() else { return };
                Coordinator { inner }.apply_remote(change).await;
            }
        });
    }

    async fn apply_remote(&self, change: RemoteChange) {
        match change {
            RemoteChange::Paused { record, acknowledge } => {
                let handed_back = self.adopt_remote_pause(record).await;
                tokio::spawn(async move {
                    let _ = acknowledge.send(handed_back.await);
                });
            }
            RemoteChange::PauseEnded { adapter, pause_id } => self.end_remote_pause(&adapter, pause_id).await,
            RemoteChange::Installed { name, version, source } => {
                let coordinator = self.clone();
                tokio::spawn(async move { coordinator.install_remote(name, version, source).await });
            }
            RemoteChange::Unloaded { name } => {
                let coordinator = self.clone();
                tokio::spawn(async move {
                    match coordinator.unload(&name, false).await {
                        Ok(()) | Err(CoreError::UnknownAdapter(_)) => {}
                        Err(err) => tracing::warn!(adapter = %name, %err, "applying another replica's unload failed"),
                    }
                });
            }
            RemoteChange::Staleness { name, policy } => {
                if let Ok(handle) = self.lora(&name)
                    && let Err(err) = handle.follow_staleness(policy).await
                {
                    tracing::warn!(adapter = %name, %err, "applying another replica's staleness bound failed");
                }
            }
            RemoteChange::Resynced(recorded) => self.resync(recorded).await,
        }
    }

    /// Closes `record.adapter`'s gate under the remote pause and acts on its admitted requests; the returned future
    /// resolves with what they handed back (nothing for an adapter this replica does not serve).
    async fn adopt_remote_pause(&self, record: PauseRecord) -> BoxFuture<'static, AbortReport> {
        let ack_timeout = self.inner.config.abort_ack_timeout;
        let adapter = record.adapter.clone();
        let pending = match self.lora(&adapter) {
            Ok(handle) => handle.adopt_remote(record).await.ok(),
            // Not served here (yet): a later install finds the pause in the record.
            Err(_) => None,
        };
        Box::pin(async move {
            match pending {
                Some(pending) => {
                    let report = pending.wait(ack_timeout).await;
                    report.warn_if_unacknowledged(&AdapterKey::Lora(adapter), "another replica's pause");
                    report
                }
                None => AbortReport::default(),
            }
        })
    }

    async fn end_remote_pause(&self, adapter: &AdapterName, pause_id: PauseId) {
        if let Ok(handle) = self.lora(adapter)
            && let Err(err) = handle.release(ReleaseTarget::Remote(pause_id)).await
        {
            tracing::warn!(%adapter, %err, "applying the end of another replica's pause failed");
        }
    }

    /// Loads `version` of `name` into this engine, then serves it: publishes a new adapter (with the pauses the
    /// record holds for it), or moves a served one to it (an older version than it serves changes nothing). Weights
    /// another replica pushed are fetched from it first (`coordinator/fetch.rs`).
    async fn install_remote(&self, name: AdapterName, version: AdapterVersion, source: RecordedSource) {
        if let Ok(handle) = self.lora(&name)
            && handle.gate().version >= version
        {
            return;
        }
        if let Some(holder) = self.fetch_from(&source) {
            let holder = holder.to_owned();
            return self.follow_pushed(name, version, source, holder).await;
        }
        let loaded = match self.recorded_source(&source).await {
            Ok(weights) => self.load_remote(&name, version, &weights).await,
            Err(err) => Err(err),
        };
        let loaded = loaded.map_err(|err| {
            tracing::error!(adapter = %name, %version, %err, "could not load another replica's new version");
            let path = source.path.display();
            format!("another replica loaded {version} from {path}; this one could not: {err}")
        });
        self.serve_remote(&name, version, loaded).await;
    }

    /// Serves `version` of `name`, loaded into this engine (or, with an error, not): a served adapter moves to it (a
    /// served adapter keeps what it serves on an error); a new one is published, with the pauses the record holds
    /// for it and, on an error, with it as its `weights_error`.
    pub(super) async fn serve_remote(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
        loaded: Result<Servable, String>,
    ) {
        if let Ok(handle) = self.lora(name) {
            if let Ok(servable) = loaded
                && let Err(err) = handle.install_remote(servable).await
            {
                tracing::warn!(adapter = %name, %err, "serving another replica's new version failed");
            }
            return;
        }
        let pauses = match self.inner.config.state.recorded().await {
            Ok(recorded) => recorded.pauses.into_iter().filter(|pause| &pause.adapter == name).collect(),
            Err(err) => {
                tracing::warn!(adapter = %name, %err, "could not read the new adapter's pauses");
                Vec::new()
            }
        };
        let (servable, weights_error) = match loaded {
            Ok(servable) => (vec![servable], None),
            Err(reason) => (Vec::new(), Some(reason)),
        };
        let staleness = self.recorded_staleness(name).await;
        let restored = RestoredAdapter { name: name.clone(), version, servable, weights_error, pauses, staleness };
        if self.inner.manager.restore(restored).await.is_err() {
            tracing::warn!(adapter = %name, "could not publish another replica's new adapter");
        }
    }

    /// The staleness bound the record holds for `name`, if any.
    async fn recorded_staleness(&self, name: &AdapterName) -> Option<StalenessPolicy> {
        let recorded = self.inner.config.state.recorded().await.ok()?;
        recorded.adapters.into_iter().find(|record| &record.name == name)?.staleness
    }

    /// Where a recorded source's weights are, for this replica (a path from a request is confined to this replica's
    /// adapter root again; pushed weights are in the adapter store, with their known digest).
    pub(super) async fn recorded_source(&self, source: &RecordedSource) -> Result<AdapterSource, CoreError> {
        match (source.pushed, source.sha256, source.bytes) {
            (true, Some(sha256), Some(bytes)) => Ok(self.pushed_here(&source.path, sha256, bytes)),
            _ if source.confined => self.resolve_recorded_path(&source.path.to_string_lossy()).await,
            _ => Ok(AdapterSource::trusted(&source.path)),
        }
    }

    /// Pushed weights recorded at `path`: this replica's own copy in its adapter store when it holds one under the
    /// same (content) name (a version fetched from another replica), else `path`.
    fn pushed_here(&self, path: &std::path::Path, sha256: Sha256, bytes: u64) -> AdapterSource {
        let here = self
            .inner
            .config
            .adapter_store
            .as_ref()
            .zip(path.file_name())
            .map(|(store, name)| store.blobs_dir().join(name));
        match here {
            Some(dir) if dir.join(WEIGHTS_FILE).is_file() && dir.join(CONFIG_FILE).is_file() => {
                AdapterSource::pushed(dir, sha256, bytes)
            }
            _ => AdapterSource::pushed(path, sha256, bytes),
        }
    }

    /// Makes this replica match the record after the store could not follow the others for a while: newer versions
    /// are loaded, adapters no longer recorded are unloaded, recorded pauses are adopted (acting on admitted requests)
    /// and named pauses no longer recorded are released.
    async fn resync(&self, recorded: RecordedState) {
        let mut pauses: HashMap<AdapterName, Vec<PauseRecord>> = HashMap::new();
        for pause in recorded.pauses {
            pauses.entry(pause.adapter.clone()).or_default().push(pause);
        }
        let recorded_names: HashSet<AdapterName> = recorded.adapters.iter().map(|record| record.name.clone()).collect();
        for status in self.list_adapters().await {
            let AdapterKey::Lora(name) = &status.key else { continue };
            if !recorded_names.contains(name) {
                let coordinator = self.clone();
                let name = name.clone();
                tokio::spawn(async move { coordinator.unload(&name, false).await });
                continue;
            }
            let recorded_ids: HashSet<&PauseId> =
                pauses.get(name).into_iter().flatten().map(|pause| &pause.pause_id).collect();
            for pause in &status.pauses {
                if matches!(pause.owner, PauseOwner::Named(_)) && !recorded_ids.contains(&pause.pause_id) {
                    self.end_remote_pause(name, pause.pause_id.clone()).await;
                }
            }
            let local_ids: HashSet<&PauseId> = status.pauses.iter().map(|pause| &pause.pause_id).collect();
            for pause in pauses.get(name).into_iter().flatten() {
                if !local_ids.contains(&pause.pause_id) {
                    drop(self.adopt_remote_pause(pause.clone()).await);
                }
            }
        }
        for record in recorded.adapters {
            let (coordinator, name) = (self.clone(), record.name.clone());
            tokio::spawn(async move { coordinator.install_remote(name, record.version, record.source).await });
        }
    }

    /// Tells the state store (and so the other replicas) where this server's fronts listen; `ListReplicas` shows
    /// them. Called once the fronts are bound.
    pub async fn announce(
        &self,
        grpc_addr: std::net::SocketAddr,
        http_addr: std::net::SocketAddr,
    ) -> Result<(), CoreError> {
        let _ = self.inner.addresses.set((grpc_addr, http_addr));
        self.inner.config.state.announce(grpc_addr, http_addr).await?;
        Ok(())
    }

    /// The live replicas sharing this server's state store, this one included (marked); just this one for a store
    /// only it uses.
    pub async fn replicas(&self) -> Result<Vec<ReplicaRecord>, CoreError> {
        let replicas = self.inner.config.state.replicas().await?;
        if !replicas.is_empty() {
            return Ok(replicas);
        }
        let (grpc_addr, http_addr) =
            self.inner.addresses.get().map(|(grpc, http)| (grpc.to_string(), http.to_string())).unwrap_or_default();
        Ok(vec![ReplicaRecord { id: "standalone".into(), grpc_addr, http_addr, this_replica: true }])
    }
}
