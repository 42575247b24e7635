//! Versions another replica pushed (a state store shared by replicas): their files are in that replica's adapter
//! store, which its record names ([`RecordedSource::holder`]). This replica fetches them
//! ([`crate::VersionFetcher`]), receives them into its own adapter store with the checks of a push (the safetensors
//! header, the engine's layout check, the size, and the SHA-256 the record carries), loads them and only then serves
//! the version. Meanwhile the adapter's new requests are held at its gate, as during a pause (a pause of its own,
//! never recorded: [`crate::adapter::AdapterHandle::hold_for_fetch`]), so this replica never serves the old weights
//! under the new version number; requests already admitted run on at their own version. Without the files by
//! `--gate-max-wait` the adapter reports `weights_error` and refuses its samples (`CoreError::WeightsMissing`,
//! 503), and the fetch is retried with back-off until it succeeds, or a newer version or an unload supersedes it.

use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use super::Coordinator;
use crate::adapter::{AdapterHandle, Servable, servable};
use crate::adapter_source::{AdapterSource, CONFIG_FILE, WEIGHTS_FILE};
use crate::adapter_store::{MAX_CONFIG_BYTES, PushHeader, StoredAdapter};
use crate::contract::{AdapterName, AdapterVersion, CoreError};
use crate::state::RecordedSource;
use crate::version_fetch::FileChunks;

/// The first wait before fetching again; it doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);

impl Coordinator {
    /// The replica to fetch a recorded version's files from, when this replica must: weights pushed to another
    /// replica, and this server has an adapter store and a fetcher.
    pub(super) fn fetch_from<'a>(&self, source: &'a RecordedSource) -> Option<&'a str> {
        let config = &self.inner.config;
        let holder = source.holder.as_deref()?;
        (source.pushed && config.adapter_store.is_some() && config.version_fetcher.is_some()).then_some(holder)
    }

    /// Fetches `version` of `name` from replica `holder`, then loads and serves it (see the module documentation).
    /// Returns once it is served, superseded (a newer version served, the adapter unloaded) or the server stops.
    pub(super) async fn follow_pushed(
        &self,
        name: AdapterName,
        version: AdapterVersion,
        source: RecordedSource,
        holder: String,
    ) {
        let deadline = Instant::now() + self.inner.config.max_gate_hold;
        let mut hold = match self.lora(&name) {
            Ok(adapter) => adapter.hold_for_fetch().await.ok(),
            Err(_) => None,
        };
        let mut retry = FIRST_RETRY;
        let mut reported = false;
        let mut last_error: Option<String> = None;
        loop {
            let adapter = self.lora(&name).ok();
            if adapter.as_ref().is_some_and(|adapter| serves(adapter, version)) {
                return;
            }
            if let Some(error) = last_error.as_ref().filter(|_| !reported && Instant::now() >= deadline) {
                reported = true;
                let reason = format!("fetching its files from replica {holder} failed: {error}");
                self.report_unfetched(&name, version, reason).await;
                drop(hold.take());
            }
            let attempt = self.fetch_and_load(&name, version, &source, &holder);
            tokio::pin!(attempt);
            let outcome = loop {
                tokio::select! {
                    outcome = &mut attempt => break Some(outcome),
                    () = superseded(adapter.clone(), version) => break None,
                    () = tokio::time::sleep_until(deadline), if !reported => {
                        reported = true;
                        let reason = format!("still fetching its files from replica {holder}");
                        self.report_unfetched(&name, version, reason).await;
                        drop(hold.take());
                    }
                }
            };
            let error = match outcome {
                None => return,
                Some(Ok((servable, stored))) => {
                    self.serve_remote(&name, version, Ok(servable)).await;
                    drop((stored.lease, hold));
                    self.collect_store_garbage_in_background();
                    return;
                }
                Some(Err(error)) => error,
            };
            tracing::warn!(
                adapter = %name, %version, replica = %holder, %error,
                "could not fetch another replica's pushed version; retrying"
            );
            last_error = Some(error);
            tokio::select! {
                () = tokio::time::sleep(retry) => {}
                // Reported at the top of the loop.
                () = tokio::time::sleep_until(deadline), if !reported => {}
                () = superseded(self.lora(&name).ok(), version) => return,
            }
            retry = (retry * 2).min(MAX_RETRY);
            if self.is_shutting_down() || self.record_supersedes(&name, version).await {
                return;
            }
        }
    }

    /// Says why `name` has no weights for `version` yet: its samples are refused meanwhile (a new adapter is published
    /// so, with the reason).
    async fn report_unfetched(&self, name: &AdapterName, version: AdapterVersion, reason: String) {
        let reason = format!("another replica pushed version {version}; this one has not got its files: {reason}");
        tracing::error!(adapter = %name, %version, %reason, "refusing the adapter's samples until its files arrive");
        match self.lora(name) {
            Ok(adapter) => {
                if let Err(err) = adapter.mark_weights_missing(reason).await {
                    tracing::warn!(adapter = %name, %err, "could not mark the adapter as missing its weights");
                }
            }
            Err(_) => self.serve_remote(name, version, Err(reason)).await,
        }
    }

    /// Whether the record moved past `version` of `name` (a newer version, or the adapter unloaded).
    async fn record_supersedes(&self, name: &AdapterName, version: AdapterVersion) -> bool {
        match self.inner.config.state.recorded().await {
            Ok(recorded) => recorded
                .adapters
                .iter()
                .find(|record| &record.name == name)
                .is_none_or(|record| record.version > version),
            Err(_) => false,
        }
    }

    /// One attempt: the files into this replica's adapter store (unless they are there already), then into the
    /// engine.
    pub(super) async fn fetch_and_load(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
        source: &RecordedSource,
        holder: &str,
    ) -> Result<(Servable, StoredAdapter), String> {
        let stored = self.fetch_files(name, version, source, holder).await?;
        let loaded = self.load_remote(name, version, &stored.source).await.map_err(|err| err.to_string())?;
        Ok((loaded, stored))
    }

    async fn fetch_files(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
        source: &RecordedSource,
        holder: &str,
    ) -> Result<StoredAdapter, String> {
        let config = &self.inner.config;
        let (Some(store), Some(fetcher)) = (&config.adapter_store, &config.version_fetcher) else {
            return Err("this server keeps no pushed versions".into());
        };
        let Some(sha256) = source.sha256 else {
            return Err("its record has no SHA-256 to check the files against".into());
        };
        if let (Some(dir_name), Some(bytes)) = (source.path.file_name(), source.bytes) {
            let (store, dir_name) = (store.clone(), dir_name.to_owned());
            let here = tokio::task::spawn_blocking(move || store.stored(&dir_name, sha256, bytes)).await;
            if let Ok(Some(stored)) = here {
                return Ok(stored);
            }
        }
        let replicas = self.replicas().await.map_err(|err| format!("cannot list the replicas: {err}"))?;
        let Some(replica) = replicas.into_iter().find(|replica| replica.id == holder && !replica.http_addr.is_empty())
        else {
            return Err(format!("replica {holder}, which holds its files, is not live"));
        };
        let config_chunks = fetcher.fetch(&replica, name, version, CONFIG_FILE).await.map_err(|err| err.to_string())?;
        let config_json = read_small(config_chunks, MAX_CONFIG_BYTES).await?;
        let header = PushHeader::parse(config_json, &sha256.to_hex(), source.bytes).map_err(|err| err.to_string())?;
        let mut receiver = self.receive_into(store, header).await.map_err(|err| err.to_string())?;
        let mut chunks = fetcher.fetch(&replica, name, version, WEIGHTS_FILE).await.map_err(|err| err.to_string())?;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|err| err.to_string())?;
            receiver.write(&chunk[..]).await.map_err(|err| err.to_string())?;
        }
        receiver.finish().await.map_err(|err| err.to_string())
    }

    /// Loads `weights` as `version` of `name` into this engine; what the adapter then serves.
    pub(super) async fn load_remote(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
        weights: &AdapterSource,
    ) -> Result<Servable, CoreError> {
        self.inner.engine.load_adapter(name, version, weights).await?;
        Ok(servable(version, weights).await)
    }
}

/// Whether `adapter` serves `version` (or a newer one) with weights.
fn serves(adapter: &AdapterHandle, version: AdapterVersion) -> bool {
    adapter.gate().version >= version && adapter.cell().weights_error().is_none()
}

/// Resolves once `adapter` moved past `version` or stopped serving; never without an adapter.
async fn superseded(adapter: Option<AdapterHandle>, version: AdapterVersion) {
    let Some(adapter) = adapter else { return std::future::pending().await };
    let mut gate = adapter.cell().subscribe_gate();
    let _ = gate.wait_for(|gate| gate.version > version || gate.retired.is_some()).await;
}

/// Reads a small file whole, refusing one over `limit` bytes.
async fn read_small(mut chunks: FileChunks, limit: usize) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    while let Some(chunk) = chunks.next().await {
        bytes.extend_from_slice(&chunk.map_err(|err| err.to_string())?);
        if bytes.len() > limit {
            return Err(format!("{CONFIG_FILE} is over {limit} bytes"));
        }
    }
    Ok(bytes)
}
