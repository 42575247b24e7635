//! Pushed adapter versions: a push is received into the adapter store ([`crate::adapter_store`]) while it is
//! checked, then installed as a swap (a name never loaded before is a plain load); the store's directories no
//! recorded version refers to any more are collected after each push, each unload and at start.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::time::Instant;

use super::{Coordinator, SwapReport};
use crate::adapter_source::AdapterSource;
use crate::adapter_store::{
    AdapterLayout, AdapterStore, GrowingFile, LayoutCheck, Preparation, PushHeader, Receiver, check_push_name,
};
use crate::contract::{AdapterKey, AdapterName, AdapterVersion, CoreError, Field, KvPolicy, PauseMode};
use crate::state::RecordedSource;

/// A push being received for one adapter: feed it the weights' bytes ([`PushUpload::write`]), then hand it to
/// [`Coordinator::finish_push`]. Dropping it (a client gone midway) leaves nothing behind.
#[derive(Debug)]
pub struct PushUpload {
    name: AdapterName,
    receiver: Receiver,
    /// When the push began: its phases are logged at DEBUG (`adapter push timing`).
    began: Instant,
}

impl PushUpload {
    /// The adapter pushed to.
    pub fn name(&self) -> &AdapterName {
        &self.name
    }

    /// Takes the next bytes of `adapter_model.safetensors` (see [`Receiver::write`]).
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), CoreError> {
        let written = self.receiver.write(chunk).await;
        if let Err(err) = &written {
            tracing::warn!(adapter = %self.name, source = "push", reason = %err, "adapter push failed");
        }
        written
    }
}

impl Coordinator {
    /// Where pushed versions are kept, if this server takes pushes.
    pub fn adapter_store(&self) -> Option<&AdapterStore> {
        self.inner.config.adapter_store.as_ref()
    }

    /// Starts receiving a push to `name`, declared by `header`. Refuses at once a name that cannot take one, a
    /// server that is stopping or has no adapter store, and a declared size over the limit.
    pub async fn begin_push(&self, name: &AdapterName, header: PushHeader) -> Result<PushUpload, CoreError> {
        let begun = self.start_push(name, header).await;
        if let Err(err) = &begun {
            tracing::warn!(adapter = %name, source = "push", reason = %err, "adapter push failed");
        }
        begun
    }

    /// [`Coordinator::begin_push`] without its warning on failure.
    async fn start_push(&self, name: &AdapterName, header: PushHeader) -> Result<PushUpload, CoreError> {
        if self.is_shutting_down() {
            return Err(CoreError::ShuttingDown);
        }
        check_push_name(name.as_str())?;
        self.receive_push(name, header).await
    }

    /// Starts receiving a push to a fleet worker's `NAME@V` (the engine-side name of version V of a fleet adapter,
    /// which a fleet coordinator pushes to its `loragate worker`s): as [`Coordinator::begin_push`], with exactly one
    /// `@` followed by the version's digits allowed after a name that could take a push.
    pub async fn begin_versioned_push(&self, name: &AdapterName, header: PushHeader) -> Result<PushUpload, CoreError> {
        if self.is_shutting_down() {
            return Err(CoreError::ShuttingDown);
        }
        let versioned = name.as_str().rsplit_once('@').filter(|(base, version)| {
            !base.is_empty() && !version.is_empty() && version.bytes().all(|byte| byte.is_ascii_digit())
        });
        let Some((base, _)) = versioned else {
            return Err(CoreError::invalid(Field::LoraName, format!("{name:?} is not a versioned name NAME@VERSION")));
        };
        check_push_name(base)?;
        self.receive_push(name, header).await
    }

    async fn receive_push(&self, name: &AdapterName, header: PushHeader) -> Result<PushUpload, CoreError> {
        self.check_loadable_name(name)?;
        let Some(store) = &self.inner.config.adapter_store else {
            return Err(CoreError::invalid(Field::LoraName, "this server takes no pushed adapters"));
        };
        let receiver = self.receive_into(store, header).await?;
        Ok(PushUpload { name: name.clone(), receiver, began: Instant::now() })
    }

    /// Starts receiving weights declared by `header` into `store` (a push, or a version fetched from another replica),
    /// with the engine checking their layout once their header arrives ([`crate::Engine::check_adapter_layout`]) and
    /// reading them as they arrive ([`crate::Engine::prepare_pushed_adapter`]).
    pub(super) async fn receive_into(&self, store: &AdapterStore, header: PushHeader) -> Result<Receiver, CoreError> {
        let engine = self.inner.engine.clone();
        let check: LayoutCheck =
            Arc::new(move |layout: &AdapterLayout| engine.check_adapter_layout(layout).map_err(CoreError::from));
        let engine = self.inner.engine.clone();
        let preparation: Preparation =
            Arc::new(move |layout: &AdapterLayout, file: GrowingFile| engine.prepare_pushed_adapter(layout, file));
        Ok(store.receive(header, check).await?.prepared_by(preparation))
    }

    /// Ends a push: checks the whole file and its SHA-256, moves it into the store and installs it as
    /// [`Coordinator::swap_adapter`] does in `mode` (a new name is loaded). On any error the old version keeps
    /// serving and nothing of the push is kept. Every failure logs one WARN (a failed swap of the pushed weights as
    /// `adapter swap failed`, source `push`).
    pub async fn finish_push(
        &self,
        upload: PushUpload,
        mode: PauseMode,
        kv_policy: KvPolicy,
        client_deadline: Option<Instant>,
    ) -> Result<SwapReport, CoreError> {
        let PushUpload { name, receiver, began } = upload;
        let received = Instant::now();
        let stored = receiver.finish().await.inspect_err(|err| {
            tracing::warn!(adapter = %name, source = "push", reason = %err, "adapter push failed");
        })?;
        let stored_at = Instant::now();
        let swapped = self.swap_adapter(&name, stored.source.clone(), mode, kv_policy, client_deadline).await;
        drop(stored.lease);
        drop(stored.prepared);
        // Where a push's time goes beyond the load's: receiving (and hashing and writing meanwhile), making the file
        // durable and moving it into place, then the install (the same as a swap from a path).
        tracing::debug!(
            adapter = %name,
            bytes = stored.bytes,
            receive_ms = millis(received - began),
            store_ms = millis(stored_at - received),
            install_ms = millis(stored_at.elapsed()),
            "adapter push timing"
        );
        self.collect_store_garbage_in_background();
        swapped
    }

    /// Where the files of `name`'s `version` are (its current or a retained version), as recorded: what
    /// `GET /v1/lora_adapters/{name}/versions/{version}/{file}` serves.
    pub async fn version_source(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
    ) -> Result<AdapterSource, CoreError> {
        let recorded = self.inner.config.state.recorded().await?;
        let Some(record) = recorded.adapters.into_iter().find(|record| &record.name == name) else {
            return Err(CoreError::UnknownAdapter(AdapterKey::Lora(name.clone())));
        };
        let mut versions: Vec<(AdapterVersion, RecordedSource)> =
            record.retained.into_iter().map(|kept| (kept.version, kept.source)).collect();
        versions.push((record.version, record.source));
        match versions.iter().find(|(held, _)| *held == version) {
            Some((_, source)) => self.recorded_source(source).await,
            None => Err(CoreError::VersionRetired {
                adapter: name.clone(),
                requested: version,
                retained: versions.iter().map(|(held, _)| *held).collect(),
            }),
        }
    }

    /// [`Coordinator::collect_store_garbage`] on a task of its own: what a push, a fetch or an unload released is
    /// deleted after it answered (deleting a version's files takes tens of milliseconds).
    pub(super) fn collect_store_garbage_in_background(&self) {
        if self.inner.config.adapter_store.is_none() {
            return;
        }
        let coordinator = self.clone();
        tokio::spawn(async move { coordinator.collect_store_garbage().await });
    }

    /// Deletes the adapter store's directories that no recorded version (current or retained, of any adapter)
    /// refers to by name. Failures are logged: a directory left is collected next time. A version installed while it
    /// runs is kept (the collection begins before the record is read: see [`crate::Collection`]).
    pub(super) async fn collect_store_garbage(&self) {
        let Some(store) = self.inner.config.adapter_store.clone() else { return };
        let collection = store.begin_collection();
        let recorded = match self.inner.config.state.recorded().await {
            Ok(recorded) => recorded,
            Err(err) => {
                tracing::warn!(%err, "adapter store: cannot read the record; nothing collected");
                return;
            }
        };
        // By the directory's name (its content): a version another replica pushed is recorded under that replica's
        // path, and kept here under the same name once fetched.
        let blobs = store.blobs_dir();
        let referenced: HashSet<PathBuf> = recorded
            .adapters
            .iter()
            .flat_map(|record| std::iter::once(&record.source).chain(record.retained.iter().map(|kept| &kept.source)))
            .filter(|source| source.pushed)
            .filter_map(|source| source.path.file_name().map(|name| blobs.join(name)))
            .collect();
        match tokio::task::spawn_blocking(move || collection.collect(&referenced)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(deleted)) => tracing::info!(deleted, "adapter store: deleted versions no adapter refers to"),
            Ok(Err(err)) => tracing::warn!(%err, "adapter store: collecting unreferenced versions failed"),
            Err(_) => {}
        }
    }
}

/// A duration in milliseconds, for a log line.
fn millis(duration: std::time::Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
