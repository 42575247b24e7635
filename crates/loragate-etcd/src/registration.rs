//! This replica's registration: `replicas/ID` under an etcd lease, renewed every third of its TTL. A replica that
//! dies stops renewing, and etcd removes its key when the lease runs out: it stops counting for pauses. If the lease
//! ran out while etcd was unreachable, a new one is granted and the replica registers again.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use loragate_core::state::StateError;

use crate::Shared;
use crate::client::Write;

/// Registers (or registers again) under a new lease, with the addresses announced so far.
pub(crate) async fn register(shared: &Shared) -> Result<(), StateError> {
    let lease = shared.etcd.grant_lease(shared.replica_ttl).await?;
    let value = shared.addresses.lock().encode();
    let write = Write::Put { key: shared.keys.replica(&shared.replica_id), value, lease };
    shared.etcd.txn(Vec::new(), vec![write]).await?;
    shared.lease.store(lease, Ordering::Release);
    Ok(())
}

/// Renews the lease until the store is dropped.
pub(crate) async fn keep_alive(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(shared.replica_ttl / 3).await;
        let renewed = match shared.etcd.keep_alive(shared.lease()).await {
            Ok(ttl) if ttl > 0 => Ok(()),
            Ok(_) => {
                tracing::warn!(replica = %shared.replica_id, "this replica's etcd lease ran out; registering again");
                register(&shared).await
            }
            Err(err) => Err(err),
        };
        match renewed {
            Ok(()) => shared.lease_healthy(),
            Err(err) => shared.lease_broke(&err),
        }
    }
}
