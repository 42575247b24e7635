//! The control plane's state that outlives the process: which adapters are loaded (name, source, version), the
//! highest version ever issued for each name, and the live pauses. The coordinator consumes it through the
//! [`StateStore`] trait, defined here (the consuming crate); backends live elsewhere (`loragate-state`: an embedded
//! database on disk), and [`MemoryStore`] keeps the same records in memory (`--state-dir none`, and tests).
//!
//! Data flow:
//! - **Writes are ordered where the state changes.** The single writer of a piece of state (an adapter's actor for
//!   its pauses, installs and unload; the manager for the global pause) calls [`StateStore::record`] in the same
//!   handler that changes the state in memory. `record` only queues the change (it never blocks the actor) and
//!   returns a [`Recording`], which the caller's outside half awaits before answering its client: an answered pause
//!   is on disk. A queued change is applied whether or not its `Recording` is awaited.
//! - **Versions are issued by the store, in one place** ([`StateStore::issue_version`]): durably, before the engine
//!   loads anything, so a version is never issued twice for a name, across failed loads, unloads, reloads and
//!   restarts (and, for a shared backend, across replicas).
//! - **Start reads everything once** ([`StateStore::recorded`]); the coordinator loads each recorded adapter again
//!   at its recorded version and adopts its pauses (leases are wall-clock times, so one that ran out while the server
//!   was down is gone).
//! - **The hot path never touches the store**: admission, hand-back and sampling read only memory.
//!
//! What is recorded: adapters loaded (not the base model), pauses with a named owner (anonymous included), the
//! global pause, and [`FrontRecord`]s: documents a front keeps for itself (the Tinker front's pending samples and
//! finished results), opaque to the store and to the coordinator. Not recorded: a swap's own pause (it belongs to one call, which dies with the process), requests in
//! flight, held or kept (they die with their connections).
//!
//! Several coordinators may share one store (`loragate-etcd`): the store then hands each one the changes the others
//! made ([`StateStore::remote_changes`]), and the coordinator applies them to its own engine and gates without
//! recording them again: a pause another replica made goes through the path that puts a recorded pause back at start
//! (`AdapterCell::adopt`), then acts on this replica's admitted requests as its mode says and acknowledges what they
//! handed back; the pausing replica's [`StateStore::record_pause`] resolves once every live replica acknowledged.

mod memory;

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::SystemTime;

pub use crate::contract::StateError;
use crate::contract::{AbortReport, AdapterName, AdapterVersion, PauseId, PauseMode, Sha256, StalenessPolicy};
use async_trait::async_trait;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

pub use self::memory::MemoryStore;

/// A change queued in a [`StateStore`]: resolves once it is durable (or failed). Dropping it does not cancel the
/// change.
pub type Recording<T = ()> = BoxFuture<'static, Result<T, StateError>>;

/// A [`Recording`] of nothing: resolves at once.
pub(crate) fn nothing_to_record() -> Recording {
    Box::pin(std::future::ready(Ok(())))
}

/// Where an adapter's weights were loaded from, as recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordedSource {
    /// The adapter directory (for pushed weights: their directory in the adapter store).
    pub path: PathBuf,
    /// Whether the path came from a request (`LoadLoraAdapter`): it is resolved against the adapter root again when
    /// it is loaded at start, so a root that changed since confines it as it would a new request. Paths named by
    /// the operator (`--adapter`) are trusted as they are.
    pub confined: bool,
    /// The SHA-256 of the weights file, when it was known (absent in records written before it was recorded).
    pub sha256: Option<Sha256>,
    /// The size of the weights file in bytes, when it was known.
    pub bytes: Option<u64>,
    /// Whether the weights were pushed (they live in the adapter store, under `path`).
    pub pushed: bool,
    /// For pushed weights in a store shared by replicas: the id of the replica whose adapter store holds them (at
    /// `path` there). Another replica fetches them from it ([`crate::VersionFetcher`]). The shared store sets it when
    /// the version is recorded; `None` elsewhere.
    pub holder: Option<String>,
}

/// One servable version of an adapter other than its current one, as recorded (`--retain-versions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionRecord {
    /// The version.
    pub version: AdapterVersion,
    /// Where its weights came from.
    pub source: RecordedSource,
}

/// One loaded adapter, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterRecord {
    /// Its name.
    pub name: AdapterName,
    /// Where its current weights came from.
    pub source: RecordedSource,
    /// Its current weights version.
    pub version: AdapterVersion,
    /// The path its `--adapter` flag named when the flag was last reconciled, if it was ever given one: a restart with
    /// the same flag keeps whatever was loaded since (see `docs/state.md`).
    pub declared_path: Option<PathBuf>,
    /// The older versions still servable to exact pins when it was recorded, oldest first.
    pub retained: Vec<VersionRecord>,
    /// Its staleness bound, if one is set.
    pub staleness: Option<StalenessPolicy>,
}

/// One live pause with a named owner, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PauseRecord {
    /// The paused adapter.
    pub adapter: AdapterName,
    /// The pause's id (what a resume releases).
    pub pause_id: PauseId,
    /// Its owner (empty: the anonymous owner).
    pub owner: String,
    /// The mode of its latest pause call.
    pub mode: PauseMode,
    /// When its lease runs out, as wall-clock time; `None` without a lease.
    pub lease_expires_at: Option<SystemTime>,
}

/// A document a front keeps in the store for itself, opaque to the store and the coordinator: `table` names the
/// front's kind of record (`tinker/samples`), `key` is unique within the table, `value` is the front's own JSON.
/// A shared store hands each replica only the records it wrote (or took over from a replica that is gone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontRecord {
    /// The front's kind of record.
    pub table: String,
    /// Unique within the table.
    pub key: String,
    /// The front's document.
    pub value: String,
}

/// Everything a store holds, as read at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordedState {
    /// The loaded adapters, ordered by name.
    pub adapters: Vec<AdapterRecord>,
    /// The live pauses.
    pub pauses: Vec<PauseRecord>,
    /// The global pause's mode, if it is set.
    pub global_pause: Option<PauseMode>,
    /// The fronts' records, ordered by table and key.
    pub front_records: Vec<FrontRecord>,
}

/// One change of the recorded state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateChange {
    /// `name` now serves `version`, loaded from `source` (a first load or a swap).
    Installed {
        /// The adapter.
        name: AdapterName,
        /// Its new version (one the store issued).
        version: AdapterVersion,
        /// Where the weights came from.
        source: RecordedSource,
        /// The older versions that stay servable to exact pins, oldest first (they replace the recorded ones).
        retained: Vec<VersionRecord>,
    },
    /// `name`'s staleness bound was set, or cleared (`None`).
    Staleness {
        /// The adapter.
        name: AdapterName,
        /// The policy.
        policy: Option<StalenessPolicy>,
    },
    /// The operator's `--adapter` flag for `name` named `path` (see [`AdapterRecord::declared_path`]).
    Declared {
        /// The adapter.
        name: AdapterName,
        /// The flag's path.
        path: PathBuf,
    },
    /// `name` was unloaded: its record and its pauses go; the highest version issued for the name stays.
    Unloaded {
        /// The adapter.
        name: AdapterName,
    },
    /// A load that was issued `version` failed: the version is given back if no later one was issued, so failed
    /// loads leave no gaps (it was never installed, so no token carries it).
    VersionReturned {
        /// The adapter.
        name: AdapterName,
        /// The version its load was issued.
        version: AdapterVersion,
    },
    /// A pause was made or renewed (same id: the record is replaced).
    Paused(PauseRecord),
    /// A pause ended: released, withdrawn, or its lease ran out.
    PauseEnded {
        /// The adapter.
        adapter: AdapterName,
        /// The pause.
        pause_id: PauseId,
    },
    /// The global pause was set in this mode, or cleared (`None`).
    GlobalPause(Option<PauseMode>),
    /// A front's record was written (a record with the same table and key is replaced).
    FrontRecordPut(FrontRecord),
    /// A front's record was removed (nothing if there is none).
    FrontRecordRemoved {
        /// Its table.
        table: String,
        /// Its key.
        key: String,
    },
}

/// A change another replica made to a shared store, for this replica to apply to its own engine and gates (without
/// recording it again).
#[derive(Debug)]
#[non_exhaustive]
pub enum RemoteChange {
    /// Another replica installed `version` of `name`: load it into this engine and serve it.
    Installed {
        /// The adapter.
        name: AdapterName,
        /// Its new version.
        version: AdapterVersion,
        /// Where the weights came from.
        source: RecordedSource,
    },
    /// Another replica unloaded `name`.
    Unloaded {
        /// The adapter.
        name: AdapterName,
    },
    /// Another replica made or renewed this pause: close the gate, act on the admitted requests as its mode says,
    /// and send what they handed back on `acknowledge` (the pausing replica's answer sums them).
    Paused {
        /// The pause.
        record: PauseRecord,
        /// Where the hand-backs go once every admitted request was handed back (or the acknowledgement timed out).
        acknowledge: oneshot::Sender<AbortReport>,
    },
    /// A pause ended on another replica (released, withdrawn, or its lease ran out).
    PauseEnded {
        /// The adapter.
        adapter: AdapterName,
        /// The pause.
        pause_id: PauseId,
    },
    /// Another replica set or cleared `name`'s staleness bound.
    Staleness {
        /// The adapter.
        name: AdapterName,
        /// The policy (`None`: cleared).
        policy: Option<StalenessPolicy>,
    },
    /// The store could not follow the others' changes for a while (it was unreachable) and read everything again:
    /// make this replica match it (pauses adopted or released, newer versions loaded, unloaded adapters removed).
    Resynced(RecordedState),
}

/// One coordinator sharing a store, as `ListReplicas` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaRecord {
    /// Its id, unique among the replicas.
    pub id: String,
    /// Its gRPC address.
    pub grpc_addr: String,
    /// Its HTTP address.
    pub http_addr: String,
    /// Whether it is the coordinator answering.
    pub this_replica: bool,
}

/// Where the coordinator keeps what must survive a restart. Implementations apply the changes queued by
/// [`StateStore::record`] and [`StateStore::issue_version`] in the order of the calls, each call atomically.
#[async_trait]
pub trait StateStore: Send + Sync + fmt::Debug + 'static {
    /// Everything recorded (read once, at start).
    async fn recorded(&self) -> Result<RecordedState, StateError>;

    /// Queues `changes`, to be applied atomically after every change queued before. Must not block: it is called
    /// by actors. The change is ordered by this call, not by polling the returned future.
    fn record(&self, changes: Vec<StateChange>) -> Recording;

    /// Queues the issue of `name`'s next version: one above every version ever issued for the name (including
    /// unloaded ones). Resolves once the issue is durable. Ordered like [`StateStore::record`].
    fn issue_version(&self, name: &AdapterName) -> Recording<AdapterVersion>;

    /// A pause id never given out before by this store (across restarts for a durable store, and across replicas
    /// for a shared one).
    fn new_pause_id(&self) -> PauseId;

    /// Queues a pause's record, like [`StateStore::record`] with [`StateChange::Paused`]. A shared store resolves it
    /// once every other live replica applied the pause (closed its gate and handed back its requests), with what they
    /// handed back, and fails it if some live replica did not; a store only this process uses hands back nothing.
    fn record_pause(&self, record: PauseRecord) -> Recording<AbortReport> {
        let recorded = self.record(vec![StateChange::Paused(record)]);
        Box::pin(async move { recorded.await.map(|()| AbortReport::default()) })
    }

    /// Whether state changes can be recorded now: a shared store that lost its servers answers
    /// [`StateError::Unavailable`], so that a change is refused before it takes effect here. A hint (the servers may
    /// go away right after), never a wait.
    fn check_available(&self) -> Result<(), StateError> {
        Ok(())
    }

    /// Whether the store works now, for health checks: an error says why it cannot record (a local store whose
    /// disk failed and that could not be opened again yet). Never a wait. The default (memory, and etcd, whose
    /// replicas ride out an unreachable etcd and say so through [`StateStore::check_available`]) is healthy.
    fn health(&self) -> Result<(), StateError> {
        Ok(())
    }

    /// The changes other replicas make, for this replica to apply; given once (later calls answer `None`). `None`
    /// for a store only this process writes.
    fn remote_changes(&self) -> Option<mpsc::UnboundedReceiver<RemoteChange>> {
        None
    }

    /// Announces this replica's addresses to the other replicas (a shared store); nothing for the others.
    fn announce(&self, _grpc_addr: SocketAddr, _http_addr: SocketAddr) -> Recording {
        nothing_to_record()
    }

    /// Leaves the replicas sharing this store (at shutdown): the others stop counting this one at once rather than
    /// when its registration runs out. Nothing for a store only this process uses.
    fn leave(&self) -> Recording {
        nothing_to_record()
    }

    /// The live replicas sharing this store, this one included; empty for a store only this process uses.
    async fn replicas(&self) -> Result<Vec<ReplicaRecord>, StateError> {
        Ok(Vec::new())
    }
}
