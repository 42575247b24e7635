//! The store's single writer: changes are applied to etcd in the order they were queued, one call's changes in one
//! transaction where they need no compare-and-swap. Versions are issued, installs recorded and failed loads' versions
//! given back by compare-and-swap on the key's `mod_revision` (retried), so two replicas never issue the same version
//! and an older install never replaces a newer one.

use std::sync::Arc;

use loragate_core::state::{StateChange, StateError};
use loragate_core::{AdapterName, AdapterVersion};
use tokio::sync::{mpsc, oneshot};

use crate::Shared;
use crate::client::{Guard, Write};
use crate::keys::{StoredAdapter, StoredPause, StoredRecord, StoredSource, StoredStaleness, StoredVersion, lease_left};

/// How often a compare-and-swap is retried when another replica wrote the key meanwhile.
const CAS_ATTEMPTS: usize = 64;

/// One queued operation.
pub(crate) enum Op {
    /// Applies changes; answers with the revision after the last write.
    Record(Vec<StateChange>, oneshot::Sender<Result<i64, StateError>>),
    /// Issues the name's next version.
    Issue(AdapterName, oneshot::Sender<Result<AdapterVersion, StateError>>),
}

/// Applies queued operations until every sender is gone.
pub(crate) async fn run(shared: Arc<Shared>, mut ops: mpsc::UnboundedReceiver<Op>) {
    while let Some(op) = ops.recv().await {
        match op {
            Op::Record(changes, reply) => {
                let _ = reply.send(apply(&shared, changes).await);
            }
            Op::Issue(name, reply) => {
                let _ = reply.send(issue(&shared, &name).await);
            }
        }
    }
}

async fn apply(shared: &Shared, changes: Vec<StateChange>) -> Result<i64, StateError> {
    let keys = &shared.keys;
    let mut writes = Vec::new();
    let mut revision = 0;
    for change in changes {
        match change {
            StateChange::Installed { name, version, source, retained } => {
                revision = revision.max(flush(shared, &mut writes).await?);
                let stored = StoredAdapter {
                    unloaded: false,
                    version: version.0,
                    source: StoredSource::of(&source, &shared.replica_id),
                    retained: retained.iter().map(|kept| StoredVersion::of(kept, &shared.replica_id)).collect(),
                    by: shared.replica_id.clone(),
                };
                revision = revision.max(install(shared, &name, stored).await?);
            }
            StateChange::Staleness { name, policy } => writes.push(match policy {
                Some(policy) => Write::Put {
                    key: keys.staleness(&name),
                    value: StoredStaleness::of(policy, &shared.replica_id).encode(),
                    lease: 0,
                },
                None => Write::Delete { key: keys.staleness(&name), prefix: false },
            }),
            StateChange::VersionReturned { name, version } => {
                revision = revision.max(flush(shared, &mut writes).await?);
                revision = revision.max(give_back(shared, &name, version).await?);
            }
            StateChange::Declared { name, path } => writes.push(Write::Put {
                key: keys.declared(&name),
                value: serde_json::to_vec(&path).unwrap_or_default(),
                lease: 0,
            }),
            StateChange::Unloaded { name } => {
                let tombstone = StoredAdapter {
                    unloaded: true,
                    version: 0,
                    source: StoredSource::default(),
                    retained: Vec::new(),
                    by: shared.replica_id.clone(),
                };
                writes.push(Write::Put { key: keys.adapter(&name), value: tombstone.encode(), lease: 0 });
                writes.push(Write::Delete { key: keys.declared(&name), prefix: false });
                writes.push(Write::Delete { key: keys.staleness(&name), prefix: false });
                writes.push(Write::Delete { key: keys.pauses_of(&name), prefix: true });
            }
            StateChange::Paused(record) => {
                // A lease is an etcd lease: etcd ends the pause (on every replica) when it runs out.
                let lease = match lease_left(&record) {
                    Some(left) => shared.etcd.grant_lease(left + std::time::Duration::from_millis(999)).await?,
                    None => 0,
                };
                let value = StoredPause::of(&record, &shared.replica_id).encode();
                writes.push(Write::Put { key: keys.pause(&record.adapter, &record.pause_id), value, lease });
            }
            StateChange::PauseEnded { adapter, pause_id } => {
                writes.push(Write::Delete { key: keys.pause(&adapter, &pause_id), prefix: false });
                writes.push(Write::Delete { key: keys.acks_of(&pause_id), prefix: true });
            }
            // The global pause (vLLM's `/pause`) belongs to the replica it was sent to: not shared.
            StateChange::GlobalPause(_) => {}
            StateChange::FrontRecordPut(record) => {
                let value = StoredRecord { value: record.value, by: shared.replica_id.clone() }.encode();
                writes.push(Write::Put { key: keys.record(&record.table, &record.key), value, lease: 0 });
            }
            StateChange::FrontRecordRemoved { table, key } => {
                writes.push(Write::Delete { key: keys.record(&table, &key), prefix: false });
            }
        }
    }
    Ok(revision.max(flush(shared, &mut writes).await?))
}

/// Commits the writes gathered so far in one transaction.
async fn flush(shared: &Shared, writes: &mut Vec<Write>) -> Result<i64, StateError> {
    if writes.is_empty() {
        return Ok(0);
    }
    let (_, revision) = shared.etcd.txn(Vec::new(), std::mem::take(writes)).await?;
    Ok(revision)
}

/// Reads `key` for a compare-and-swap: its value and `mod_revision` (0 when absent).
async fn read_for_cas(shared: &Shared, key: &str) -> Result<(Option<Vec<u8>>, i64), StateError> {
    let (kvs, _) = shared.etcd.range(key, false).await?;
    Ok(match kvs.into_iter().next() {
        Some(kv) => (Some(kv.value), kv.mod_revision),
        None => (None, 0),
    })
}

/// Writes `value` to `key` if `key` still is as read; `Ok(None)` when another writer won (retry).
async fn swap(shared: &Shared, key: &str, read_revision: i64, value: Vec<u8>) -> Result<Option<i64>, StateError> {
    let guard = Guard::ModRevision { key: key.to_owned(), revision: read_revision };
    let write = Write::Put { key: key.to_owned(), value, lease: 0 };
    let (succeeded, revision) = shared.etcd.txn(vec![guard], vec![write]).await?;
    Ok(succeeded.then_some(revision))
}

fn contended(key: &str) -> StateError {
    StateError::Unavailable(format!("etcd: {key} changed {CAS_ATTEMPTS} times in a row while being updated"))
}

fn issued_version(value: Option<&[u8]>) -> Result<u64, StateError> {
    match value {
        None => Ok(0),
        Some(raw) => std::str::from_utf8(raw)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| StateError::Failed("etcd holds an unreadable issued version".into())),
    }
}

/// Issues one above the highest version ever issued for `name`, by compare-and-swap.
async fn issue(shared: &Shared, name: &AdapterName) -> Result<AdapterVersion, StateError> {
    let key = shared.keys.issued(name);
    for _ in 0..CAS_ATTEMPTS {
        let (value, read_revision) = read_for_cas(shared, &key).await?;
        let next = issued_version(value.as_deref())? + 1;
        if swap(shared, &key, read_revision, next.to_string().into_bytes()).await?.is_some() {
            return Ok(AdapterVersion(next));
        }
    }
    Err(contended(&key))
}

/// Gives back `version` if it is still the highest issued (no other load was issued one since).
async fn give_back(shared: &Shared, name: &AdapterName, version: AdapterVersion) -> Result<i64, StateError> {
    let key = shared.keys.issued(name);
    for _ in 0..CAS_ATTEMPTS {
        let (value, read_revision) = read_for_cas(shared, &key).await?;
        if issued_version(value.as_deref())? != version.0 {
            return Ok(0);
        }
        let previous = (version.0 - 1).to_string().into_bytes();
        if let Some(revision) = swap(shared, &key, read_revision, previous).await? {
            return Ok(revision);
        }
    }
    Err(contended(&key))
}

/// Records an install unless a newer version of the name is recorded already.
async fn install(shared: &Shared, name: &AdapterName, stored: StoredAdapter) -> Result<i64, StateError> {
    let key = shared.keys.adapter(name);
    for _ in 0..CAS_ATTEMPTS {
        let (value, read_revision) = read_for_cas(shared, &key).await?;
        if let Some(current) = value.as_deref().map(StoredAdapter::decode).transpose()?
            && !current.unloaded
            && current.version >= stored.version
        {
            return Ok(0);
        }
        if let Some(revision) = swap(shared, &key, read_revision, stored.encode()).await? {
            return Ok(revision);
        }
    }
    Err(contended(&key))
}
