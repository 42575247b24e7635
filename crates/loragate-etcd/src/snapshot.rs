//! Reading the whole state (at start, and again after a compaction) from the keys under the prefix.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use loragate_core::state::{FrontRecord, PauseRecord, RecordedState, StateError};
use loragate_core::{AdapterName, StalenessPolicy};

use crate::client::KeyValue;
use crate::keys::{Key, Keys, StoredAdapter, StoredPause, StoredRecord, StoredStaleness};

/// The state as read, with the revision each pause was last written at and the registered replicas.
pub(crate) struct Snapshot {
    pub(crate) state: RecordedState,
    /// Each pause and the revision it was last written at (what an acknowledgement names).
    pub(crate) pause_revisions: Vec<(PauseRecord, i64)>,
    /// The replicas registered (this one included, once it registered).
    pub(crate) registered: BTreeSet<String>,
}

/// The recorded state the keys hold: adapters not unloaded (with their declared paths), their pauses, and the front
/// records `replica` owns. The global pause is not shared (it belongs to the replica it was sent to).
pub(crate) fn read_state(keys: &Keys, kvs: Vec<KeyValue>, replica: &str) -> Result<Snapshot, StateError> {
    let mut front_records = Vec::new();
    let mut adapters = BTreeMap::new();
    let mut declared: BTreeMap<AdapterName, PathBuf> = BTreeMap::new();
    let mut staleness: BTreeMap<AdapterName, StalenessPolicy> = BTreeMap::new();
    let mut pauses = Vec::new();
    let mut registered = BTreeSet::new();
    for kv in kvs {
        match keys.parse(&kv.key) {
            Key::Adapter(name) => {
                adapters.insert(name, StoredAdapter::decode(&kv.value)?);
            }
            Key::Declared(name) => {
                let path = serde_json::from_slice(&kv.value)
                    .map_err(|err| StateError::Failed(format!("etcd holds an unreadable declared path: {err}")))?;
                declared.insert(name, path);
            }
            Key::Staleness(name) => {
                staleness.insert(name, StoredStaleness::decode(&kv.value)?.policy());
            }
            Key::Pause(adapter, pause_id) => {
                pauses.push((StoredPause::decode(&kv.value)?.record(adapter, pause_id)?, kv.mod_revision));
            }
            Key::Record(table, key) => match StoredRecord::decode(&kv.value) {
                Ok(stored) if stored.by == replica => {
                    front_records.push(FrontRecord { table, key, value: stored.value })
                }
                Ok(_) => {}
                Err(err) => tracing::warn!(%table, %key, %err, "skipped an unreadable front record"),
            },
            Key::Replica(id) => {
                registered.insert(id);
            }
            Key::Ack(..) | Key::Other => {}
        }
    }
    let adapters: Vec<_> = adapters
        .into_iter()
        .filter_map(|(name, stored)| {
            let declared_path = declared.remove(&name);
            let bound = staleness.remove(&name);
            stored.record(name, declared_path, bound)
        })
        .collect();
    pauses.retain(|(pause, _): &(PauseRecord, i64)| adapters.iter().any(|adapter| adapter.name == pause.adapter));
    front_records.sort_by(|a, b| (&a.table, &a.key).cmp(&(&b.table, &b.key)));
    let pauses_read = pauses.iter().map(|(pause, _)| pause.clone()).collect();
    let state = RecordedState { adapters, pauses: pauses_read, global_pause: None, front_records };
    Ok(Snapshot { state, pause_revisions: pauses, registered })
}
