//! Waiting, on the pausing replica, until every other live replica applied its pause: each acknowledges under
//! `acks/PAUSE_ID/REPLICA` with the revision of the pause write it applied and what it handed back. A replica whose
//! lease expires meanwhile (it died) stops counting. The answer sums what they handed back; a live replica that did
//! not acknowledge within the store's acknowledgement timeout fails the pause (the caller withdraws it).

use std::collections::BTreeSet;

use loragate_core::state::StateError;
use loragate_core::{AbortReport, PauseId};
use tokio::time::Instant;

use crate::Shared;
use crate::client::{EventType, Watched};
use crate::keys::{Keys, StoredAck};

/// Waits for the acknowledgements of the pause `pause_id` written at `revision`.
pub(crate) async fn wait(shared: &Shared, pause_id: &PauseId, revision: i64) -> Result<AbortReport, StateError> {
    let deadline = Instant::now() + shared.ack_timeout;
    // From the pause's own write: every acknowledgement and every registration that ended since is in the history.
    let mut watch = shared.etcd.watch(shared.keys.all(), revision).await?;
    let (registered, _) = shared.etcd.range(&shared.keys.replicas(), true).await?;
    let mut waiting: BTreeSet<String> = registered
        .iter()
        .filter_map(|kv| Keys::last_segment(&kv.key))
        .filter(|replica| *replica != shared.replica_id)
        .collect();
    let (acks, replicas) = (shared.keys.acks_of(pause_id), shared.keys.replicas());
    let mut report = AbortReport::default();
    while !waiting.is_empty() {
        let events = match tokio::time::timeout_at(deadline, watch.next()).await {
            Ok(Ok(Watched::Events(events))) => events,
            Ok(Ok(Watched::Compacted)) => {
                return Err(StateError::Failed(format!("etcd compacted pause {pause_id}'s acknowledgements away")));
            }
            Ok(Err(err)) => return Err(err),
            Err(_) => {
                return Err(StateError::Unavailable(format!(
                    "etcd: replicas {} did not apply pause {pause_id} within {:?}",
                    waiting.iter().cloned().collect::<Vec<_>>().join(", "),
                    shared.ack_timeout
                )));
            }
        };
        for event in events {
            let Some(kv) = event.kv else { continue };
            let deleted = event.r#type == i32::from(EventType::Delete);
            let Some(replica) = Keys::last_segment(&kv.key) else { continue };
            if !deleted && kv.key.starts_with(acks.as_bytes()) {
                let ack = StoredAck::decode(&kv.value)?;
                if ack.revision >= revision && waiting.remove(&replica) {
                    ack.add_to(&mut report);
                }
            } else if deleted && kv.key.starts_with(replicas.as_bytes()) && waiting.remove(&replica) {
                tracing::warn!(%pause_id, %replica, "a replica's lease expired before it applied the pause");
            }
        }
    }
    Ok(report)
}
