//! A restart on the same state store: adapters come back at their versions, versions never repeat, recorded pauses
//! hold with their ids, owners and wall-clock leases, an adapter whose weights are gone is listed with its error,
//! `--adapter` flags reconcile, and a change the store cannot record is not left half-made.

use std::path::PathBuf;
use std::time::SystemTime;

use super::*;
use crate::contract::StateError;
use crate::state::{MemoryStore, PauseRecord, RecordedSource, RecordedState, Recording, StateChange, StateStore};

/// A coordinator over a fresh scripted engine (a restarted process has nothing loaded) on `store`.
async fn started_on(store: &Arc<dyn StateStore>) -> (Coordinator, Arc<ScriptedEngine>) {
    let engine = Arc::new(ScriptedEngine::new(HOLD_AFTER));
    let config = CoordinatorConfig { state: store.clone(), ..CoordinatorConfig::default() };
    (Coordinator::start(engine.clone(), config).await.expect("the coordinator starts"), engine)
}

async fn restarted(before: Coordinator, store: &Arc<dyn StateStore>) -> (Coordinator, Arc<ScriptedEngine>) {
    before.shutdown(Duration::ZERO).await;
    drop(before);
    started_on(store).await
}

fn memory() -> Arc<dyn StateStore> {
    Arc::new(MemoryStore::new())
}

async fn load(coordinator: &Coordinator, lora: &str, dir: &str) -> Result<AdapterVersion, CoreError> {
    coordinator.load_adapter(&name(lora), AdapterSource::trusted(dir)).await.map(|installed| installed.version)
}

#[tokio::test]
async fn adapters_come_back_at_their_versions_and_no_version_is_issued_twice() {
    let store = memory();
    let (coordinator, _) = started_on(&store).await;
    for step in 1..=3 {
        assert_eq!(load(&coordinator, "meow", &format!("/a/meow-{step}")).await.ok(), Some(AdapterVersion(step)));
    }
    assert!(load(&coordinator, "meow", "/a/bad").await.is_err(), "a failed load installs nothing");
    load(&coordinator, "woof", "/a/woof").await.expect("woof v1");
    coordinator.unload_adapter(&name("woof")).await.expect("unloaded");

    let (coordinator, engine) = restarted(coordinator, &store).await;
    let listed: Vec<(String, AdapterVersion)> = coordinator
        .list_adapters()
        .await
        .into_iter()
        .map(|status| (status.key.as_wire_str().to_owned(), status.version))
        .collect();
    assert_eq!(listed, [("meow".to_owned(), AdapterVersion(3))], "the unloaded woof stays unloaded");
    assert_eq!(engine.installed(&name("meow")), Some(AdapterVersion(3)), "loaded again at its recorded version");
    let output = joined(spawn_sample(&coordinator, "meow", SHORT, "after")).await.expect("meow samples");
    assert_eq!(
        output.sequences[0].segments,
        vec![Segment { version: AdapterVersion(3), kv_version: AdapterVersion(3), start: 0, end: SHORT }]
    );
    assert_eq!(load(&coordinator, "meow", "/a/meow-4").await.ok(), Some(AdapterVersion(4)));
    assert_eq!(load(&coordinator, "woof", "/a/woof").await.ok(), Some(AdapterVersion(2)), "a reload continues");
}

#[tokio::test]
async fn recorded_pauses_hold_after_a_restart_with_their_ids_owners_modes_and_leases() {
    let store = memory();
    let (coordinator, _) = started_on(&store).await;
    load(&coordinator, "meow", "/a/meow").await.expect("meow");
    load(&coordinator, "woof", "/a/woof").await.expect("woof");
    let leased = PauseRequest::parse(PauseMode::Keep, "trainer", 600.0).expect("valid");
    let trainer = coordinator.pause(&name("meow"), leased, None).await.expect("paused").pause_id;
    let anonymous = coordinator.abort(&name("meow")).await.expect("paused").pause_id;
    let released = coordinator.pause(&name("woof"), PauseRequest::new(PauseMode::Wait), None).await.expect("paused");
    coordinator.resume(&name("woof"), Some(released.pause_id.clone())).await.expect("resumed");
    coordinator.pause_all(PauseMode::Keep, KvPolicy::Recompute, None).await.expect("the global pause");

    let (coordinator, _) = restarted(coordinator, &store).await;
    let meow = status(&coordinator, "meow").await;
    assert!(meow.paused);
    let pauses: Vec<(PauseId, String, PauseMode)> =
        meow.pauses.iter().map(|pause| (pause.pause_id.clone(), pause.owner.to_string(), pause.mode)).collect();
    assert!(pauses.contains(&(trainer.clone(), "trainer".into(), PauseMode::Keep)), "{pauses:?}");
    assert!(pauses.contains(&(anonymous.clone(), String::new(), PauseMode::Abort)), "{pauses:?}");
    assert!(pauses.iter().any(|(_, owner, _)| owner == "(global)"), "the global pause is set again: {pauses:?}");
    let lease_left = meow.pauses.iter().find(|pause| pause.pause_id == trainer).and_then(|pause| pause.lease_left);
    assert!(lease_left.is_some_and(|left| left > Duration::from_secs(500) && left <= Duration::from_secs(600)));
    assert!(coordinator.is_paused_globally().await.expect("answers"));
    assert!(status(&coordinator, "").await.paused, "the base model too");
    let woof = status(&coordinator, "woof").await;
    assert_eq!(woof.pauses.len(), 1, "woof's released pause stays released; only the global pause holds it");

    let held = spawn_sample(&coordinator, "meow", SHORT, "held");
    eventually("the sample is held", || async { status(&coordinator, "meow").await.held == 1 }).await;
    coordinator.resume_all().await.expect("the global resume");
    coordinator.resume(&name("meow"), Some(anonymous.clone())).await.expect("resumed");
    assert!(status(&coordinator, "meow").await.paused, "the trainer's pause still holds");
    let fresh = coordinator.abort(&name("woof")).await.expect("paused").pause_id;
    assert!(![&trainer, &anonymous, &released.pause_id].contains(&&fresh), "pause ids are never given out twice");
    coordinator.resume(&name("meow"), Some(trainer)).await.expect("resumed");
    joined(held).await.expect("the held sample runs once meow reopens");
    let recorded = store.recorded().await.expect("reads");
    assert_eq!(recorded.pauses.iter().map(|pause| &pause.pause_id).collect::<Vec<_>>(), [&fresh]);
    assert_eq!(recorded.global_pause, None);
}

#[tokio::test]
async fn a_lease_that_ran_out_while_down_is_gone_and_one_still_running_ends_on_time() {
    let store = memory();
    let (coordinator, _) = started_on(&store).await;
    load(&coordinator, "meow", "/a/meow").await.expect("meow");
    let pause = |owner: &str, id: u64, expires: SystemTime| PauseRecord {
        adapter: name("meow"),
        pause_id: PauseId::numbered(id),
        owner: owner.into(),
        mode: PauseMode::Abort,
        lease_expires_at: Some(expires),
    };
    let now = SystemTime::now();
    store
        .record(vec![
            StateChange::Paused(pause("expired", 90, now - Duration::from_secs(1))),
            StateChange::Paused(pause("running", 91, now + Duration::from_millis(400))),
        ])
        .await
        .expect("recorded");

    let (coordinator, _) = restarted(coordinator, &store).await;
    let owners: Vec<String> = status(&coordinator, "meow").await.pauses.iter().map(|p| p.owner.to_string()).collect();
    assert_eq!(owners, ["running"], "the lease that ran out while the server was down is gone");
    eventually("the running lease ends", || async { !status(&coordinator, "meow").await.paused }).await;
    assert!(store.recorded().await.expect("reads").pauses.is_empty(), "both records are gone");
}

#[tokio::test]
async fn an_adapter_whose_weights_are_gone_is_listed_with_its_error_refuses_samples_and_a_load_heals_it() {
    let store = memory();
    let source = RecordedSource { path: PathBuf::from("/vanished/bad"), confined: false, ..Default::default() };
    store
        .record(vec![StateChange::Installed {
            name: name("meow"),
            version: AdapterVersion(7),
            source,
            retained: Vec::new(),
        }])
        .await
        .ok();
    let issued = store.issue_version(&name("meow")).await.expect("issued");

    let (coordinator, _) = started_on(&store).await;
    let meow = status(&coordinator, "meow").await;
    assert_eq!(meow.version, AdapterVersion(7));
    let error = meow.weights_error.expect("listed with its error");
    assert!(error.contains("/vanished/bad") && error.contains("v7"), "{error}");
    match joined(spawn_sample(&coordinator, "meow", SHORT, "refused")).await {
        Err(CoreError::WeightsMissing { reason, .. }) => assert!(reason.contains("/vanished/bad"), "{reason}"),
        other => panic!("expected WeightsMissing, got {other:?}"),
    }
    assert_eq!(status(&coordinator, "meow").await.held, 0, "refused at once, not held");
    let paused = coordinator.abort(&name("meow")).await.expect("it can still be paused");
    coordinator.resume(&name("meow"), Some(paused.pause_id)).await.expect("and resumed");

    let healed = load(&coordinator, "meow", "/a/meow").await.expect("a load gives it weights");
    assert_eq!(healed, issued.next(), "above every version issued before");
    assert_eq!(status(&coordinator, "meow").await.weights_error, None);
    joined(spawn_sample(&coordinator, "meow", SHORT, "served")).await.expect("meow samples again");
}

#[tokio::test]
async fn a_flag_keeps_what_a_trainer_loaded_since_and_a_changed_flag_loads_the_next_version() {
    let store = memory();
    let (coordinator, _) = started_on(&store).await;
    let meow = name("meow");
    let flag = || AdapterSource::trusted("/flags/meow");
    assert_eq!(coordinator.reconcile_adapter(&meow, flag()).await.ok(), Some(Reconciled::Loaded(AdapterVersion(1))));
    assert_eq!(coordinator.reconcile_adapter(&meow, flag()).await.ok(), Some(Reconciled::Kept(AdapterVersion(1))));
    assert_eq!(load(&coordinator, "meow", "/train/step-2").await.ok(), Some(AdapterVersion(2)));

    let (coordinator, engine) = restarted(coordinator, &store).await;
    assert_eq!(
        coordinator.reconcile_adapter(&meow, flag()).await.ok(),
        Some(Reconciled::Kept(AdapterVersion(2))),
        "the same flag keeps the trainer's weights"
    );
    assert_eq!(engine.installed(&meow), Some(AdapterVersion(2)));
    let changed = AdapterSource::trusted("/flags/meow-new");
    assert_eq!(coordinator.reconcile_adapter(&meow, changed).await.ok(), Some(Reconciled::Loaded(AdapterVersion(3))));
    let woof = AdapterSource::trusted("/flags/woof");
    assert_eq!(
        coordinator.reconcile_adapter(&name("woof"), woof).await.ok(),
        Some(Reconciled::Loaded(AdapterVersion(1)))
    );

    let (coordinator, _) = restarted(coordinator, &store).await;
    let source = AdapterSource::trusted("/flags/meow-new");
    assert_eq!(coordinator.reconcile_adapter(&meow, source).await.ok(), Some(Reconciled::Kept(AdapterVersion(3))));
}

#[tokio::test]
async fn a_swaps_own_pause_is_not_recorded_and_a_swap_records_its_version() {
    let store = memory();
    let (coordinator, _) = started_on(&store).await;
    load(&coordinator, "meow", "/a/meow").await.expect("meow");
    let source = AdapterSource::trusted("/a/meow-2");
    let swap = coordinator
        .swap_adapter(&name("meow"), source, PauseMode::Keep, KvPolicy::Recompute, None)
        .await
        .expect("swapped");
    assert_eq!(swap.installed.version, AdapterVersion(2));
    let recorded = store.recorded().await.expect("reads");
    assert!(recorded.pauses.is_empty());
    assert_eq!(recorded.adapters[0].version, AdapterVersion(2));
    assert_eq!(recorded.adapters[0].source.path, PathBuf::from("/a/meow-2"));
}

/// A store whose pause records fail (a full disk, say); everything else goes to a memory store.
#[derive(Debug, Default)]
struct FailingPauses(MemoryStore);

#[async_trait::async_trait]
impl StateStore for FailingPauses {
    async fn recorded(&self) -> Result<RecordedState, StateError> {
        self.0.recorded().await
    }

    fn record(&self, changes: Vec<StateChange>) -> Recording {
        if changes.iter().any(|change| matches!(change, StateChange::Paused(_) | StateChange::GlobalPause(Some(_)))) {
            return Box::pin(std::future::ready(Err(StateError::Failed("no space left on device".into()))));
        }
        self.0.record(changes)
    }

    fn issue_version(&self, name: &AdapterName) -> Recording<AdapterVersion> {
        self.0.issue_version(name)
    }

    fn new_pause_id(&self) -> PauseId {
        self.0.new_pause_id()
    }
}

#[tokio::test]
async fn a_pause_the_store_cannot_record_is_withdrawn_and_the_error_says_why() {
    let store: Arc<dyn StateStore> = Arc::new(FailingPauses::default());
    let (coordinator, _) = started_on(&store).await;
    load(&coordinator, "meow", "/a/meow").await.expect("meow");
    let request = PauseRequest::parse(PauseMode::Keep, "trainer", 0.0).expect("valid");
    match coordinator.pause(&name("meow"), request, None).await {
        Err(CoreError::State(err)) => assert!(err.to_string().contains("no space left"), "{err}"),
        other => panic!("expected a state error, got {other:?}"),
    }
    assert!(!status(&coordinator, "meow").await.paused, "no pause is left holding without its record");
    assert!(coordinator.pause_all(PauseMode::Abort, KvPolicy::Recompute, None).await.is_err());
    assert!(!status(&coordinator, "meow").await.paused && !coordinator.is_paused_globally().await.expect("answers"));
    joined(spawn_sample(&coordinator, "meow", SHORT, "open")).await.expect("meow still samples");
}

/// A store that fails the test if it is called once `hot` is set.
#[derive(Debug, Default)]
struct UntouchableWhenHot {
    records: MemoryStore,
    hot: AtomicBool,
}

impl UntouchableWhenHot {
    fn touched(&self, what: &str) {
        assert!(!self.hot.load(Ordering::Acquire), "the sampling path called the state store ({what})");
    }
}

#[async_trait::async_trait]
impl StateStore for UntouchableWhenHot {
    async fn recorded(&self) -> Result<RecordedState, StateError> {
        self.touched("recorded");
        self.records.recorded().await
    }

    fn record(&self, changes: Vec<StateChange>) -> Recording {
        self.touched("record");
        self.records.record(changes)
    }

    fn issue_version(&self, name: &AdapterName) -> Recording<AdapterVersion> {
        self.touched("issue_version");
        self.records.issue_version(name)
    }

    fn new_pause_id(&self) -> PauseId {
        self.touched("new_pause_id");
        self.records.new_pause_id()
    }
}

#[tokio::test]
async fn admission_sampling_and_hand_back_never_touch_the_state_store() {
    let store = Arc::new(UntouchableWhenHot::default());
    let state: Arc<dyn StateStore> = store.clone();
    let (coordinator, _) = started_on(&state).await;
    load(&coordinator, "meow", "/a/meow").await.expect("meow");
    store.hot.store(true, Ordering::Release);
    for i in 0..50 {
        joined(spawn_sample(&coordinator, "meow", SHORT, &format!("r{i}"))).await.expect("samples");
        joined(spawn_sample(&coordinator, "", SHORT, &format!("b{i}"))).await.expect("the base model samples");
    }
    let running = spawn_sample(&coordinator, "meow", LONG, "aborted");
    eventually("it runs", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
    let report = coordinator.abort_requests(&[RequestId::parse_or_generate("aborted").expect("id")]).await;
    assert_eq!(report.aborted.len(), 1, "an abort by request id pauses nothing and records nothing");
    assert_eq!(joined(running).await.expect("handed back").sequences[0].finish_reason, FinishReason::Abort);
}
