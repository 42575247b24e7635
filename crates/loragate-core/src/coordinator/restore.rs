//! Start from the recorded state: every recorded adapter is loaded again at its recorded version from its recorded
//! path and published with its recorded pauses (one whose weights cannot be loaded is published all the same, with
//! its error, and refuses samples), the global pause is set again, and the operator's `--adapter` flags are
//! reconciled with what was recorded.

use std::collections::HashMap;
use std::path::Path;

use futures::StreamExt;
use ractor::SpawnErr;

use super::Coordinator;
use crate::adapter::{Servable, servable};
use crate::adapter_source::AdapterSource;
use crate::contract::{AdapterKey, AdapterName, AdapterVersion, CoreError, KvPolicy};
use crate::manager::RestoredAdapter;
use crate::state::{AdapterRecord, PauseRecord, RecordedSource, StateChange};

/// How many recorded adapters are loaded into the engine at once at start.
const RESTORE_CONCURRENCY: usize = 8;

/// Why the coordinator could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Its actors could not be spawned.
    #[error("starting the coordinator's actors: {0}")]
    Spawn(#[from] SpawnErr),
    /// The recorded state could not be read or put back.
    #[error("restoring the recorded state: {0}")]
    Restore(#[from] CoreError),
}

/// What [`Coordinator::reconcile_adapter`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reconciled {
    /// The recorded adapter already serves what the flag names (or what was loaded since the flag last changed):
    /// nothing was loaded.
    Kept(AdapterVersion),
    /// The flag's path was loaded, as this new version.
    Loaded(AdapterVersion),
}

impl Reconciled {
    /// The adapter's version after reconciling.
    pub fn version(self) -> AdapterVersion {
        match self {
            Self::Kept(version) | Self::Loaded(version) => version,
        }
    }
}

/// What the start put back from the recorded state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Adapters published at their recorded version.
    pub adapters: usize,
    /// Of those, the ones whose weights could not be loaded (listed with their error).
    pub without_weights: usize,
    /// Recorded pauses put back (those whose lease ran out meanwhile are not counted: they ended).
    pub pauses: usize,
}

impl Coordinator {
    /// Puts back what the state store recorded. Called once by [`Coordinator::start`], before anything is served.
    pub(super) async fn restore(&self) -> Result<RestoreReport, CoreError> {
        let recorded = self.inner.config.state.recorded().await?;
        let mut pauses: HashMap<AdapterName, Vec<PauseRecord>> = HashMap::new();
        for pause in recorded.pauses {
            pauses.entry(pause.adapter.clone()).or_default().push(pause);
        }
        let mut report = RestoreReport::default();
        let mut loads = futures::stream::iter(recorded.adapters)
            .map(|record| async move {
                let record = self.release_beyond_retention(record).await?;
                let loaded = self.load_recorded_weights(&record).await;
                Ok::<_, CoreError>((record, loaded))
            })
            .buffer_unordered(RESTORE_CONCURRENCY);
        while let Some(restoring) = loads.next().await {
            let (record, (mut servable, loaded)) = restoring?;
            let weights_error = match loaded {
                Ok(current) => {
                    servable.push(current);
                    None
                }
                Err(err) => {
                    let reason = format!(
                        "the weights recorded for it ({}, from {}) could not be loaded at start: {err}",
                        record.version,
                        record.source.path.display()
                    );
                    tracing::error!(adapter = %record.name, %reason, "a recorded adapter has no weights");
                    Some(reason)
                }
            };
            let adapter_pauses = pauses.remove(&record.name).unwrap_or_default();
            report.adapters += 1;
            report.without_weights += usize::from(weights_error.is_some());
            report.pauses += adapter_pauses.len();
            let fetch_later = weights_error
                .as_ref()
                .and_then(|_| self.fetch_from(&record.source))
                .map(|holder| (record.name.clone(), record.version, record.source.clone(), holder.to_owned()));
            let restored = RestoredAdapter {
                name: record.name,
                version: record.version,
                servable,
                weights_error,
                pauses: adapter_pauses,
                staleness: record.staleness,
            };
            self.inner.manager.restore(restored).await?;
            if let Some((name, version, source, holder)) = fetch_later {
                let coordinator = self.clone();
                tokio::spawn(async move { coordinator.follow_pushed(name, version, source, holder).await });
            }
        }
        if let Some(mode) = recorded.global_pause {
            // Nothing runs yet: this only closes every gate again under the global owner.
            self.pause_all(mode, KvPolicy::Recompute, None).await?;
        }
        Ok(report)
    }

    /// Drops from `record` the retained versions beyond `--retain-versions` (the oldest: a server restarted with a
    /// lower count) and records the shorter list, so that their weights are not loaded and the adapter store
    /// collects their files.
    async fn release_beyond_retention(&self, mut record: AdapterRecord) -> Result<AdapterRecord, CoreError> {
        let keep = self.inner.config.retain_versions.saturating_sub(1);
        let beyond = record.retained.len().saturating_sub(keep);
        if beyond == 0 {
            return Ok(record);
        }
        record.retained.sort_by_key(|older| older.version);
        let released: Vec<AdapterVersion> = record.retained.drain(..beyond).map(|older| older.version).collect();
        tracing::info!(
            adapter = %record.name, ?released, retain_versions = self.inner.config.retain_versions,
            "retained versions beyond --retain-versions are released at start"
        );
        let change = StateChange::Installed {
            name: record.name.clone(),
            version: record.version,
            source: record.source.clone(),
            retained: record.retained.clone(),
        };
        self.inner.config.state.record(vec![change]).await?;
        Ok(record)
    }

    /// Loads a recorded adapter's weights into the engine: the older versions it retained (those that still load;
    /// oldest first), then its current version. A path that came from a request must still lie inside the adapter
    /// root.
    async fn load_recorded_weights(&self, record: &AdapterRecord) -> (Vec<Servable>, Result<Servable, CoreError>) {
        let mut retained = Vec::new();
        for older in &record.retained {
            match self.load_recorded_version(&record.name, older.version, &older.source).await {
                Ok(servable) => retained.push(servable),
                Err(err) => tracing::warn!(
                    adapter = %record.name, version = %older.version, %err,
                    "a retained version's recorded weights could not be loaded at start; it is no longer servable"
                ),
            }
        }
        (retained, self.load_recorded_version(&record.name, record.version, &record.source).await)
    }

    async fn load_recorded_version(
        &self,
        name: &AdapterName,
        version: AdapterVersion,
        source: &RecordedSource,
    ) -> Result<Servable, CoreError> {
        if let Some(holder) = self.fetch_from(source) {
            // Pushed to another replica: fetched from it (once here; retried once the adapter is published).
            let fetched = self.fetch_and_load(name, version, source, holder).await;
            let (servable, _stored) = fetched.map_err(|reason| CoreError::WeightsMissing {
                adapter: AdapterKey::Lora(name.clone()),
                reason: format!("fetching its files from replica {holder} failed: {reason}"),
            })?;
            return Ok(servable);
        }
        let weights = self.recorded_source(source).await?;
        self.inner.engine.load_adapter(name, version, &weights).await?;
        Ok(servable(version, &weights).await)
    }

    /// Reconciles an operator's `--adapter NAME=DIR` with the recorded state: if `name` is recorded from the same
    /// directory, or from anything loaded since the flag last named this directory, nothing is loaded; otherwise
    /// (a new name, a flag that names another directory, or recorded weights that could not be loaded) the flag's
    /// directory is loaded as the name's next version. Either way the flag's directory is recorded as declared.
    pub async fn reconcile_adapter(&self, name: &AdapterName, source: AdapterSource) -> Result<Reconciled, CoreError> {
        let recorded = self.inner.config.state.recorded().await?;
        let record = recorded.adapters.into_iter().find(|record| &record.name == name);
        let dir = source.dir().to_owned();
        let serving = self.lora(name).is_ok_and(|adapter| adapter.cell().weights_error().is_none());
        let (reconciled, already_declared) = match record {
            Some(record) if serving && declares(&record, &dir) => {
                (Reconciled::Kept(record.version), record.declared_path.as_deref() == Some(dir.as_path()))
            }
            Some(record) => {
                let installed = self.load_adapter(name, source).await?;
                let why = if serving {
                    "the flag names another directory than the one it was loaded from"
                } else {
                    "the recorded weights could not be loaded"
                };
                tracing::warn!(
                    adapter = %name,
                    recorded_version = %record.version,
                    recorded_source = %record.source.path.display(),
                    version = %installed.version,
                    source = %dir.display(),
                    "{name} now serves other weights than recorded: {why}, so version {} from {} replaces the \
                     recorded version {} from {}",
                    installed.version,
                    dir.display(),
                    record.version,
                    record.source.path.display()
                );
                (Reconciled::Loaded(installed.version), false)
            }
            None => (Reconciled::Loaded(self.load_adapter(name, source).await?.version), false),
        };
        if !already_declared {
            self.inner.config.state.record(vec![StateChange::Declared { name: name.clone(), path: dir }]).await?;
        }
        Ok(reconciled)
    }
}

/// Whether `record` already serves what a flag naming `dir` asks for: the same directory, or the flag named `dir`
/// before and what is recorded was loaded since (by a trainer).
fn declares(record: &AdapterRecord, dir: &Path) -> bool {
    record.source.path == dir || record.declared_path.as_deref() == Some(dir)
}
