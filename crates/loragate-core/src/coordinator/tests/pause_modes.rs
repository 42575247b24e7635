//! Pause modes (abort, wait, keep), owners and leases, the atomic swap, the global pause, and aborts by request id.
//! The scripted engine emits `HOLD_AFTER` tokens, then waits to be cancelled unless its budget is spent: a request
//! with budget `HOLD_AFTER + n` stopped by a keep-mode pause continues as a request for `n` more tokens.

use std::sync::atomic::AtomicUsize;

use futures::StreamExt;

use super::*;
use crate::contract::{KvPolicy, PauseId, PauseMode, PauseOwner, PauseRequest};
use crate::sample_stream::SampleEvent;
use crate::testing::GenerateHook;

fn keep() -> PauseRequest {
    PauseRequest::new(PauseMode::Keep)
}

fn by(owner: &str, mode: PauseMode, lease_s: f64) -> PauseRequest {
    PauseRequest::parse(mode, owner, lease_s).expect("valid pause")
}

/// A scripted engine that records the prompt of every request it starts.
fn recording_engine() -> (ScriptedEngine, Arc<Mutex<Vec<Vec<u32>>>>) {
    let prompts: Arc<Mutex<Vec<Vec<u32>>>> = Arc::default();
    let seen = prompts.clone();
    let hook: GenerateHook = Box::new(move |request, _| seen.lock().push(request.prompt().to_vec()));
    (ScriptedEngine::new(HOLD_AFTER).with_generate_hook(hook), prompts)
}

async fn load(coordinator: &Coordinator, adapter: &str) -> AdapterVersion {
    coordinator
        .load_adapter(&name(adapter), AdapterSource::trusted(format!("/a/{adapter}")))
        .await
        .expect("load")
        .version
}

#[tokio::test]
async fn keep_stops_requests_and_continues_them_on_the_weights_current_at_resume() {
    let (engine, prompts) = recording_engine();
    let coordinator = coordinator_with(engine, &["meow", "woof"]).await;
    let task = spawn_sample(&coordinator, "meow", HOLD_AFTER + 2, "k1");
    let other = spawn_sample(&coordinator, "woof", LONG, "w1");
    eventually("both run", || async {
        status(&coordinator, "meow").await.in_flight == 1 && status(&coordinator, "woof").await.in_flight == 1
    })
    .await;

    let report = coordinator.pause(&name("meow"), keep(), None).await.expect("keep pause");
    assert_eq!(report.kept.iter().map(ToString::to_string).collect::<Vec<_>>(), vec!["k1"]);
    assert!(report.aborted.is_empty() && report.unacknowledged.is_empty());
    let paused = status(&coordinator, "meow").await;
    assert_eq!((paused.kept, paused.in_flight, paused.paused), (1, 0, true), "kept, not in flight");
    assert!(!task.is_finished(), "the caller sees only a delay");
    assert_eq!(status(&coordinator, "woof").await.in_flight, 1, "the other adapter never notices");

    assert_eq!(load(&coordinator, "meow").await, AdapterVersion(2));
    coordinator.resume(&name("meow"), Some(report.pause_id)).await.expect("resume");
    let output = joined(task).await.expect("one response");
    let sequence = &output.sequences[0];
    assert_eq!(sequence.finish_reason, FinishReason::Length, "the full budget");
    assert_eq!(sequence.token_ids, vec![0, 1, 2, 0, 1]);
    assert_eq!(sequence.logprobs.len(), 5, "every token has its own logprob");
    assert_eq!(
        sequence.segments,
        vec![
            Segment { version: AdapterVersion(1), kv_version: AdapterVersion(1), start: 0, end: 3 },
            Segment { version: AdapterVersion(2), kv_version: AdapterVersion(2), start: 3, end: 5 },
        ]
    );
    assert!(prompts.lock().contains(&vec![1, 2, 3, 0, 1, 2]), "continued as prompt + its tokens: {prompts:?}");
    eventually("nothing is kept or in flight", || async {
        let meow = status(&coordinator, "meow").await;
        (meow.kept, meow.in_flight) == (0, 0)
    })
    .await;
    assert_eq!(coordinator.metrics().generated_tokens(&AdapterKey::parse("meow").expect("key"), AdapterVersion(2)), 2);
    other.abort();
}

#[tokio::test]
async fn keep_continues_each_sequence_of_a_multi_sample_request_by_itself() {
    let (engine, prompts) = recording_engine();
    let coordinator = coordinator_with(engine, &["meow"]).await;
    let mut raw = RawSampleRequest {
        request_id: "multi".into(),
        lora_name: "meow".into(),
        prompt_token_ids: vec![9],
        max_tokens: Some(HOLD_AFTER + 1),
        num_samples: 3,
        include_prompt_logprobs: true,
        ..Default::default()
    };
    raw.temperature = 0.0;
    let request = coordinator.parse_sample(raw).expect("valid");
    let task = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            let deadline = coordinator.gate_deadline(None);
            coordinator.sample(request, deadline).await?.collect_output().await
        })
    };
    eventually("running", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
    let report = coordinator.pause(&name("meow"), keep(), None).await.expect("keep");
    assert_eq!(report.kept.len(), 1, "one request, kept whole");
    coordinator.resume(&name("meow"), None).await.expect("resume");
    let output = joined(task).await.expect("done");
    assert_eq!(output.sequences.len(), 3);
    for sequence in &output.sequences {
        assert_eq!((sequence.finish_reason, sequence.token_ids.len()), (FinishReason::Length, 4));
    }
    let continued = prompts.lock().iter().filter(|prompt| prompt.as_slice() == [9, 0, 1, 2]).count();
    assert_eq!(continued, 3, "one continuation per sequence: {prompts:?}");
}

#[tokio::test]
async fn a_kept_request_ends_with_its_tokens_when_unloaded_past_its_deadline_or_shut_down() {
    let coordinator = coordinator(&["meow", "woof"]).await;
    let unloaded = spawn_sample(&coordinator, "meow", LONG, "u1");
    let expires = {
        let request = request(&coordinator, "woof", LONG, "d1");
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            let deadline = GateDeadline::at(Instant::now() + Duration::from_millis(300));
            coordinator.sample(request, deadline).await?.collect_output().await
        })
    };
    eventually("both run", || async {
        status(&coordinator, "meow").await.in_flight == 1 && status(&coordinator, "woof").await.in_flight == 1
    })
    .await;
    coordinator.pause(&name("meow"), keep(), None).await.expect("keep meow");
    coordinator.pause(&name("woof"), keep(), None).await.expect("keep woof");

    coordinator.unload_adapter(&name("meow")).await.expect("unload");
    let output = joined(unloaded).await.expect("handed back");
    assert_eq!((output.sequences[0].finish_reason, output.sequences[0].token_ids.len()), (FinishReason::Abort, 3));

    let output = joined(expires).await.expect("handed back at its deadline");
    assert_eq!((output.sequences[0].finish_reason, output.sequences[0].token_ids.len()), (FinishReason::Abort, 3));
    assert_eq!(status(&coordinator, "woof").await.kept, 0);

    let at_shutdown = spawn_sample(&coordinator, "", LONG, "s1");
    eventually("runs", || async { status(&coordinator, "").await.in_flight == 1 }).await;
    coordinator.pause_all(PauseMode::Keep, KvPolicy::Recompute, None).await.expect("keep everything");
    coordinator.shutdown(Duration::from_millis(10)).await;
    let output = joined(at_shutdown).await.expect("handed back at shutdown");
    assert_eq!(output.sequences[0].finish_reason, FinishReason::Abort);
}

#[tokio::test]
async fn a_kept_request_whose_caller_leaves_leaves_nothing_behind() {
    let coordinator = coordinator(&["meow"]).await;
    let task = spawn_sample(&coordinator, "meow", LONG, "gone");
    eventually("running", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
    coordinator.pause(&name("meow"), keep(), None).await.expect("keep");
    assert_eq!(status(&coordinator, "meow").await.kept, 1);
    task.abort();
    eventually("uncounted", || async { status(&coordinator, "meow").await.kept == 0 }).await;
    coordinator.resume(&name("meow"), None).await.expect("resume");
    assert_eq!(status(&coordinator, "meow").await.in_flight, 0, "nothing was admitted for the departed caller");
}

#[tokio::test]
async fn wait_lets_requests_finish_holds_new_ones_and_is_withdrawn_past_its_deadline() {
    let coordinator = coordinator(&["meow"]).await;
    let running = spawn_sample(&coordinator, "meow", LONG, "r1");
    eventually("running", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;

    let soon = Some(Instant::now() + Duration::from_millis(50));
    let err = coordinator.pause(&name("meow"), PauseRequest::new(PauseMode::Wait), soon).await.expect_err("drain");
    assert!(matches!(err, CoreError::DrainTimedOut { still_running: 1, .. }), "{err}");
    let after = status(&coordinator, "meow").await;
    assert!(!after.paused && after.pauses.is_empty(), "the failed wait left no pause: {after:?}");
    assert_eq!(after.in_flight, 1, "and touched no request");

    let pausing = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move { coordinator.pause(&name("meow"), PauseRequest::new(PauseMode::Wait), None).await })
    };
    eventually("the gate is closed", || async { status(&coordinator, "meow").await.paused }).await;
    let held = spawn_sample(&coordinator, "meow", SHORT, "h1");
    eventually("a new request is held", || async { status(&coordinator, "meow").await.held == 1 }).await;
    assert!(!pausing.is_finished(), "a request is still running");

    // The running request ends by itself (an abort by id stands in for its last token).
    coordinator.abort_requests(&[RequestId::parse_or_generate("r1").expect("id")]).await;
    let report = joined(pausing).await.expect("drained");
    assert_eq!(report.mode, PauseMode::Wait);
    assert!(status(&coordinator, "meow").await.paused, "the pause holds after the drain");
    assert!(!held.is_finished());
    coordinator.resume(&name("meow"), None).await.expect("resume");
    assert_eq!(joined(held).await.expect("admitted").sequences[0].finish_reason, FinishReason::Length);
    joined(running).await.expect("aborted by id");
}

#[tokio::test]
async fn several_owners_hold_one_adapter_until_the_last_releases_and_renewals_keep_one_pause() {
    let coordinator = coordinator(&["meow"]).await;
    let trainer = coordinator.pause(&name("meow"), by("trainer", PauseMode::Abort, 0.0), None).await.expect("a");
    let again = coordinator.pause(&name("meow"), by("trainer", PauseMode::Abort, 0.0), None).await.expect("again");
    assert_eq!(trainer.pause_id, again.pause_id, "the same owner renews its pause");
    let evaluator = coordinator.pause(&name("meow"), by("eval", PauseMode::Abort, 0.0), None).await.expect("b");
    assert_ne!(evaluator.pause_id, trainer.pause_id);
    let listed = status(&coordinator, "meow").await.pauses;
    assert_eq!(listed.iter().map(|pause| pause.owner.to_string()).collect::<Vec<_>>(), vec!["eval", "trainer"]);

    let held = spawn_sample(&coordinator, "meow", SHORT, "h");
    let first = coordinator.resume(&name("meow"), Some(trainer.pause_id.clone())).await.expect("release one");
    assert!(first.was_paused && first.still_paused, "{first:?}");
    eventually("still held", || async { status(&coordinator, "meow").await.held == 1 }).await;
    let unknown = PauseId::parse("pause-999999").expect("parses").expect("non-empty");
    let nothing = coordinator.resume(&name("meow"), Some(unknown)).await.expect("idempotent");
    assert!(nothing.still_paused);
    let last = coordinator.resume(&name("meow"), Some(evaluator.pause_id)).await.expect("release last");
    assert!(last.was_paused && !last.still_paused);
    joined(held).await.expect("released");
}

#[tokio::test]
async fn a_lease_that_runs_out_reopens_the_adapter_and_releases_what_it_held() {
    let coordinator = coordinator(&["meow"]).await;
    let pause = coordinator.pause(&name("meow"), by("crashed-trainer", PauseMode::Abort, 0.2), None).await;
    let pause = pause.expect("leased pause");
    let lease_left = status(&coordinator, "meow").await.pauses[0].lease_left.expect("a lease");
    assert!(lease_left <= Duration::from_millis(200));
    let held = spawn_sample(&coordinator, "meow", SHORT, "held");
    eventually("held", || async { status(&coordinator, "meow").await.held == 1 }).await;
    let output = joined(held).await.expect("released when the lease ran out");
    assert_eq!(output.sequences[0].finish_reason, FinishReason::Length);
    assert!(!status(&coordinator, "meow").await.paused);
    let resumed = coordinator.resume(&name("meow"), Some(pause.pause_id)).await.expect("late resume");
    assert!(!resumed.was_paused, "the expired pause releases nothing");

    // A renewal by the same owner keeps the adapter paused past the first lease.
    coordinator.pause(&name("meow"), by("t", PauseMode::Abort, 0.3), None).await.expect("lease");
    tokio::time::sleep(Duration::from_millis(150)).await;
    coordinator.pause(&name("meow"), by("t", PauseMode::Abort, 5.0), None).await.expect("renew");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(status(&coordinator, "meow").await.paused, "renewed past the first lease");
}

#[tokio::test]
async fn a_swap_keeps_requests_across_the_load_and_a_failed_swap_reopens_on_the_old_weights() {
    let coordinator = coordinator(&["meow"]).await;
    let task = spawn_sample(&coordinator, "meow", HOLD_AFTER + 2, "s1");
    eventually("running", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
    let swap = coordinator
        .swap_adapter(&name("meow"), AdapterSource::trusted("/a/step-2"), PauseMode::Keep, KvPolicy::Reuse, None)
        .await
        .expect("swap");
    assert_eq!((swap.installed.version, swap.kept, swap.aborted), (AdapterVersion(2), 1, 0));
    assert_eq!(swap.kv_policy, KvPolicy::Recompute, "an engine that cannot park applies RECOMPUTE");
    let output = joined(task).await.expect("finished");
    let versions: Vec<u64> = output.sequences[0].segments.iter().map(|segment| segment.version.0).collect();
    assert_eq!((versions, output.sequences[0].token_ids.len()), (vec![1, 2], 5));
    assert!(!status(&coordinator, "meow").await.paused);

    let task = spawn_sample(&coordinator, "meow", HOLD_AFTER + 2, "s2");
    eventually("running", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
    let err = coordinator
        .swap_adapter(&name("meow"), AdapterSource::trusted("/a/bad"), PauseMode::Keep, KvPolicy::Recompute, None)
        .await
        .expect_err("bad weights");
    assert!(matches!(&err, CoreError::SwapFailed { serving: AdapterVersion(2), .. }), "{err}");
    assert!(err.to_string().contains("keeps serving v2"), "{err}");
    let output = joined(task).await.expect("continued on the old weights");
    let versions: Vec<u64> = output.sequences[0].segments.iter().map(|segment| segment.version.0).collect();
    assert_eq!(versions, vec![2], "both runs on v2: {:?}", output.sequences[0].segments);
    assert!(!status(&coordinator, "meow").await.paused, "reopened");

    let fresh = coordinator
        .swap_adapter(&name("fresh"), AdapterSource::trusted("/a/fresh"), PauseMode::Keep, KvPolicy::Recompute, None)
        .await
        .expect("a new name is simply loaded");
    assert_eq!(fresh.installed.version, AdapterVersion(1));
}

#[tokio::test]
async fn the_global_pause_covers_every_adapter_and_only_its_resume_releases_it() {
    let coordinator = coordinator(&["meow", "woof"]).await;
    let base = spawn_sample(&coordinator, "", HOLD_AFTER + 1, "b1");
    eventually("running", || async { status(&coordinator, "").await.in_flight == 1 }).await;
    coordinator.pause(&name("woof"), by("trainer", PauseMode::Abort, 0.0), None).await.expect("trainer pause");

    let report = coordinator.pause_all(PauseMode::Keep, KvPolicy::Recompute, None).await.expect("global keep");
    assert_eq!(report.kept.len(), 1, "the base model's request is kept");
    assert!(coordinator.is_paused_globally().await.expect("asked"));
    for adapter in ["", "meow", "woof"] {
        assert!(status(&coordinator, adapter).await.paused, "{adapter:?}");
    }
    load(&coordinator, "late").await;
    let late = status(&coordinator, "late").await;
    assert!(late.paused && late.pauses[0].owner == PauseOwner::Global, "a new adapter starts paused: {late:?}");

    assert!(coordinator.resume_all().await.expect("resume"));
    assert!(!coordinator.is_paused_globally().await.expect("asked"));
    for adapter in ["", "meow", "late"] {
        assert!(!status(&coordinator, adapter).await.paused, "{adapter:?}");
    }
    assert!(status(&coordinator, "woof").await.paused, "the trainer's own pause stays");
    let output = joined(base).await.expect("the base model's request continued");
    assert_eq!((output.sequences[0].finish_reason, output.sequences[0].token_ids.len()), (FinishReason::Length, 4));
}

#[tokio::test]
async fn a_request_that_asks_is_continued_through_an_abort_pause() {
    let coordinator = coordinator(&["meow"]).await;
    let continued = request(&coordinator, "meow", HOLD_AFTER + 2, "tinker").continue_through_abort_pauses();
    let task = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            let deadline = coordinator.gate_deadline(None);
            coordinator.sample(continued, deadline).await?.collect_output().await
        })
    };
    let plain = spawn_sample(&coordinator, "meow", LONG, "plain");
    eventually("running", || async { status(&coordinator, "meow").await.in_flight == 2 }).await;
    let report = coordinator.abort(&name("meow")).await.expect("abort");
    assert_eq!(report.aborted.iter().map(ToString::to_string).collect::<Vec<_>>(), vec!["plain"]);
    assert_eq!(report.kept.iter().map(ToString::to_string).collect::<Vec<_>>(), vec!["tinker"]);
    assert_eq!(joined(plain).await.expect("aborted").sequences[0].finish_reason, FinishReason::Abort);
    coordinator.resume(&name("meow"), None).await.expect("resume");
    let output = joined(task).await.expect("finished");
    assert_eq!((output.sequences[0].finish_reason, output.sequences[0].token_ids.len()), (FinishReason::Length, 5));

    let by_id = request(&coordinator, "meow", LONG, "by-id").continue_through_abort_pauses();
    let task = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            let deadline = coordinator.gate_deadline(None);
            coordinator.sample(by_id, deadline).await?.collect_output().await
        })
    };
    eventually("running", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
    let report = coordinator.abort_requests(&[RequestId::parse_or_generate("by-id").expect("id")]).await;
    assert_eq!(report.aborted.len(), 1, "an abort by id is never continued");
    assert_eq!(joined(task).await.expect("ended").sequences[0].finish_reason, FinishReason::Abort);
    assert!(!status(&coordinator, "meow").await.paused, "an abort by id pauses nothing");
}

#[tokio::test]
async fn an_abort_pause_ends_kept_requests_with_their_tokens_unless_they_continue_through_aborts() {
    let coordinator = coordinator(&["meow"]).await;
    let continued = request(&coordinator, "meow", HOLD_AFTER + 2, "tinker").continue_through_abort_pauses();
    let tinker = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            let deadline = coordinator.gate_deadline(None);
            coordinator.sample(continued, deadline).await?.collect_output().await
        })
    };
    let plain = spawn_sample(&coordinator, "meow", HOLD_AFTER + 2, "plain");
    eventually("running", || async { status(&coordinator, "meow").await.in_flight == 2 }).await;
    let kept = coordinator.pause(&name("meow"), keep(), None).await.expect("keep pause");
    assert_eq!(kept.kept.len(), 2);
    coordinator.abort(&name("meow")).await.expect("abort pause");
    let output = joined(plain).await.expect("handed back");
    let sequence = &output.sequences[0];
    assert_eq!(sequence.finish_reason, FinishReason::Abort, "an abort pause reaches a kept request");
    assert_eq!(sequence.token_ids, vec![0, 1, 2], "with every token it had");
    assert!(!tinker.is_finished(), "a request continuing through aborts stays kept");
    assert_eq!(status(&coordinator, "meow").await.kept, 1);
    coordinator.resume(&name("meow"), None).await.expect("resume");
    let output = joined(tinker).await.expect("finished");
    assert_eq!((output.sequences[0].finish_reason, output.sequences[0].token_ids.len()), (FinishReason::Length, 5));
    eventually("nothing is left", || async {
        let status = status(&coordinator, "meow").await;
        (status.in_flight, status.kept, status.held) == (0, 0, 0)
    })
    .await;
}

#[tokio::test]
async fn abort_all_requests_aborts_every_adapter_without_pausing() {
    let coordinator = coordinator(&["meow", "woof"]).await;
    let tasks: Vec<_> =
        ["", "meow", "woof"].iter().map(|adapter| spawn_sample(&coordinator, adapter, LONG, "x")).collect();
    eventually("running", || async {
        let mut total = 0;
        for adapter in ["", "meow", "woof"] {
            total += status(&coordinator, adapter).await.in_flight;
        }
        total == 3
    })
    .await;
    let report = coordinator.abort_all_requests().await;
    assert_eq!(report.aborted.len(), 3);
    for task in tasks {
        assert_eq!(joined(task).await.expect("ended").sequences[0].finish_reason, FinishReason::Abort);
    }
    for adapter in ["", "meow", "woof"] {
        assert!(!status(&coordinator, adapter).await.paused);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomised_keep_pauses_and_swaps_lose_no_token_and_leak_nothing() {
    for seed in 0..40 {
        run_keep_interleaving(seed).await;
    }
}

async fn run_keep_interleaving(seed: u64) {
    let coordinator = coordinator(&["meow", "woof"]).await;
    let mut rng = StdRng::seed_from_u64(seed);
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));
    let trainer = {
        let (coordinator, stop, cycles) = (coordinator.clone(), stop.clone(), cycles.clone());
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let lora = name(if rng.random_bool(0.5) { "meow" } else { "woof" });
                let mode = if rng.random_bool(0.8) { PauseMode::Keep } else { PauseMode::Abort };
                if rng.random_bool(0.5) {
                    let source = AdapterSource::trusted(format!("/a/{lora}"));
                    coordinator.swap_adapter(&lora, source, mode, KvPolicy::Recompute, None).await.expect("swap");
                } else {
                    let pause = coordinator.pause(&lora, PauseRequest::new(mode), None).await.expect("pause");
                    for _ in 0..rng.random_range(0..10) {
                        tokio::task::yield_now().await;
                    }
                    coordinator.resume(&lora, Some(pause.pause_id)).await.expect("resume");
                }
                cycles.fetch_add(1, Ordering::AcqRel);
                tokio::task::yield_now().await;
            }
        })
    };
    let mut samples = Vec::new();
    for i in 0..30 {
        let adapter = if rng.random_bool(0.5) { "meow" } else { "woof" };
        let budget = HOLD_AFTER + rng.random_range(1..4);
        samples.push((budget, spawn_sample(&coordinator, adapter, budget, &format!("{adapter}-{i}"))));
        if rng.random_bool(0.3) {
            tokio::task::yield_now().await;
        }
    }
    eventually("the trainer ran a few cycles", || async { cycles.load(Ordering::Acquire) >= 5 }).await;
    stop.store(true, Ordering::Release);
    joined(trainer).await;
    for adapter in ["meow", "woof"] {
        coordinator.resume(&name(adapter), None).await.expect("reopen");
    }
    // Requests that an abort-mode pause handed back end `Abort`; the rest end whole. None hangs or loses tokens.
    // Every request holds in the scripted engine until aborted. A final abort hands back what is admitted or kept;
    // a request the reopening had not admitted yet is held again by it (held requests wait for a resume) and only
    // admitted by the resume after it, so abort and reopen until every sample was handed back.
    let (reopener, tasks) = (&coordinator, &samples);
    eventually("every sample was handed back", || async move {
        for adapter in ["meow", "woof"] {
            reopener.abort(&name(adapter)).await.expect("final abort");
            reopener.resume(&name(adapter), None).await.expect("reopen after the final abort");
        }
        tasks.iter().all(|(_, task)| task.is_finished())
    })
    .await;
    for (budget, task) in samples {
        let output = joined(task).await.expect("handed back");
        let sequence = &output.sequences[0];
        let covered = sequence.segments.last().map_or(0, |segment| segment.end) as usize;
        assert_eq!(covered, sequence.token_ids.len(), "seed {seed}: segments cover every token");
        assert_eq!(sequence.logprobs.len(), sequence.token_ids.len(), "seed {seed}");
        match sequence.finish_reason {
            FinishReason::Length => assert_eq!(sequence.token_ids.len() as u32, budget, "seed {seed}"),
            FinishReason::Abort => assert!(sequence.token_ids.len() as u32 <= budget, "seed {seed}"),
            FinishReason::Stop => panic!("seed {seed}: the scripted engine never stops"),
        }
    }
    for adapter in ["meow", "woof"] {
        eventually("nothing is left", || async {
            let status = status(&coordinator, adapter).await;
            status.in_flight == 0 && status.kept == 0 && status.held == 0
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_leaving_right_after_its_last_event_is_still_reported_aborted() {
    let coordinator = coordinator_with(ScriptedEngine::new(HOLD_AFTER).with_lingering_streams(), &["meow"]).await;
    for round in 0..20 {
        let request = request(&coordinator, "meow", LONG, &format!("r{round}"));
        let deadline = coordinator.gate_deadline(None);
        let mut stream = coordinator.sample(request, deadline).await.expect("admitted");
        let reader = tokio::spawn(async move {
            while let Some(event) = stream.next().await {
                if matches!(event, Ok(SampleEvent::Finished { .. })) {
                    return; // drops the stream at once, while the engine's stream is still open
                }
            }
        });
        eventually("running", || async { status(&coordinator, "meow").await.in_flight == 1 }).await;
        let report = coordinator.abort(&name("meow")).await.expect("abort");
        assert_eq!(report.aborted.len(), 1, "round {round}: {report:?}");
        joined(reader).await;
        coordinator.resume(&name("meow"), None).await.expect("resume");
    }
}
