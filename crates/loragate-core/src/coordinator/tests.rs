//! The coordinator's invariants, each tested so that it fails when the invariant breaks. Waits poll with a
//! deadline; nothing sleeps to synchronise.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::*;
use crate::adapter::AdapterMsg;
use crate::contract::{
    AdapterVersion, EngineError, FinishReason, RequestId, SampleOutput, Segment, TopLogprobs, parse_timeout_s,
};
use crate::testing::{ScriptedEngine, coordinator_with_adapters, eventually};

mod admission_races;
mod fetch;
mod interleavings;
mod max_loras;
mod pause_modes;
mod remote;
mod restart;
mod unload_races;
mod version_parking;
mod versions;

/// Tokens every scripted request emits before it waits to be aborted.
const HOLD_AFTER: u32 = 3;
/// A budget the scripted engine finishes at once (`Length`).
const SHORT: u32 = 2;
/// A budget that keeps a scripted request in flight until it is aborted.
const LONG: u32 = 1000;

fn name(raw: &str) -> AdapterName {
    AdapterName::parse(raw).expect("valid name")
}

async fn coordinator_with(engine: ScriptedEngine, adapters: &[&str]) -> Coordinator {
    coordinator_with_adapters(engine, CoordinatorConfig::default(), adapters).await
}

async fn coordinator(adapters: &[&str]) -> Coordinator {
    coordinator_with(ScriptedEngine::new(HOLD_AFTER), adapters).await
}

fn request(coordinator: &Coordinator, lora: &str, max_tokens: u32, id: &str) -> SampleRequest {
    let raw = RawSampleRequest {
        request_id: id.into(),
        lora_name: lora.into(),
        prompt_token_ids: vec![1, 2, 3],
        max_tokens: Some(max_tokens),
        ..Default::default()
    };
    coordinator.parse_sample(raw).expect("valid request")
}

/// Samples to the end in a task, as a front would.
fn spawn_sample(
    coordinator: &Coordinator,
    lora: &str,
    max_tokens: u32,
    id: &str,
) -> JoinHandle<Result<SampleOutput, CoreError>> {
    let request = request(coordinator, lora, max_tokens, id);
    let coordinator = coordinator.clone();
    tokio::spawn(async move {
        let hold_until = coordinator.gate_deadline(None);
        coordinator.sample(request, hold_until).await?.collect_output().await
    })
}

async fn status(coordinator: &Coordinator, lora: &str) -> AdapterStatus {
    coordinator.adapter(&AdapterKey::parse(lora).expect("key")).expect("loaded").status().await.expect("status")
}

async fn joined<T>(task: JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("task finished in time")
        .expect("task did not panic")
}

#[tokio::test]
async fn a_sample_on_an_open_gate_finishes_with_its_versions_segments() {
    let coordinator = coordinator(&["meow"]).await;
    let output = joined(spawn_sample(&coordinator, "meow", SHORT, "r1")).await.expect("sample");
    let sequence = &output.sequences[0];
    assert_eq!(output.request_id.as_str(), "r1");
    assert_eq!(sequence.finish_reason, FinishReason::Length);
    assert_eq!(sequence.token_ids, vec![0, 1]);
    assert_eq!(
        sequence.segments,
        vec![Segment { version: AdapterVersion(1), kv_version: AdapterVersion(1), start: 0, end: 2 }]
    );
    eventually("the request left the registry", || async { status(&coordinator, "meow").await.in_flight == 0 }).await;
}

#[tokio::test]
async fn alternatives_and_prompt_logprobs_are_collected_per_token_and_per_prompt_position() {
    let coordinator = coordinator(&["meow"]).await;
    let raw = RawSampleRequest {
        lora_name: "meow".into(),
        prompt_token_ids: vec![7, 8, 9],
        max_tokens: Some(SHORT),
        top_logprobs: 2,
        prompt_top_logprobs: Some(1),
        ..Default::default()
    };
    let request = coordinator.parse_sample(raw).expect("valid request");
    let hold_until = coordinator.gate_deadline(None);
    let output = coordinator.sample(request, hold_until).await.expect("admitted").collect_output().await.expect("ok");
    let sequence = &output.sequences[0];
    assert_eq!(sequence.top_logprobs.len(), sequence.token_ids.len(), "one entry per generated token");
    assert_eq!(sequence.top_logprobs[1].top, vec![(1, -0.01), (2, -1.01)]);
    assert_eq!(output.prompt_logprobs.len(), 3);
    assert!(output.prompt_logprobs[0].is_nan());
    assert_eq!(output.prompt_top_logprobs.len(), 3, "one entry per prompt token");
    assert_eq!(output.prompt_top_logprobs[2], TopLogprobs { rank: 2, top: vec![(10, -0.2 + 0.5)] });
}

#[tokio::test]
async fn abort_hands_back_every_in_flight_request_with_its_partial_tokens() {
    let coordinator = coordinator(&["meow"]).await;
    let tasks: Vec<_> = (0..20).map(|i| spawn_sample(&coordinator, "meow", LONG, &format!("m{i}"))).collect();
    eventually("all 20 requests are in flight", || async { status(&coordinator, "meow").await.in_flight == 20 }).await;
    assert!(tasks.iter().all(|task| !task.is_finished()), "requests must still be running before the abort");

    let report = coordinator.abort(&name("meow")).await.expect("abort");

    let reported: HashSet<String> = report.aborted.iter().map(|id| id.to_string()).collect();
    assert_eq!(reported, (0..20).map(|i| format!("m{i}")).collect::<HashSet<_>>());
    assert!(report.unacknowledged.is_empty());
    assert!(status(&coordinator, "meow").await.paused);
    for task in tasks {
        let output = joined(task).await.expect("handed back, not failed");
        let sequence = &output.sequences[0];
        assert_eq!(sequence.finish_reason, FinishReason::Abort);
        assert_eq!(sequence.token_ids, vec![0, 1, 2], "the partial tokens come back");
        assert_eq!(sequence.logprobs.len(), 3);
        assert_eq!(
            sequence.segments,
            vec![Segment { version: AdapterVersion(1), kv_version: AdapterVersion(1), start: 0, end: 3 }]
        );
    }
    eventually("the registry is empty", || async { status(&coordinator, "meow").await.in_flight == 0 }).await;
}

#[tokio::test]
async fn abort_is_idempotent_and_keeps_the_adapter_paused() {
    let coordinator = coordinator(&["meow"]).await;
    let first = coordinator.abort(&name("meow")).await.expect("abort");
    let second = coordinator.abort(&name("meow")).await.expect("abort again");
    assert!(first.aborted.is_empty() && second.aborted.is_empty());
    assert!(status(&coordinator, "meow").await.paused);
    assert!(coordinator.resume(&name("meow"), None).await.expect("resume").was_paused, "was paused");
    assert!(!coordinator.resume(&name("meow"), None).await.expect("resume again").was_paused, "already open");
}

#[tokio::test]
async fn pausing_one_adapter_never_holds_or_aborts_another() {
    let coordinator = coordinator(&["meow", "woof"]).await;
    let running_woof = spawn_sample(&coordinator, "woof", LONG, "w-running");
    let running_base = spawn_sample(&coordinator, "", LONG, "b-running");
    eventually("woof and the base model are running", || async {
        status(&coordinator, "woof").await.in_flight == 1 && status(&coordinator, "").await.in_flight == 1
    })
    .await;

    let report = coordinator.abort(&name("meow")).await.expect("abort meow");
    assert!(report.aborted.is_empty());
    let held_meow = spawn_sample(&coordinator, "meow", SHORT, "m-held");
    eventually("the fresh meow request is held", || async { status(&coordinator, "meow").await.held == 1 }).await;

    // While meow is paused with a request held, woof and the base model admit and finish at once.
    for i in 0..10 {
        let woof = joined(spawn_sample(&coordinator, "woof", SHORT, &format!("w{i}"))).await.expect("woof");
        assert_eq!(woof.sequences[0].finish_reason, FinishReason::Length);
        let base = joined(spawn_sample(&coordinator, "", SHORT, &format!("b{i}"))).await.expect("base");
        assert_eq!(base.sequences[0].finish_reason, FinishReason::Length);
    }
    let woof = status(&coordinator, "woof").await;
    assert!(!woof.paused && woof.held == 0 && woof.in_flight == 1, "woof untouched: {woof:?}");
    assert!(!running_woof.is_finished() && !running_base.is_finished(), "nothing of woof or base was aborted");
    assert!(!held_meow.is_finished());

    coordinator.resume(&name("meow"), None).await.expect("resume");
    assert_eq!(joined(held_meow).await.expect("meow").sequences[0].finish_reason, FinishReason::Length);
    for adapter in ["woof"] {
        coordinator.abort(&name(adapter)).await.expect("cleanup");
    }
    assert_eq!(joined(running_woof).await.expect("woof").sequences[0].finish_reason, FinishReason::Abort);
    running_base.abort();
}

#[tokio::test]
async fn a_fresh_request_is_held_while_paused_and_admitted_on_resume() {
    let coordinator = coordinator(&["meow"]).await;
    coordinator.abort(&name("meow")).await.expect("pause");
    let held = spawn_sample(&coordinator, "meow", SHORT, "fresh");
    eventually("the request is held", || async { status(&coordinator, "meow").await.held == 1 }).await;
    assert_eq!(status(&coordinator, "meow").await.in_flight, 0, "held requests are not admitted");
    assert!(!held.is_finished());

    coordinator.resume(&name("meow"), None).await.expect("resume");
    let output = joined(held).await.expect("admitted after resume");
    assert_eq!(output.sequences[0].finish_reason, FinishReason::Length);
    assert_eq!(status(&coordinator, "meow").await.held, 0);
}

#[tokio::test]
async fn a_hold_past_its_deadline_fails_naming_the_adapter() {
    let coordinator = coordinator(&["meow"]).await;
    coordinator.abort(&name("meow")).await.expect("pause");
    let request = request(&coordinator, "meow", SHORT, "late");
    let started = Instant::now();
    let err = coordinator
        .sample(request, GateDeadline::at(started + Duration::from_millis(50)))
        .await
        .err()
        .expect("hold expires");
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert!(matches!(err, CoreError::GateHoldExpired { .. }), "{err:?}");
    assert!(err.to_string().contains("adapter 'meow'"), "{err}");
    assert_eq!(status(&coordinator, "meow").await.held, 0);
    assert!(status(&coordinator, "meow").await.paused, "a failed hold does not reopen the adapter");
}

#[tokio::test]
async fn wait_unpaused_answers_at_once_when_open_and_on_timeout_when_paused() {
    let coordinator = coordinator(&["meow"]).await;
    let meow = name("meow");
    assert!(!coordinator.wait_unpaused(&meow, Duration::from_secs(3600)).await.expect("open"));

    coordinator.abort(&meow).await.expect("pause");
    let started = Instant::now();
    assert!(coordinator.wait_unpaused(&meow, Duration::from_millis(30)).await.expect("times out"));
    assert!(started.elapsed() >= Duration::from_millis(30));

    let waiter = {
        let coordinator = coordinator.clone();
        let meow = meow.clone();
        tokio::spawn(async move { coordinator.wait_unpaused(&meow, Duration::from_secs(3600)).await })
    };
    eventually("the waiter is counted", || async { status(&coordinator, "meow").await.waiting == 1 }).await;
    coordinator.resume(&meow, None).await.expect("resume");
    assert!(!joined(waiter).await.expect("released"), "released as unpaused");
    assert_eq!(status(&coordinator, "meow").await.waiting, 0);
}

#[test]
fn timeouts_must_be_finite_and_non_negative() {
    assert_eq!(parse_timeout_s(1.5).ok(), Some(Duration::from_millis(1500)));
    assert_eq!(parse_timeout_s(1e30).ok(), Some(crate::MAX_WAIT_TIMEOUT));
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let err = parse_timeout_s(bad).expect_err("rejected");
        assert!(err.to_string().starts_with("timeout_s"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_releases_every_held_submission_and_waiter() {
    let coordinator = coordinator(&["meow"]).await;
    let meow = name("meow");
    coordinator.abort(&meow).await.expect("pause");
    let held: Vec<_> = (0..200).map(|i| spawn_sample(&coordinator, "meow", SHORT, &format!("h{i}"))).collect();
    let waiters: Vec<_> = (0..200)
        .map(|_| {
            let (coordinator, meow) = (coordinator.clone(), meow.clone());
            tokio::spawn(async move { coordinator.wait_unpaused(&meow, Duration::from_secs(3600)).await })
        })
        .collect();
    eventually("200 held and 200 waiting", || async {
        let status = status(&coordinator, "meow").await;
        status.held == 200 && status.waiting == 200
    })
    .await;

    coordinator.resume(&meow, None).await.expect("resume");
    for task in held {
        assert_eq!(joined(task).await.expect("admitted").sequences[0].finish_reason, FinishReason::Length);
    }
    for task in waiters {
        assert!(!joined(task).await.expect("released"));
    }
    // A request leaves the registry when its driver hands it back, just after queueing its last event.
    eventually("nothing is held, waiting or in flight", || async {
        let status = status(&coordinator, "meow").await;
        (status.held, status.waiting, status.in_flight) == (0, 0, 0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_go_away_leave_nothing_behind() {
    let coordinator = coordinator(&["meow"]).await;
    let meow = name("meow");
    // In flight, then dropped: the admission guard leaves the registry.
    let running: Vec<_> = (0..10).map(|i| spawn_sample(&coordinator, "meow", LONG, &format!("r{i}"))).collect();
    eventually("10 in flight", || async { status(&coordinator, "meow").await.in_flight == 10 }).await;
    running.iter().for_each(JoinHandle::abort);
    eventually("the registry empties", || async { status(&coordinator, "meow").await.in_flight == 0 }).await;

    // Held and waiting, then dropped: the counters return to zero and the adapter stays paused.
    coordinator.abort(&meow).await.expect("pause");
    let held: Vec<_> = (0..10).map(|i| spawn_sample(&coordinator, "meow", SHORT, &format!("h{i}"))).collect();
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let (coordinator, meow) = (coordinator.clone(), meow.clone());
            tokio::spawn(async move { coordinator.wait_unpaused(&meow, Duration::from_secs(3600)).await })
        })
        .collect();
    eventually("held and waiting are counted", || async {
        let status = status(&coordinator, "meow").await;
        status.held == 10 && status.waiting == 10
    })
    .await;
    held.iter().for_each(JoinHandle::abort);
    waiters.iter().for_each(JoinHandle::abort);
    eventually("nothing is left", || async {
        let status = status(&coordinator, "meow").await;
        (status.held, status.waiting, status.in_flight) == (0, 0, 0)
    })
    .await;
    assert!(status(&coordinator, "meow").await.paused, "dropped callers never reopen the adapter");
}

#[tokio::test]
async fn an_abort_reports_requests_not_handed_back_in_time() {
    let engine = ScriptedEngine::new(HOLD_AFTER);
    let config = CoordinatorConfig { abort_ack_timeout: Duration::from_millis(50), ..Default::default() };
    let coordinator = Coordinator::start(Arc::new(engine), config).await.expect("start");
    coordinator.load_adapter(&name("meow"), AdapterSource::trusted("/a/meow")).await.expect("load");
    // An admission whose holder never hands it back (an engine that ignores cancellation).
    let handle = coordinator.lora(&name("meow")).expect("loaded");
    let stuck = handle.admit(RequestId::parse_or_generate("stuck").expect("id"), Instant::now()).await.expect("admit");

    let report = coordinator.abort(&name("meow")).await.expect("abort");
    assert_eq!(report.unacknowledged.iter().map(|id| id.as_str()).collect::<Vec<_>>(), vec!["stuck"]);
    assert!(report.aborted.is_empty());
    assert!(stuck.cancel_token().is_cancelled(), "the abort still cancelled it");
    drop(stuck);
    eventually("the registry empties", || async { status(&coordinator, "meow").await.in_flight == 0 }).await;
}

#[tokio::test]
async fn a_restarted_actor_keeps_the_gate_closed_and_the_version() {
    let coordinator = coordinator(&["meow"]).await;
    let meow = name("meow");
    coordinator.load_adapter(&meow, AdapterSource::trusted("/a/meow-2")).await.expect("second load");
    coordinator.abort(&meow).await.expect("pause");
    let handle = coordinator.lora(&meow).expect("loaded");

    for crash in ["failure", "kill"] {
        let before = handle.cell().current_actor().expect("running");
        match crash {
            "failure" => before.cast(AdapterMsg::FailForTest).expect("sent"),
            _ => before.kill(),
        }
        eventually("the supervisor restarted the actor", || async {
            handle.cell().current_actor().is_some_and(|now| now.get_id() != before.get_id())
        })
        .await;
        let status = status(&coordinator, "meow").await;
        assert!(status.paused, "{crash}: a restart must not reopen the gate");
        assert_eq!(status.version, AdapterVersion(2), "{crash}: a restart must keep the version");
    }

    let held = spawn_sample(&coordinator, "meow", SHORT, "after-restart");
    eventually("the request is held", || async { status(&coordinator, "meow").await.held == 1 }).await;
    coordinator.resume(&meow, None).await.expect("resume");
    let output = joined(held).await.expect("sample");
    assert_eq!(output.sequences[0].segments[0].version, AdapterVersion(2));
}

#[tokio::test]
async fn a_crashed_actor_aborts_the_requests_its_registry_held() {
    let coordinator = coordinator(&["meow"]).await;
    let running = spawn_sample(&coordinator, "meow", LONG, "orphan");
    eventually("in flight", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
    let handle = coordinator.lora(&name("meow")).expect("loaded");
    handle.cell().current_actor().expect("running").cast(AdapterMsg::FailForTest).expect("sent");
    let output = joined(running).await.expect("handed back");
    assert_eq!(output.sequences[0].finish_reason, FinishReason::Abort);
    assert_eq!(output.sequences[0].token_ids.len(), HOLD_AFTER as usize);
}

#[tokio::test]
async fn loads_bump_the_version_and_a_failed_load_keeps_the_old_weights() {
    let coordinator = coordinator(&[]).await;
    let meow = name("meow");
    assert_eq!(
        coordinator.load_adapter(&meow, AdapterSource::trusted("/a/one")).await.expect("load").version,
        AdapterVersion(1)
    );
    let err = coordinator.load_adapter(&meow, AdapterSource::trusted("/a/bad")).await.expect_err("bad files");
    assert!(matches!(err, CoreError::Engine(EngineError::AdapterIncompatible(_))), "{err:?}");
    assert_eq!(status(&coordinator, "meow").await.version, AdapterVersion(1));
    let output = joined(spawn_sample(&coordinator, "meow", SHORT, "after-failure")).await.expect("still served");
    assert_eq!(output.sequences[0].segments[0].version, AdapterVersion(1));
    assert_eq!(
        coordinator.load_adapter(&meow, AdapterSource::trusted("/a/two")).await.expect("load").version,
        AdapterVersion(2)
    );
}

#[tokio::test]
async fn a_failed_first_load_leaves_no_adapter_behind() {
    let coordinator = coordinator(&[]).await;
    let ghost = name("ghost");
    assert!(coordinator.load_adapter(&ghost, AdapterSource::trusted("/a/bad")).await.is_err());
    assert!(coordinator.list_adapters().await.is_empty());
    assert!(matches!(coordinator.abort(&ghost).await, Err(CoreError::UnknownAdapter(_))));
    assert!(matches!(coordinator.resume(&ghost, None).await, Err(CoreError::UnknownAdapter(_))));
    assert!(matches!(coordinator.wait_unpaused(&ghost, Duration::ZERO).await, Err(CoreError::UnknownAdapter(_))));
    let request = request(&coordinator, "ghost", SHORT, "x");
    assert!(matches!(
        coordinator.sample(request, GateDeadline::at(Instant::now())).await,
        Err(CoreError::UnknownAdapter(_))
    ));
    assert!(coordinator.list_adapters().await.is_empty(), "control calls never create adapters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loads_of_a_new_name_get_distinct_versions() {
    let permits = Arc::new(Semaphore::new(0));
    let coordinator = coordinator_with(ScriptedEngine::new(HOLD_AFTER).with_load_permits(permits.clone()), &[]).await;
    let loads: Vec<_> = (0..5)
        .map(|i| {
            let coordinator = coordinator.clone();
            tokio::spawn(async move {
                coordinator.load_adapter(&name("meow"), AdapterSource::trusted(format!("/a/{i}"))).await
            })
        })
        .collect();
    assert!(coordinator.list_adapters().await.is_empty(), "unpublished until the first load succeeds");
    permits.add_permits(5);
    let mut versions = Vec::new();
    for load in loads {
        versions.push(joined(load).await.expect("loaded").version.0);
    }
    versions.sort_unstable();
    assert_eq!(versions, vec![1, 2, 3, 4, 5]);
    assert_eq!(status(&coordinator, "meow").await.version, AdapterVersion(5));
}

#[tokio::test]
async fn unload_aborts_running_requests_and_fails_held_ones() {
    let coordinator = coordinator(&["meow"]).await;
    let meow = name("meow");
    let running = spawn_sample(&coordinator, "meow", LONG, "running");
    eventually("in flight", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
    coordinator.unload_adapter(&meow).await.expect("unload");
    let output = joined(running).await.expect("handed back");
    assert_eq!(output.sequences[0].finish_reason, FinishReason::Abort);
    assert!(matches!(coordinator.lora(&meow), Err(CoreError::UnknownAdapter(_))));

    // Reloading continues the name's version count; held submissions and waiters fail on unload.
    assert_eq!(
        coordinator.load_adapter(&meow, AdapterSource::trusted("/a/x")).await.expect("reload").version,
        AdapterVersion(2)
    );
    coordinator.abort(&meow).await.expect("pause");
    let held = spawn_sample(&coordinator, "meow", SHORT, "held");
    let waiter = {
        let (coordinator, meow) = (coordinator.clone(), meow.clone());
        tokio::spawn(async move { coordinator.wait_unpaused(&meow, Duration::from_secs(3600)).await })
    };
    eventually("held and waiting", || async {
        let status = status(&coordinator, "meow").await;
        status.held == 1 && status.waiting == 1
    })
    .await;
    coordinator.unload_adapter(&meow).await.expect("unload");
    assert!(matches!(joined(held).await, Err(CoreError::UnknownAdapter(_))));
    assert!(matches!(joined(waiter).await, Err(CoreError::UnknownAdapter(_))));
    assert!(matches!(coordinator.unload_adapter(&meow).await, Err(CoreError::UnknownAdapter(_))));
}

#[tokio::test]
async fn shutdown_aborts_stragglers_and_fails_held_requests() {
    let coordinator = coordinator(&["meow", "woof"]).await;
    let running = spawn_sample(&coordinator, "woof", LONG, "running");
    eventually("in flight", || async { status(&coordinator, "woof").await.in_flight == 1 }).await;
    coordinator.abort(&name("meow")).await.expect("pause");
    let held = spawn_sample(&coordinator, "meow", SHORT, "held");
    eventually("held", || async { status(&coordinator, "meow").await.held == 1 }).await;

    coordinator.shutdown(Duration::from_millis(20)).await;
    assert_eq!(joined(running).await.expect("handed back").sequences[0].finish_reason, FinishReason::Abort);
    assert!(matches!(joined(held).await, Err(CoreError::ShuttingDown)));
    let request = request(&coordinator, "woof", SHORT, "late");
    assert!(matches!(
        coordinator.sample(request, GateDeadline::at(Instant::now())).await,
        Err(CoreError::ShuttingDown)
    ));
}

/// What the randomised test checks while it runs: a request that reaches the engine un-cancelled while the test
/// knows its adapter is paused (between an abort's return and the next resume) was admitted through a closed gate.
#[derive(Default)]
struct PauseWatch {
    paused: Mutex<HashMap<AdapterKey, bool>>,
    violations: Mutex<Vec<String>>,
}

#[tokio::test]
async fn pauses_holds_aborts_and_tokens_are_counted_per_adapter() {
    let coordinator = coordinator(&["meow"]).await;
    let meow = name("meow");
    let running = spawn_sample(&coordinator, "meow", LONG, "running");
    eventually("in flight", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
    coordinator.abort(&meow).await.expect("abort");
    let held = spawn_sample(&coordinator, "meow", SHORT, "held");
    eventually("held", || async { status(&coordinator, "meow").await.held == 1 }).await;
    coordinator.resume(&meow, None).await.expect("resume");
    joined(held).await.expect("sample");
    joined(running).await.expect("aborted");

    coordinator.metrics().set_adapter_gauges(&coordinator.statuses().await);
    let mut registry = prometheus_client::registry::Registry::with_prefix("loragate");
    coordinator.metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    for line in [
        "loragate_pauses_total{adapter=\"meow\"} 1",
        "loragate_pause_duration_seconds_count{adapter=\"meow\"} 1",
        "loragate_aborted_requests_total{adapter=\"meow\"} 1",
        "loragate_gate_hold_seconds_count{adapter=\"meow\"} 1",
        // 3 tokens from the aborted request, 2 from the held one.
        "loragate_generated_tokens_total{adapter=\"meow\",version=\"1\"} 5",
        "loragate_paused{adapter=\"meow\"} 0",
        "loragate_paused{adapter=\"\"} 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

#[tokio::test]
async fn the_base_models_served_name_cannot_become_an_adapter() {
    let config = CoordinatorConfig { reserved_names: vec!["demo".into()], ..CoordinatorConfig::default() };
    let coordinator = coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), config, &[]).await;
    let err = coordinator.load_adapter(&name("demo"), AdapterSource::trusted("/a/demo")).await.expect_err("reserved");
    assert!(matches!(err, CoreError::InvalidArgument { field: crate::contract::Field::LoraName, .. }), "{err}");
    let err =
        coordinator.load_adapter_at(&Principal::Anyone, &name("demo"), "no/such/path").await.expect_err("reserved");
    assert!(err.to_string().starts_with("lora_name"), "the name is checked before the path: {err}");
    assert!(coordinator.list_adapters().await.is_empty(), "nothing was created");
    coordinator.load_adapter(&name("demo2"), AdapterSource::trusted("/a/demo2")).await.expect("other names load");
}
