//! Applying the changes other replicas made (a shared state store's `remote_changes`), without etcd: the test plays
//! the store's part and feeds the changes in. Another replica's install is loaded into this engine and served, its
//! pause closes this gate under its id and hands back this replica's requests (acknowledged with them), its resume
//! and unload are applied, and none of them is recorded again.

use tokio::sync::{mpsc, oneshot};

use super::*;
use crate::contract::StateError;
use crate::state::{
    MemoryStore, PauseRecord, RecordedSource, RecordedState, Recording, RemoteChange, ReplicaRecord, StateChange,
    StateStore,
};

/// A memory store that hands out a feed of remote changes and counts what this replica records; it lists this
/// replica and one other, [`HOLDER`].
#[derive(Debug)]
pub(super) struct SharedByTest {
    pub(super) records: MemoryStore,
    recorded_changes: Mutex<Vec<StateChange>>,
    changes: Mutex<Option<mpsc::UnboundedReceiver<RemoteChange>>>,
}

#[async_trait::async_trait]
impl StateStore for SharedByTest {
    async fn recorded(&self) -> Result<RecordedState, StateError> {
        self.records.recorded().await
    }

    fn record(&self, changes: Vec<StateChange>) -> Recording {
        self.recorded_changes.lock().extend(changes.iter().cloned());
        self.records.record(changes)
    }

    fn issue_version(&self, name: &AdapterName) -> Recording<AdapterVersion> {
        self.records.issue_version(name)
    }

    fn new_pause_id(&self) -> PauseId {
        self.records.new_pause_id()
    }

    fn remote_changes(&self) -> Option<mpsc::UnboundedReceiver<RemoteChange>> {
        self.changes.lock().take()
    }

    async fn replicas(&self) -> Result<Vec<ReplicaRecord>, StateError> {
        let listed = |id: &str, http_addr: &str, this_replica| ReplicaRecord {
            id: id.into(),
            grpc_addr: String::new(),
            http_addr: http_addr.into(),
            this_replica,
        };
        Ok(vec![listed("this-one", "127.0.0.1:2", true), listed(HOLDER, "127.0.0.1:1", false)])
    }
}

/// The id of the other replica [`SharedByTest`] lists.
pub(super) const HOLDER: &str = "replica-a";

async fn replica() -> (Coordinator, Arc<SharedByTest>, Arc<ScriptedEngine>, mpsc::UnboundedSender<RemoteChange>) {
    replica_with(CoordinatorConfig::default()).await
}

/// A replica started with `config` (its state store replaced by a [`SharedByTest`]).
pub(super) async fn replica_with(
    config: CoordinatorConfig,
) -> (Coordinator, Arc<SharedByTest>, Arc<ScriptedEngine>, mpsc::UnboundedSender<RemoteChange>) {
    replica_joining(config, Vec::new()).await
}

/// A replica started with `config` on a shared record that other replicas wrote `recorded` to before it started.
pub(super) async fn replica_joining(
    config: CoordinatorConfig,
    recorded: Vec<StateChange>,
) -> (Coordinator, Arc<SharedByTest>, Arc<ScriptedEngine>, mpsc::UnboundedSender<RemoteChange>) {
    let (feed, changes) = mpsc::unbounded_channel();
    let store = Arc::new(SharedByTest {
        records: MemoryStore::new(),
        recorded_changes: Mutex::default(),
        changes: Mutex::new(Some(changes)),
    });
    if !recorded.is_empty() {
        store.records.record(recorded).await.expect("recorded before the start");
    }
    let engine = Arc::new(ScriptedEngine::new(HOLD_AFTER));
    let config = CoordinatorConfig { state: store.clone(), ..config };
    let coordinator = Coordinator::start(engine.clone(), config).await.expect("the coordinator starts");
    (coordinator, store, engine, feed)
}

pub(super) fn installed(lora: &str, version: u64) -> RemoteChange {
    let source = RecordedSource { path: format!("/a/{lora}-{version}").into(), confined: false, ..Default::default() };
    RemoteChange::Installed { name: name(lora), version: AdapterVersion(version), source }
}

fn remote_pause(lora: &str, id: &str, mode: PauseMode) -> PauseRecord {
    PauseRecord {
        adapter: name(lora),
        pause_id: PauseId::parse(id).expect("an id").expect("not empty"),
        owner: "trainer".into(),
        mode,
        lease_expires_at: None,
    }
}

#[tokio::test]
async fn another_replicas_install_pause_resume_and_unload_are_applied_here_and_not_recorded_again() {
    let (coordinator, store, engine, feed) = replica().await;
    feed.send(installed("meow", 3)).expect("fed");
    eventually("meow is served at version 3", || async {
        coordinator.lora(&name("meow")).is_ok_and(|adapter| adapter.gate().version == AdapterVersion(3))
    })
    .await;
    assert_eq!(engine.installed(&name("meow")), Some(AdapterVersion(3)), "loaded into this engine");
    feed.send(installed("meow", 2)).expect("fed");
    feed.send(installed("meow", 5)).expect("fed");
    eventually("meow moved to version 5, never back to 2", || async {
        coordinator.lora(&name("meow")).is_ok_and(|adapter| adapter.gate().version == AdapterVersion(5))
    })
    .await;

    let running = spawn_sample(&coordinator, "meow", LONG, "here-1");
    eventually("a request in flight", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
    let (acknowledge, acknowledged) = oneshot::channel();
    let record = remote_pause("meow", "pause-other-1", PauseMode::Abort);
    feed.send(RemoteChange::Paused { record, acknowledge }).expect("fed");
    let report = tokio::time::timeout(Duration::from_secs(10), acknowledged).await.expect("in time").expect("acked");
    assert_eq!(report.aborted.iter().map(ToString::to_string).collect::<Vec<_>>(), ["here-1"]);
    assert!(coordinator.lora(&name("meow")).expect("served").gate().paused, "closed before the acknowledgement");
    assert_eq!(joined(running).await.expect("handed back").sequences[0].finish_reason, FinishReason::Abort);
    let paused = status(&coordinator, "meow").await;
    assert_eq!(paused.pauses[0].pause_id.as_str(), "pause-other-1", "under the other replica's id");

    // A resume of that pause on this replica works as for a pause made here.
    let held = spawn_sample(&coordinator, "meow", SHORT, "here-2");
    eventually("the new request is held", || async { status(&coordinator, "meow").await.held == 1 }).await;
    let pause_id = PauseId::parse("pause-other-1").expect("id").expect("some");
    feed.send(RemoteChange::PauseEnded { adapter: name("meow"), pause_id }).expect("fed");
    assert_eq!(joined(held).await.expect("ran once reopened").sequences[0].finish_reason, FinishReason::Length);

    feed.send(RemoteChange::Unloaded { name: name("meow") }).expect("fed");
    eventually("meow is gone", || async { coordinator.lora(&name("meow")).is_err() }).await;
    assert!(store.recorded_changes.lock().is_empty(), "nothing recorded again: {:?}", store.recorded_changes.lock());
}

#[tokio::test]
async fn a_resync_squares_pauses_versions_and_adapters_with_the_record() {
    let (coordinator, _store, _engine, feed) = replica().await;
    feed.send(installed("meow", 1)).expect("fed");
    feed.send(installed("woof", 1)).expect("fed");
    // A pause for an adapter this replica does not serve yet is left to the install (which reads the record).
    eventually("both served", || async {
        coordinator.lora(&name("meow")).is_ok() && coordinator.lora(&name("woof")).is_ok()
    })
    .await;
    let (acknowledge, _) = oneshot::channel();
    feed.send(RemoteChange::Paused { record: remote_pause("meow", "pause-gone", PauseMode::Keep), acknowledge })
        .expect("fed");
    eventually("both served, meow paused", || async {
        coordinator.lora(&name("woof")).is_ok()
            && coordinator.lora(&name("meow")).is_ok_and(|adapter| adapter.gate().paused)
    })
    .await;
    let source = RecordedSource { path: "/a/meow-4".into(), confined: false, ..Default::default() };
    let record = crate::state::AdapterRecord {
        name: name("meow"),
        source,
        version: AdapterVersion(4),
        declared_path: None,
        retained: Vec::new(),
        staleness: None,
    };
    let resynced = RecordedState {
        adapters: vec![record],
        pauses: vec![remote_pause("meow", "pause-kept", PauseMode::Abort)],
        global_pause: None,
        front_records: Vec::new(),
    };
    feed.send(RemoteChange::Resynced(resynced)).expect("fed");
    eventually("woof unloaded, meow at 4 under the recorded pause only", || async {
        let Ok(meow) = coordinator.lora(&name("meow")) else { return false };
        let pauses = meow.status().await.map(|status| status.pauses).unwrap_or_default();
        coordinator.lora(&name("woof")).is_err()
            && meow.gate().version == AdapterVersion(4)
            && pauses.len() == 1
            && pauses[0].pause_id.as_str() == "pause-kept"
    })
    .await;
}
