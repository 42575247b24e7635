//! Versions as a contract: a minimum version held at the gate until it arrives, exact pins (`NAME@V`) on the current
//! and retained versions, refused once released, kept across a keep-mode swap, and versions released from the
//! engine only when nothing pins them; the staleness bound, exact at its boundary.

use super::*;
use crate::contract::{StalenessPolicy, VersionWanted};
use crate::state::{MemoryStore, StateStore};

async fn retaining(retain_versions: usize, adapters: &[&str]) -> (Coordinator, Arc<ScriptedEngine>) {
    let engine = Arc::new(ScriptedEngine::new(HOLD_AFTER));
    let config = CoordinatorConfig { retain_versions, ..CoordinatorConfig::default() };
    let coordinator = Coordinator::start(engine.clone(), config).await.expect("starts");
    for adapter in adapters {
        coordinator.load_adapter(&name(adapter), AdapterSource::trusted(format!("/a/{adapter}"))).await.expect("load");
    }
    (coordinator, engine)
}

async fn load(coordinator: &Coordinator, lora: &str, dir: &str) -> AdapterVersion {
    coordinator.load_adapter(&name(lora), AdapterSource::trusted(dir)).await.expect("loads").version
}

fn wanting(coordinator: &Coordinator, lora: &str, min_lora_version: u64, max_tokens: u32) -> SampleRequest {
    let raw = RawSampleRequest {
        lora_name: lora.into(),
        prompt_token_ids: vec![1, 2, 3],
        max_tokens: Some(max_tokens),
        min_lora_version,
        ..Default::default()
    };
    coordinator.parse_sample(raw).expect("valid request")
}

fn spawn_request(
    coordinator: &Coordinator,
    request: SampleRequest,
    deadline: GateDeadline,
) -> JoinHandle<Result<SampleOutput, CoreError>> {
    let coordinator = coordinator.clone();
    tokio::spawn(async move { coordinator.sample(request, deadline).await?.collect_output().await })
}

fn versions_of(output: &SampleOutput) -> Vec<AdapterVersion> {
    output.sequences.iter().flat_map(|sequence| sequence.segments.iter().map(|segment| segment.version)).collect()
}

#[tokio::test]
async fn a_minimum_version_is_held_until_it_arrives_then_served_by_the_current_version() {
    let (coordinator, _) = retaining(1, &["meow"]).await;
    let held = spawn_request(&coordinator, wanting(&coordinator, "meow", 3, SHORT), coordinator.gate_deadline(None));
    eventually("the request is held for its version", || async { status(&coordinator, "meow").await.held == 1 }).await;
    assert_eq!(load(&coordinator, "meow", "/a/meow-2").await, AdapterVersion(2));
    assert!(!held.is_finished(), "version 2 is not enough");
    assert_eq!(load(&coordinator, "meow", "/a/meow-3").await, AdapterVersion(3));
    let output = joined(held).await.expect("served once version 3 is current");
    assert_eq!(versions_of(&output), vec![AdapterVersion(3)]);
    assert_eq!(status(&coordinator, "meow").await.held, 0);

    let served_at_once = wanting(&coordinator, "meow", 2, SHORT);
    let output = joined(spawn_request(&coordinator, served_at_once, coordinator.gate_deadline(None))).await;
    assert_eq!(versions_of(&output.expect("served")), vec![AdapterVersion(3)], "an older minimum is met at once");
}

#[tokio::test(start_paused = true)]
async fn a_minimum_version_that_never_comes_fails_at_the_deadline_naming_both_versions() {
    let (coordinator, _) = retaining(1, &["meow"]).await;
    let deadline = coordinator.gate_deadline(Some(Instant::now() + Duration::from_secs(5)));
    let err = joined(spawn_request(&coordinator, wanting(&coordinator, "meow", 9, SHORT), deadline))
        .await
        .expect_err("version 9 never came");
    match &err {
        CoreError::VersionNotReached { current, requested, .. } => {
            assert_eq!((*current, *requested), (AdapterVersion(1), AdapterVersion(9)));
        }
        other => panic!("expected version_not_reached, got {other}"),
    }
    assert_eq!((err.kind(), err.class()), ("version_not_reached", crate::ErrorClass::Unavailable));
    assert_eq!(status(&coordinator, "meow").await.held, 0, "nothing stays held");
}

#[tokio::test]
async fn a_minimum_version_on_the_base_model_is_refused_naming_the_field() {
    let (coordinator, _) = retaining(1, &[]).await;
    let raw = RawSampleRequest { prompt_token_ids: vec![1], min_lora_version: 1, ..Default::default() };
    match coordinator.parse_sample(raw) {
        Err(CoreError::InvalidArgument { field: crate::contract::Field::MinLoraVersion, .. }) => {}
        other => panic!("expected min_lora_version to be refused, got {other:?}"),
    }
}

#[tokio::test]
async fn pins_serve_the_current_and_retained_versions_hold_a_future_one_and_refuse_a_released_one() {
    let (coordinator, engine) = retaining(2, &["meow"]).await;
    load(&coordinator, "meow", "/a/meow-2").await;
    load(&coordinator, "meow", "/a/meow-3").await;
    assert_eq!(engine.held(&name("meow")), vec![AdapterVersion(2), AdapterVersion(3)], "two versions retained");
    let listed: Vec<AdapterVersion> =
        status(&coordinator, "meow").await.versions.iter().map(|version| version.version).collect();
    assert_eq!(listed, vec![AdapterVersion(2), AdapterVersion(3)]);

    for (pin, served) in [("meow@3", 3), ("meow@2", 2)] {
        let output = joined(spawn_sample(&coordinator, pin, SHORT, pin)).await.expect("served");
        assert_eq!(versions_of(&output), vec![AdapterVersion(served)], "{pin}");
    }
    let future = spawn_sample(&coordinator, "meow@4", SHORT, "future");
    eventually("the pin on a future version is held", || async { status(&coordinator, "meow").await.held == 1 }).await;
    load(&coordinator, "meow", "/a/meow-4").await;
    assert_eq!(versions_of(&joined(future).await.expect("served")), vec![AdapterVersion(4)]);

    let err = joined(spawn_sample(&coordinator, "meow@2", SHORT, "retired")).await.expect_err("released");
    match &err {
        CoreError::VersionRetired { requested, retained, .. } => {
            assert_eq!(*requested, AdapterVersion(2));
            assert_eq!(retained, &vec![AdapterVersion(3), AdapterVersion(4)]);
        }
        other => panic!("expected version_retired, got {other}"),
    }
    assert_eq!(err.class(), crate::ErrorClass::Gone);
    eventually("version 2 left the engine", || async { engine.held(&name("meow")) == [3, 4].map(AdapterVersion) })
        .await;
}

#[tokio::test]
async fn a_pinned_version_stays_loaded_while_a_request_runs_on_it_and_goes_when_it_ends() {
    let (coordinator, engine) = retaining(1, &["meow"]).await;
    let pinned = spawn_sample(&coordinator, "meow@1", LONG, "pinned");
    eventually("the pinned request runs", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
    load(&coordinator, "meow", "/a/meow-2").await;
    load(&coordinator, "meow", "/a/meow-3").await;
    assert_eq!(engine.held(&name("meow")), vec![AdapterVersion(1), AdapterVersion(3)], "1 pinned, 2 released");
    let err = joined(spawn_sample(&coordinator, "meow@1", SHORT, "late")).await.expect_err("no longer servable");
    assert!(matches!(err, CoreError::VersionRetired { .. }), "{err}");

    coordinator.abort(&name("meow")).await.expect("abort");
    let output = joined(pinned).await.expect("handed back");
    assert_eq!(versions_of(&output), vec![AdapterVersion(1)]);
    eventually("version 1 left the engine once its pin went", || async {
        engine.held(&name("meow")) == [AdapterVersion(3)]
    })
    .await;
}

#[tokio::test]
async fn a_pinned_request_kept_across_a_swap_continues_on_its_version() {
    let (coordinator, engine) = retaining(1, &["meow"]).await;
    let pinned = spawn_sample(&coordinator, "meow@1", HOLD_AFTER + 2, "pinned");
    let unpinned = spawn_sample(&coordinator, "meow", HOLD_AFTER + 2, "unpinned");
    eventually("both run", || async { status(&coordinator, "meow").await.in_flight == 2 }).await;
    let swap = coordinator
        .swap_adapter(&name("meow"), AdapterSource::trusted("/a/meow-2"), PauseMode::Keep, KvPolicy::Recompute, None)
        .await
        .expect("swapped");
    assert_eq!((swap.installed.version, swap.kept), (AdapterVersion(2), 2));
    let pinned = joined(pinned).await.expect("finished");
    assert_eq!(pinned.sequences[0].finish_reason, FinishReason::Length);
    assert_eq!(versions_of(&pinned), vec![AdapterVersion(1)], "every token of the pinned request is version 1");
    let unpinned = joined(unpinned).await.expect("finished");
    assert_eq!(versions_of(&unpinned), vec![AdapterVersion(1), AdapterVersion(2)], "the unpinned one moved on");
    eventually("version 1 goes once its pinned request ended", || async {
        engine.held(&name("meow")) == [AdapterVersion(2)]
    })
    .await;
}

#[tokio::test]
async fn an_adapter_named_with_an_at_sign_is_served_by_its_name_not_taken_for_a_pin() {
    let (coordinator, _) = retaining(1, &["meow", "meow@1"]).await;
    let request = request(&coordinator, "meow@1", SHORT, "literal");
    assert_eq!((request.adapter().as_wire_str(), request.wanted()), ("meow@1", VersionWanted::Any));
    let request = request_for_pin(&coordinator);
    assert_eq!(request.wanted(), VersionWanted::Any, "no adapter `meow@7` and no pin syntax: left as named");
}

fn request_for_pin(coordinator: &Coordinator) -> SampleRequest {
    request(coordinator, "meow@x7", SHORT, "odd")
}

/// AReaL's rule at its boundary: max_staleness 1, batch_size 4 set at version 1 admits 8 sequences (any split of
/// `num_samples`), holds the next until version 2, which lets 4 more in; a request never fits in part.
#[tokio::test]
async fn the_staleness_bound_admits_exactly_its_capacity_and_releases_held_requests_as_versions_arrive() {
    let (coordinator, _) = retaining(1, &["meow"]).await;
    let policy = StalenessPolicy { max_staleness: 1, batch_size: 4 };
    let set = coordinator.set_staleness(&name("meow"), Some(policy)).await.expect("set").expect("in force");
    assert_eq!((set.started, set.capacity), (0, 8));
    let mut requests = Vec::new();
    for (i, samples) in [3u32, 5].into_iter().enumerate() {
        let raw = RawSampleRequest {
            lora_name: "meow".into(),
            prompt_token_ids: vec![1],
            max_tokens: Some(SHORT),
            num_samples: samples,
            request_id: format!("fit{i}"),
            ..Default::default()
        };
        let request = coordinator.parse_sample(raw).expect("valid");
        requests.push(joined(spawn_request(&coordinator, request, coordinator.gate_deadline(None))).await);
    }
    assert!(requests.iter().all(Result::is_ok), "eight sequences fit");
    let held = spawn_sample(&coordinator, "meow", SHORT, "ninth");
    eventually("the ninth sequence is held at the bound", || async {
        let status = status(&coordinator, "meow").await;
        status.held == 1 && status.staleness.is_some_and(|bound| bound.held == 1 && bound.started == 8)
    })
    .await;
    load(&coordinator, "meow", "/a/meow-2").await;
    joined(held).await.expect("admitted once version 2 widened the bound");
    let bound = status(&coordinator, "meow").await.staleness.expect("in force");
    assert_eq!((bound.started, bound.capacity, bound.held), (9, 12, 0));

    coordinator.set_staleness(&name("meow"), None).await.expect("cleared");
    assert_eq!(status(&coordinator, "meow").await.staleness, None);
}

#[tokio::test]
async fn aborted_sequences_give_their_places_back_and_kept_ones_do_not_count_again() {
    let (coordinator, _) = retaining(1, &["meow"]).await;
    let policy = StalenessPolicy { max_staleness: 0, batch_size: 2 };
    coordinator.set_staleness(&name("meow"), Some(policy)).await.expect("set");
    let first = spawn_sample(&coordinator, "meow", LONG, "a");
    let second = spawn_sample(&coordinator, "meow", LONG, "b");
    eventually("both run", || async { status(&coordinator, "meow").await.in_flight == 2 }).await;
    let swap = coordinator
        .swap_adapter(&name("meow"), AdapterSource::trusted("/a/meow-2"), PauseMode::Keep, KvPolicy::Recompute, None)
        .await
        .expect("kept across the swap");
    assert_eq!(swap.kept, 2);
    eventually("the kept requests continue without counting again", || async {
        let status = status(&coordinator, "meow").await;
        status.in_flight == 2 && status.staleness.is_some_and(|bound| bound.started == 2 && bound.capacity == 4)
    })
    .await;
    coordinator.abort(&name("meow")).await.expect("abort");
    for task in [first, second] {
        assert_eq!(joined(task).await.expect("handed back").sequences[0].finish_reason, FinishReason::Abort);
    }
    let bound = status(&coordinator, "meow").await.staleness.expect("in force");
    assert_eq!(bound.started, 0, "aborted sequences gave their places back for their continuations");
}

#[tokio::test]
async fn retained_versions_and_the_staleness_bound_survive_a_restart() {
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
    let start = |store: Arc<dyn StateStore>| async move {
        let engine = Arc::new(ScriptedEngine::new(HOLD_AFTER));
        let config = CoordinatorConfig { retain_versions: 2, state: store, ..CoordinatorConfig::default() };
        (Coordinator::start(engine.clone(), config).await.expect("starts"), engine)
    };
    let (coordinator, _) = start(store.clone()).await;
    for step in 1..=3 {
        load(&coordinator, "meow", &format!("/a/meow-{step}")).await;
    }
    let policy = StalenessPolicy { max_staleness: 2, batch_size: 8 };
    coordinator.set_staleness(&name("meow"), Some(policy)).await.expect("set");
    coordinator.shutdown(Duration::ZERO).await;
    drop(coordinator);

    let (coordinator, engine) = start(store).await;
    assert_eq!(engine.held(&name("meow")), vec![AdapterVersion(2), AdapterVersion(3)]);
    let output = joined(spawn_sample(&coordinator, "meow@2", SHORT, "pinned")).await.expect("retained after restart");
    assert_eq!(versions_of(&output), vec![AdapterVersion(2)]);
    let bound = status(&coordinator, "meow").await.staleness.expect("the bound came back");
    assert_eq!((bound.policy, bound.capacity), (policy, 24), "re-armed at the restored version");
}

#[tokio::test]
async fn a_restart_retaining_fewer_versions_releases_the_oldest_and_records_it() {
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
    let start = |store: Arc<dyn StateStore>, retain_versions| async move {
        let engine = Arc::new(ScriptedEngine::new(HOLD_AFTER));
        let config = CoordinatorConfig { retain_versions, state: store, ..CoordinatorConfig::default() };
        (Coordinator::start(engine.clone(), config).await.expect("starts"), engine)
    };
    let (coordinator, _) = start(store.clone(), 3).await;
    for step in 1..=3 {
        load(&coordinator, "meow", &format!("/a/meow-{step}")).await;
    }
    coordinator.shutdown(Duration::ZERO).await;
    drop(coordinator);

    let (coordinator, engine) = start(store.clone(), 2).await;
    assert_eq!(engine.held(&name("meow")), vec![AdapterVersion(2), AdapterVersion(3)], "version 1 is not loaded");
    let refused = joined(spawn_sample(&coordinator, "meow@1", SHORT, "pinned")).await.expect_err("released");
    assert!(matches!(refused, CoreError::VersionRetired { .. }), "{refused}");
    let recorded = store.recorded().await.expect("read");
    let meow = recorded.adapters.iter().find(|record| record.name == name("meow")).expect("recorded");
    let retained: Vec<AdapterVersion> = meow.retained.iter().map(|older| older.version).collect();
    assert_eq!((meow.version, retained), (AdapterVersion(3), vec![AdapterVersion(2)]), "the record says so");
}

#[tokio::test]
async fn a_finished_request_answers_its_segments_to_its_sender_only() {
    let (coordinator, _) = retaining(1, &["meow"]).await;
    let tenants = crate::TenantKeys::parse(r#"{"k-a": {"adapters": ["meow"]}, "k-b": {"adapters": ["meow"]}}"#);
    let keyring = crate::Keyring::new(None, None, tenants.expect("valid tenants")).expect("keys");
    let (tenant, another) =
        (keyring.authenticate(Some("k-a")).expect("a"), keyring.authenticate(Some("k-b")).expect("b"));
    let raw = RawSampleRequest {
        request_id: "provenance-1".into(),
        lora_name: "meow".into(),
        prompt_token_ids: vec![1, 2, 3],
        max_tokens: Some(SHORT),
        num_samples: 2,
        ..Default::default()
    };
    let id = RequestId::parse_or_generate("provenance-1").expect("valid id");
    assert!(coordinator.finished_request(&id, &crate::Principal::Admin).is_none(), "unknown before it ran");
    let request = coordinator.parse_sample(raw).expect("valid").owned_by(tenant.clone());
    let output = joined(spawn_request(&coordinator, request, coordinator.gate_deadline(None))).await.expect("served");
    let finished = coordinator.finished_request(&id, &tenant).expect("its sender reads it");
    assert_eq!(finished.adapter, AdapterKey::Lora(name("meow")));
    assert_eq!(finished.sequences.len(), 2);
    for (recorded, sequence) in finished.sequences.iter().zip(&output.sequences) {
        assert_eq!(recorded.segments, sequence.segments);
        assert_eq!(recorded.finish_reason, sequence.finish_reason);
        assert_eq!(recorded.token_count as usize, sequence.token_ids.len());
    }
    assert!(coordinator.finished_request(&id, &another).is_none(), "another tenant cannot read it");
    assert!(coordinator.finished_request(&id, &crate::Principal::Sampler).is_none());
    assert!(coordinator.finished_request(&id, &crate::Principal::Admin).is_some());
}
