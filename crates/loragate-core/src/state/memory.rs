//! [`MemoryStore`]: the records in this process's memory. What `--state-dir none` uses, and the default of
//! [`crate::CoordinatorConfig`]: versions still never repeat within the process (across unloads and reloads), and two
//! coordinators started one after the other on the same store (a restart, in tests) see the same records.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use parking_lot::Mutex;

use super::{AdapterRecord, FrontRecord, PauseRecord, RecordedState, Recording, StateChange, StateStore};
use crate::contract::StateError;
use crate::contract::{AdapterName, AdapterVersion, PauseId, PauseMode};

/// Records kept in memory; cheap to clone (clones share the records).
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    records: Arc<Mutex<Records>>,
    last_pause_number: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct Records {
    adapters: BTreeMap<AdapterName, AdapterRecord>,
    issued: HashMap<AdapterName, AdapterVersion>,
    pauses: BTreeMap<(AdapterName, PauseId), PauseRecord>,
    global_pause: Option<PauseMode>,
    front_records: BTreeMap<(String, String), String>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Records {
    fn apply(&mut self, change: StateChange) {
        match change {
            StateChange::Installed { name, version, source, retained } => {
                let earlier = self.adapters.get(&name);
                let declared_path = earlier.and_then(|record| record.declared_path.clone());
                let staleness = earlier.and_then(|record| record.staleness);
                let record = AdapterRecord { name: name.clone(), source, version, declared_path, retained, staleness };
                self.adapters.insert(name, record);
            }
            StateChange::Staleness { name, policy } => {
                if let Some(record) = self.adapters.get_mut(&name) {
                    record.staleness = policy;
                }
            }
            StateChange::Declared { name, path } => {
                if let Some(record) = self.adapters.get_mut(&name) {
                    record.declared_path = Some(path);
                }
            }
            StateChange::Unloaded { name } => {
                self.adapters.remove(&name);
                self.pauses.retain(|(adapter, _), _| adapter != &name);
            }
            StateChange::VersionReturned { name, version } => {
                if self.issued.get(&name) == Some(&version) {
                    self.issued.insert(name, AdapterVersion(version.0 - 1));
                }
            }
            StateChange::Paused(record) => {
                // A pause of an adapter not recorded (unloaded meanwhile) is not kept.
                if self.adapters.contains_key(&record.adapter) {
                    self.pauses.insert((record.adapter.clone(), record.pause_id.clone()), record);
                }
            }
            StateChange::PauseEnded { adapter, pause_id } => {
                self.pauses.remove(&(adapter, pause_id));
            }
            StateChange::GlobalPause(mode) => self.global_pause = mode,
            StateChange::FrontRecordPut(FrontRecord { table, key, value }) => {
                self.front_records.insert((table, key), value);
            }
            StateChange::FrontRecordRemoved { table, key } => {
                self.front_records.remove(&(table, key));
            }
        }
    }
}

#[async_trait]
impl StateStore for MemoryStore {
    async fn recorded(&self) -> Result<RecordedState, StateError> {
        let records = self.records.lock();
        Ok(RecordedState {
            adapters: records.adapters.values().cloned().collect(),
            pauses: records.pauses.values().cloned().collect(),
            global_pause: records.global_pause,
            front_records: records
                .front_records
                .iter()
                .map(|((table, key), value)| FrontRecord {
                    table: table.clone(),
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
        })
    }

    fn record(&self, changes: Vec<StateChange>) -> Recording {
        let mut records = self.records.lock();
        for change in changes {
            records.apply(change);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn issue_version(&self, name: &AdapterName) -> Recording<AdapterVersion> {
        let mut records = self.records.lock();
        let issued = records.issued.entry(name.clone()).or_default();
        *issued = issued.next();
        Box::pin(std::future::ready(Ok(*issued)))
    }

    fn new_pause_id(&self) -> PauseId {
        PauseId::numbered(self.last_pause_number.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::state::RecordedSource;

    fn name(raw: &str) -> AdapterName {
        AdapterName::parse(raw).expect("name")
    }

    #[tokio::test]
    async fn versions_never_repeat_across_unloads_and_a_failed_load_leaves_no_gap() {
        let store = MemoryStore::new();
        let meow = name("meow");
        assert_eq!(store.issue_version(&meow).await, Ok(AdapterVersion(1)));
        assert_eq!(store.issue_version(&meow).await, Ok(AdapterVersion(2)));
        store.record(vec![StateChange::VersionReturned { name: meow.clone(), version: AdapterVersion(2) }]).await.ok();
        assert_eq!(store.issue_version(&meow).await, Ok(AdapterVersion(2)), "the failed load's version is reused");
        store.record(vec![StateChange::VersionReturned { name: meow.clone(), version: AdapterVersion(1) }]).await.ok();
        store.record(vec![StateChange::Unloaded { name: meow.clone() }]).await.ok();
        assert_eq!(store.issue_version(&meow).await, Ok(AdapterVersion(3)), "only the last version is given back");
        assert_eq!(store.issue_version(&name("woof")).await, Ok(AdapterVersion(1)), "per name");
    }

    #[tokio::test]
    async fn an_unload_forgets_the_adapter_and_its_pauses_and_pauses_need_a_recorded_adapter() {
        let store = MemoryStore::new();
        let meow = name("meow");
        let pause = |adapter: &AdapterName| PauseRecord {
            adapter: adapter.clone(),
            pause_id: store.new_pause_id(),
            owner: "trainer".into(),
            mode: PauseMode::Keep,
            lease_expires_at: None,
        };
        let source = RecordedSource { path: PathBuf::from("/a/meow"), confined: false, ..Default::default() };
        store.record(vec![StateChange::Paused(pause(&meow))]).await.ok();
        assert!(store.recorded().await.expect("read").pauses.is_empty(), "no adapter, no pause");
        store
            .record(vec![StateChange::Installed {
                name: meow.clone(),
                version: AdapterVersion(1),
                source,
                retained: Vec::new(),
            }])
            .await
            .ok();
        store.record(vec![StateChange::Paused(pause(&meow))]).await.ok();
        let recorded = store.recorded().await.expect("read");
        assert_eq!((recorded.adapters.len(), recorded.pauses.len()), (1, 1));
        assert_eq!(recorded.pauses[0].pause_id.as_str(), "pause-2", "ids are never given out twice");
        store.record(vec![StateChange::Unloaded { name: meow }]).await.ok();
        assert_eq!(store.recorded().await, Ok(RecordedState::default()));
    }

    #[tokio::test]
    async fn front_records_are_replaced_and_removed_by_table_and_key() {
        let store = MemoryStore::new();
        let record = |table: &str, key: &str, value: &str| FrontRecord {
            table: table.into(),
            key: key.into(),
            value: value.into(),
        };
        store
            .record(vec![
                StateChange::FrontRecordPut(record("tinker/samples", "b", "1")),
                StateChange::FrontRecordPut(record("tinker/samples", "a", "1")),
                StateChange::FrontRecordPut(record("other", "a", "x")),
            ])
            .await
            .ok();
        store.record(vec![StateChange::FrontRecordPut(record("tinker/samples", "a", "2"))]).await.ok();
        store
            .record(vec![StateChange::FrontRecordRemoved { table: "tinker/samples".into(), key: "b".into() }])
            .await
            .ok();
        let recorded = store.recorded().await.expect("read").front_records;
        assert_eq!(recorded, vec![record("other", "a", "x"), record("tinker/samples", "a", "2")]);
    }
}
