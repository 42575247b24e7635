//! [`EtcdStore`]: a [`StateStore`] shared by several coordinators (`--state etcd://HOST:PORT[,…]/PREFIX`), so that a
//! trainer may talk to any of them:
//!
//! - **Versions** are issued by compare-and-swap on `issued/NAME` (two replicas never issue the same one); an install
//!   is recorded under `adapters/NAME` (an older one never replaces a newer one) and every other replica loads it
//!   into its own engine.
//! - **Pauses** are keys `pauses/NAME/PAUSE_ID` (under an etcd lease when they have one, so etcd ends them on time on
//!   every replica). A pause's record resolves only once every other live replica closed its gate and handed back
//!   its in-flight requests, acknowledging under `acks/PAUSE_ID/REPLICA`; the answer sums what they handed back. The
//!   pausing replica learns of those acknowledgements, and of which replicas must send one, from the one watch it
//!   keeps open anyway ([`acks`]): a pause costs its own write and the others' acknowledgements, no other etcd call.
//!   Resumes are deletes every replica applies.
//! - **Replicas** register under `replicas/ID` with an etcd lease ([`registration`]); a dead one stops counting once
//!   its lease runs out. `ListReplicas` reads them.
//! - **etcd unreachable**: samples keep running on the gates each replica has (the hot path never reads the store);
//!   state changes are refused with [`StateError::Unavailable`] naming etcd, before they take effect
//!   ([`StateStore::check_available`]); the watch is opened again from the revision it had reached, so a replica
//!   catches up on everything it missed when etcd returns ([`follower`]).
//!
//! - **Front records** (the Tinker front's pending samples and results) belong to the replica that wrote them: each
//!   replica reads back only its own, and takes over, at start, those of replicas that are gone ([`records`]).
//!
//! The key layout is in [`keys`]; `docs/state.md` says what is and is not linearizable.

mod acks;
mod client;
mod follower;
mod keys;
mod records;
mod registration;
mod snapshot;
mod url;
mod writer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use loragate_core::state::{
    PauseRecord, RecordedState, Recording, RemoteChange, ReplicaRecord, StateChange, StateError, StateStore,
};
use loragate_core::{AbortReport, AdapterName, AdapterVersion, PauseId};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio_util::task::AbortOnDropHandle;

use self::acks::Acks;
use self::client::{Etcd, Write};
use self::keys::{Keys, StoredAck, StoredReplica};
pub use self::url::{EtcdUrl, EtcdUrlError};
use self::writer::Op;

/// How an [`EtcdStore`] joins its replicas.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// The servers and the key prefix.
    pub url: EtcdUrl,
    /// The TTL of this replica's registration lease: how long after a crash it stops counting for pauses.
    pub replica_ttl: Duration,
    /// How long a pause waits for every other live replica to apply it before it fails (and is withdrawn). Longer
    /// than `replica_ttl`, so a replica that died during the pause stops counting first.
    pub ack_timeout: Duration,
}

impl EtcdConfig {
    /// Defaults for `url`: a 5 s registration lease, 15 s to acknowledge a pause.
    pub fn new(url: EtcdUrl) -> Self {
        Self { url, replica_ttl: Duration::from_secs(5), ack_timeout: Duration::from_secs(15) }
    }
}

/// The state shared through etcd, as one replica sees it.
pub struct EtcdStore {
    shared: Arc<Shared>,
    ops: mpsc::UnboundedSender<Op>,
    /// The state read when connecting (what the first [`StateStore::recorded`] answers, so that the watch starts
    /// right after it).
    initial: Mutex<Option<RecordedState>>,
    changes: Mutex<Option<mpsc::UnboundedReceiver<RemoteChange>>>,
    last_pause_number: AtomicU64,
    _tasks: Vec<AbortOnDropHandle<()>>,
}

/// What the store's tasks share.
pub(crate) struct Shared {
    pub(crate) etcd: Etcd,
    pub(crate) keys: Keys,
    pub(crate) replica_id: String,
    pub(crate) replica_ttl: Duration,
    pub(crate) lease: AtomicI64,
    pub(crate) addresses: Mutex<StoredReplica>,
    /// What the watch showed of registrations and of the acknowledgements of this replica's pauses.
    pub(crate) acks: Acks,
    lease_ok: AtomicBool,
    watch_ok: AtomicBool,
    /// Why etcd is unreachable, while it is.
    trouble: Mutex<String>,
}

impl Shared {
    pub(crate) fn lease(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    pub(crate) fn lease_healthy(&self) {
        if !self.lease_ok.swap(true, Ordering::AcqRel) {
            tracing::info!(replica = %self.replica_id, "etcd is reachable again: this replica's registration holds");
        }
    }

    pub(crate) fn lease_broke(&self, err: &StateError) {
        *self.trouble.lock() = err.to_string();
        if self.lease_ok.swap(false, Ordering::AcqRel) {
            tracing::error!(replica = %self.replica_id, %err, "etcd is unreachable: refusing state changes");
        }
    }

    pub(crate) fn watch_healthy(&self) {
        if !self.watch_ok.swap(true, Ordering::AcqRel) {
            tracing::info!(replica = %self.replica_id, "following the other replicas again");
        }
    }

    pub(crate) fn watch_broke(&self, err: &StateError) {
        *self.trouble.lock() = err.to_string();
        self.acks.broke(err);
        if self.watch_ok.swap(false, Ordering::AcqRel) {
            tracing::error!(replica = %self.replica_id, %err, "lost the watch on etcd: refusing state changes");
        }
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").field("replica", &self.shared.replica_id).field("keys", &self.shared.keys).finish()
    }
}

impl EtcdStore {
    /// Connects, registers this replica under a new lease, reads the state and starts following the others. Fails
    /// with [`StateError::Unavailable`] naming etcd when it cannot be reached.
    pub async fn connect(config: EtcdConfig) -> Result<Self, StateError> {
        let replica_id = format!("{:08x}", rand::random::<u32>());
        let shared = Arc::new(Shared {
            etcd: Etcd::connect(&config.url)?,
            keys: Keys::new(config.url.key_prefix()),
            acks: Acks::new(replica_id.clone(), config.ack_timeout),
            replica_id,
            replica_ttl: config.replica_ttl,
            lease: AtomicI64::new(0),
            addresses: Mutex::new(StoredReplica::default()),
            lease_ok: AtomicBool::new(true),
            watch_ok: AtomicBool::new(true),
            trouble: Mutex::new(String::new()),
        });
        // Registered before the state is read: a pause written after the read is seen by the watch and acknowledged;
        // one written before it is acknowledged here (nothing is in flight yet, and the coordinator adopts it before
        // serving).
        registration::register(&shared).await?;
        let (mut kvs, revision) = shared.etcd.range(shared.keys.all(), true).await?;
        records::take_over(&shared, &mut kvs).await?;
        let mut snapshot = snapshot::read_state(&shared.keys, kvs, &shared.replica_id)?;
        shared.acks.read_at(revision, std::mem::take(&mut snapshot.registered));
        let acks: Vec<Write> = snapshot
            .pause_revisions
            .iter()
            .map(|(pause, written_at)| Write::Put {
                key: shared.keys.ack(&pause.pause_id, &shared.replica_id),
                value: StoredAck::of(*written_at, &AbortReport::default()).encode(),
                lease: shared.lease(),
            })
            .collect();
        // In as few transactions as etcd takes (at most MAX_TXN_OPS writes each), not one per pause.
        for batch in acks.chunks(client::MAX_TXN_OPS) {
            shared.etcd.txn(Vec::new(), batch.to_vec()).await?;
        }
        let (ops, queued) = mpsc::unbounded_channel();
        let (changes_out, changes) = mpsc::unbounded_channel();
        let tasks = vec![
            AbortOnDropHandle::new(tokio::spawn(writer::run(shared.clone(), queued))),
            AbortOnDropHandle::new(tokio::spawn(registration::keep_alive(shared.clone()))),
            AbortOnDropHandle::new(tokio::spawn(follower::run(shared.clone(), revision, changes_out))),
        ];
        tracing::info!(replica = %shared.replica_id, url = %config.url, "joined the replicas sharing state in etcd");
        Ok(Self {
            shared,
            ops,
            initial: Mutex::new(Some(snapshot.state)),
            changes: Mutex::new(Some(changes)),
            last_pause_number: AtomicU64::new(0),
            _tasks: tasks,
        })
    }

    /// This replica's id (what `ListReplicas` shows).
    pub fn replica_id(&self) -> &str {
        &self.shared.replica_id
    }

    fn queue(&self, changes: Vec<StateChange>) -> oneshot::Receiver<Result<i64, StateError>> {
        let (reply, answer) = oneshot::channel();
        let _ = self.ops.send(Op::Record(changes, reply));
        answer
    }
}

fn writer_gone() -> StateError {
    StateError::Failed("the etcd store's writer stopped".into())
}

#[async_trait]
impl StateStore for EtcdStore {
    async fn recorded(&self) -> Result<RecordedState, StateError> {
        if let Some(initial) = self.initial.lock().take() {
            return Ok(initial);
        }
        let (kvs, _) = self.shared.etcd.range(self.shared.keys.all(), true).await?;
        Ok(snapshot::read_state(&self.shared.keys, kvs, &self.shared.replica_id)?.state)
    }

    fn record(&self, changes: Vec<StateChange>) -> Recording {
        let answer = self.queue(changes);
        Box::pin(async move { answer.await.map_err(|_| writer_gone())?.map(drop) })
    }

    fn issue_version(&self, name: &AdapterName) -> Recording<AdapterVersion> {
        let (reply, answer) = oneshot::channel();
        let _ = self.ops.send(Op::Issue(name.clone(), reply));
        Box::pin(async move { answer.await.map_err(|_| writer_gone())? })
    }

    fn new_pause_id(&self) -> PauseId {
        let n = self.last_pause_number.fetch_add(1, Ordering::Relaxed) + 1;
        let raw = format!("pause-{}-{n}", self.shared.replica_id);
        PauseId::parse(&raw).ok().flatten().unwrap_or_else(|| PauseId::numbered(n))
    }

    fn record_pause(&self, record: PauseRecord) -> Recording<AbortReport> {
        let pause_id = record.pause_id.clone();
        let answer = self.queue(vec![StateChange::Paused(record)]);
        let shared = self.shared.clone();
        Box::pin(async move {
            let revision = answer.await.map_err(|_| writer_gone())??;
            shared.acks.wait(&pause_id, revision).await
        })
    }

    fn check_available(&self) -> Result<(), StateError> {
        let shared = &self.shared;
        if shared.lease_ok.load(Ordering::Acquire) && shared.watch_ok.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(StateError::Unavailable(format!("etcd is unreachable ({})", shared.trouble.lock())))
    }

    fn remote_changes(&self) -> Option<mpsc::UnboundedReceiver<RemoteChange>> {
        self.changes.lock().take()
    }

    fn announce(&self, grpc_addr: SocketAddr, http_addr: SocketAddr) -> Recording {
        let addresses = StoredReplica { grpc_addr: grpc_addr.to_string(), http_addr: http_addr.to_string() };
        *self.shared.addresses.lock() = addresses.clone();
        let shared = self.shared.clone();
        Box::pin(async move {
            let key = shared.keys.replica(&shared.replica_id);
            let write = Write::Put { key, value: addresses.encode(), lease: shared.lease() };
            shared.etcd.txn(Vec::new(), vec![write]).await.map(drop)
        })
    }

    async fn replicas(&self) -> Result<Vec<ReplicaRecord>, StateError> {
        let (kvs, _) = self.shared.etcd.range(&self.shared.keys.replicas(), true).await?;
        let mut replicas: Vec<ReplicaRecord> = kvs
            .iter()
            .filter_map(|kv| {
                let id = Keys::last_segment(&kv.key)?;
                let StoredReplica { grpc_addr, http_addr } = StoredReplica::decode(&kv.value);
                let this_replica = id == self.shared.replica_id;
                Some(ReplicaRecord { id, grpc_addr, http_addr, this_replica })
            })
            .collect();
        replicas.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(replicas)
    }

    fn leave(&self) -> Recording {
        let shared = self.shared.clone();
        Box::pin(async move { shared.etcd.revoke_lease(shared.lease()).await })
    }
}
