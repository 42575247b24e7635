//! Following the other replicas: one watch over the whole prefix, from the revision the store read at start, turned
//! into [`RemoteChange`]s for the coordinator. A pause another replica wrote is acknowledged (under
//! `acks/PAUSE_ID/REPLICA`, with the revision of the write it applied) once the coordinator handed back what it had in
//! flight. The same watch tells [`crate::acks`] which replicas are registered, when this replica's own pauses were
//! written, and who acknowledged them. When etcd goes away the watch is opened again from the next revision, so
//! nothing is missed; if etcd compacted that history meanwhile, the whole state is read again and handed over as
//! [`RemoteChange::Resynced`].

use std::sync::Arc;
use std::time::Duration;

use loragate_core::state::{RecordedState, RemoteChange, StateError};
use tokio::sync::{mpsc, oneshot};

use crate::Shared;
use crate::client::{Event, EventType, Watched, Write};
use crate::keys::{Key, StoredAck, StoredAdapter, StoredPause, StoredStaleness};
use crate::snapshot::read_state;

/// The first wait before opening a broken watch again; it doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(2);

/// Follows every change after `revision` until the coordinator stops listening.
pub(crate) async fn run(shared: Arc<Shared>, mut revision: i64, changes: mpsc::UnboundedSender<RemoteChange>) {
    let mut retry = FIRST_RETRY;
    while !changes.is_closed() {
        let mut watch = match shared.etcd.watch(shared.keys.all(), revision + 1).await {
            Ok(watch) => {
                shared.watch_healthy();
                watch
            }
            Err(err) => {
                shared.watch_broke(&err);
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(MAX_RETRY);
                continue;
            }
        };
        loop {
            match watch.next().await {
                Ok(Watched::Events(events)) => {
                    retry = FIRST_RETRY;
                    for event in events {
                        if let Some(kv) = &event.kv {
                            revision = revision.max(kv.mod_revision);
                        }
                        dispatch(&shared, event, &changes);
                    }
                    shared.acks.applied(revision);
                }
                Ok(Watched::Compacted) => match resync(&shared, &changes).await {
                    Ok(read_at) => {
                        revision = read_at;
                        break;
                    }
                    Err(err) => {
                        shared.watch_broke(&err);
                        break;
                    }
                },
                Err(err) => {
                    shared.watch_broke(&err);
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(MAX_RETRY);
                    break;
                }
            }
        }
    }
}

/// Reads the whole state again and hands it over; returns the revision read at.
async fn resync(shared: &Shared, changes: &mpsc::UnboundedSender<RemoteChange>) -> Result<i64, StateError> {
    let (kvs, revision) = shared.etcd.range(shared.keys.all(), true).await?;
    let snapshot = read_state(&shared.keys, kvs, &shared.replica_id)?;
    tracing::warn!(revision, "etcd compacted the changes this replica had not seen; read the whole state again");
    shared.acks.resynced(revision, snapshot.registered);
    let state: RecordedState = snapshot.state;
    let _ = changes.send(RemoteChange::Resynced(state));
    Ok(revision)
}

fn dispatch(shared: &Arc<Shared>, event: Event, changes: &mpsc::UnboundedSender<RemoteChange>) {
    let Some(kv) = event.kv else { return };
    let deleted = event.r#type == i32::from(EventType::Delete);
    let change = match (shared.keys.parse(&kv.key), deleted) {
        (Key::Adapter(name), false) => match StoredAdapter::decode(&kv.value) {
            Ok(stored) if stored.by == shared.replica_id => return,
            Ok(stored) if stored.unloaded => RemoteChange::Unloaded { name },
            Ok(stored) => {
                let record = stored.record(name, None, None);
                let Some(record) = record else { return };
                RemoteChange::Installed { name: record.name, version: record.version, source: record.source }
            }
            Err(err) => {
                tracing::warn!(%err, "skipped an unreadable adapter record");
                return;
            }
        },
        (Key::Pause(adapter, pause_id), false) => {
            let record = match StoredPause::decode(&kv.value) {
                Ok(stored) if stored.by == shared.replica_id => {
                    shared.acks.pause_written(pause_id, kv.mod_revision);
                    return;
                }
                Ok(stored) => stored.record(adapter, pause_id),
                Err(err) => Err(err),
            };
            let record = match record {
                Ok(record) => record,
                Err(err) => {
                    tracing::warn!(%err, "skipped an unreadable pause record");
                    return;
                }
            };
            let (acknowledge, acknowledged) = oneshot::channel();
            let (shared, pause_id, revision) = (shared.clone(), record.pause_id.clone(), kv.mod_revision);
            tokio::spawn(async move {
                // No answer: the coordinator is gone, and so is this replica's share of the pause.
                let Ok(report) = acknowledged.await else { return };
                let ack = StoredAck::of(revision, &report);
                let write = Write::Put {
                    key: shared.keys.ack(&pause_id, &shared.replica_id),
                    value: ack.encode(),
                    lease: shared.lease(),
                };
                if let Err(err) = shared.etcd.txn(Vec::new(), vec![write]).await {
                    tracing::warn!(%pause_id, %err, "could not acknowledge another replica's pause");
                }
            });
            RemoteChange::Paused { record, acknowledge }
        }
        (Key::Pause(adapter, pause_id), true) => RemoteChange::PauseEnded { adapter, pause_id },
        (Key::Staleness(name), false) => match StoredStaleness::decode(&kv.value) {
            Ok(stored) if stored.by == shared.replica_id => return,
            Ok(stored) => RemoteChange::Staleness { name, policy: Some(stored.policy()) },
            Err(err) => {
                tracing::warn!(%err, "skipped an unreadable staleness bound");
                return;
            }
        },
        // A delete carries no value, so no writer: applying this replica's own clearing again changes nothing.
        (Key::Staleness(name), true) => RemoteChange::Staleness { name, policy: None },
        (Key::Ack(pause_id, replica), false) => {
            match StoredAck::decode(&kv.value) {
                Ok(ack) => shared.acks.acknowledged(&pause_id, &replica, &ack),
                Err(err) => tracing::warn!(%pause_id, %replica, %err, "skipped an unreadable acknowledgement"),
            }
            return;
        }
        (Key::Replica(replica), false) => {
            shared.acks.registered(replica);
            return;
        }
        (Key::Replica(replica), true) => {
            shared.acks.deregistered(&replica);
            return;
        }
        _ => return,
    };
    let _ = changes.send(change);
}
