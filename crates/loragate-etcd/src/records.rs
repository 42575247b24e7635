//! Front records (`records/TABLE/KEY`) under a shared store. Each belongs to one replica, the one whose front wrote it
//! (its `by`): [`StateStore::recorded`](loragate_core::StateStore::recorded) hands a replica only its own, so that two
//! replicas never both continue one Tinker sample. A replica that died leaves its records behind; the next replica to
//! start takes them over, each by compare-and-swap on the key's `mod_revision` (two replicas starting at once never
//! both take one). A replica counts as gone once its registration lease ran out: a replica killed and started again
//! within the lease (5 s by default) finds its predecessor still registered and leaves its records for a later start.

use std::collections::HashSet;

use loragate_core::state::StateError;

use crate::Shared;
use crate::client::{Guard, KeyValue, Write};
use crate::keys::{Key, StoredRecord};

/// Takes over the records in `kvs` (everything under the prefix, just read) whose replica is no longer registered;
/// rewrites the ones taken over in `kvs`, so that the snapshot read from it counts them as this replica's.
pub(crate) async fn take_over(shared: &Shared, kvs: &mut [KeyValue]) -> Result<(), StateError> {
    let live: HashSet<String> = kvs
        .iter()
        .filter_map(|kv| match shared.keys.parse(&kv.key) {
            Key::Replica(id) => Some(id),
            _ => None,
        })
        .collect();
    for kv in kvs.iter_mut() {
        if !matches!(shared.keys.parse(&kv.key), Key::Record(..)) {
            continue;
        }
        let Ok(mut stored) = StoredRecord::decode(&kv.value) else { continue };
        if stored.by == shared.replica_id || live.contains(&stored.by) {
            continue;
        }
        let gone = std::mem::replace(&mut stored.by, shared.replica_id.clone());
        let key = String::from_utf8_lossy(&kv.key).into_owned();
        let guard = Guard::ModRevision { key: key.clone(), revision: kv.mod_revision };
        let value = stored.encode();
        let (taken, _) =
            shared.etcd.txn(vec![guard], vec![Write::Put { key: key.clone(), value: value.clone(), lease: 0 }]).await?;
        if taken {
            tracing::info!(%key, replica = %gone, "took over a front record of a replica that is gone");
            kv.value = value;
        }
    }
    Ok(())
}
