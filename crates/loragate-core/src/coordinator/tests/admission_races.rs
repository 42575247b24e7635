//! Admissions register themselves in the registry the actor owns, under its lock, with no round trip through the
//! actor. These tests race them against the actor's passes over the registry (abort- and keep-mode pauses, a crash)
//! over many randomised interleavings: a request is either registered before the pass (and the pass reaches it) or
//! held by the closed gate — never admitted through a closed gate unseen, never lost.

use super::*;
use std::sync::atomic::AtomicU64;

use crate::contract::{Ending, StopCause};

/// Admitting tasks, each looping over admit → (maybe) wait a little → hand back as its stop cause says.
const ADMITTERS: usize = 4;
/// Pauses per seed, while the admitting tasks loop.
const PAUSES: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_racing_abort_and_keep_pauses_are_reached_by_the_pause_or_held() {
    for seed in 0..100u64 {
        race_admissions_with_pauses(seed).await;
    }
}

async fn race_admissions_with_pauses(seed: u64) {
    let coordinator = coordinator(&["meow"]).await;
    let adapter = coordinator.lora(&name("meow")).expect("loaded");
    // Set once a pause returned (its pass over the registry done), cleared before its resume.
    let paused = Arc::new(AtomicBool::new(false));
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let endings: Arc<Mutex<HashMap<String, Ending>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    // Admission attempts so far, so that the pauser can see some made while its pause holds.
    let attempts = Arc::new(AtomicU64::new(0));

    let admitters: Vec<_> = (0..ADMITTERS)
        .map(|index| {
            let (adapter, paused, violations, endings, stop, attempts) =
                (adapter.clone(), paused.clone(), violations.clone(), endings.clone(), stop.clone(), attempts.clone());
            let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(97).wrapping_add(index as u64));
            tokio::spawn(async move {
                for i in 0.. {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let id = format!("a{index}-{i}");
                    let request_id = RequestId::parse_or_generate(&id).expect("id");
                    // The decision alone, not the wait at a closed gate before it: this is the check that must close
                    // the race, so it is tried at any moment, closed gate or not.
                    let admission = loop {
                        attempts.fetch_add(1, Ordering::AcqRel);
                        match adapter.admit_unheld(request_id.clone()).await {
                            Some(admission) => break admission,
                            None => tokio::task::yield_now().await,
                        }
                    };
                    if paused.load(Ordering::Acquire) && !admission.cancel_token().is_cancelled() {
                        violations.lock().push(format!("{id} admitted after a pause's pass, uncancelled"));
                    }
                    for _ in 0..rng.random_range(0..4) {
                        tokio::task::yield_now().await;
                    }
                    let ending = match admission.stop_cause() {
                        Some(StopCause::Kept) => Ending::Kept,
                        Some(_) => Ending::Aborted,
                        None => Ending::Completed,
                    };
                    endings.lock().insert(id, ending);
                    admission.hand_back(ending);
                }
            })
        })
        .collect();

    let mut rng = StdRng::seed_from_u64(seed);
    let mut reports = Vec::new();
    for _ in 0..PAUSES {
        let mode = if rng.random_bool(0.5) { PauseMode::Abort } else { PauseMode::Keep };
        let report =
            adapter.pause(PauseRequest::new(mode), Duration::from_secs(30), Instant::now()).await.expect("pause");
        paused.store(true, Ordering::Release);
        // Let every admitting task try (at least once on average) while the pause holds.
        let (seen, deadline) = (attempts.load(Ordering::Acquire), Instant::now() + Duration::from_secs(30));
        while attempts.load(Ordering::Acquire) < seen + ADMITTERS as u64 {
            assert!(Instant::now() < deadline, "seed {seed}: the admitting tasks stopped trying");
            tokio::task::yield_now().await;
        }
        paused.store(false, Ordering::Release);
        adapter.resume(None).await.expect("resume");
        reports.push((mode, report));
        for _ in 0..rng.random_range(0..6) {
            tokio::task::yield_now().await;
        }
    }
    stop.store(true, Ordering::Release);
    for admitter in admitters {
        joined(admitter).await;
    }

    assert!(violations.lock().is_empty(), "seed {seed}: {:?}", violations.lock());
    // Never lost: every request a pause stopped is in that pause's report, as its mode says, and no report names a
    // request that was not stopped by it.
    let mut reported: HashMap<String, Ending> = HashMap::new();
    for (mode, report) in &reports {
        assert!(report.unacknowledged.is_empty(), "seed {seed}: {report:?}");
        let (listed, other) = match mode {
            PauseMode::Abort => (&report.aborted, &report.kept),
            _ => (&report.kept, &report.aborted),
        };
        assert!(other.is_empty(), "seed {seed}: a {mode:?} pause reported {other:?} the other way");
        for id in listed {
            let ending = if *mode == PauseMode::Abort { Ending::Aborted } else { Ending::Kept };
            assert!(reported.insert(id.to_string(), ending).is_none(), "seed {seed}: {id} reported twice");
        }
    }
    let stopped: HashMap<String, Ending> = endings
        .lock()
        .iter()
        .filter(|(_, ending)| **ending != Ending::Completed)
        .map(|(id, e)| (id.clone(), *e))
        .collect();
    assert_eq!(stopped, reported, "seed {seed}: the requests pauses stopped and those they reported");
    eventually("the registry empties", || async { status(&coordinator, "meow").await.in_flight == 0 }).await;
}

/// An admission that finds its incarnation's registry ended (the actor died) registers in the next incarnation's,
/// where an abort reaches it; a request admitted in the dead one was aborted with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_after_a_crash_registers_with_the_next_incarnation() {
    let coordinator = coordinator(&["meow"]).await;
    let adapter = coordinator.lora(&name("meow")).expect("loaded");
    for round in 0..20 {
        let hold_until = Instant::now() + Duration::from_secs(600);
        let before = adapter.admit(RequestId::parse_or_generate("before").expect("id"), hold_until).await;
        let before = before.expect("admitted");
        let dead = adapter.cell().current_actor().expect("running");
        dead.kill();
        eventually("the dead incarnation's registry aborted what it held", || async {
            before.cancel_token().is_cancelled()
        })
        .await;
        assert_eq!(before.stop_cause(), Some(StopCause::Retired), "round {round}");
        drop(before);
        // The cell may still name the dead incarnation here: the admission waits for the next one.
        let after = adapter.admit(RequestId::parse_or_generate("after").expect("id"), hold_until).await;
        let after = after.expect("admitted by the next incarnation");
        assert!(!after.cancel_token().is_cancelled(), "round {round}: the next incarnation holds it");
        assert_ne!(adapter.cell().current_actor().expect("restarted").get_id(), dead.get_id());
        let handed_back = tokio::spawn(async move {
            after.cancel_token().cancelled().await;
            after.hand_back(Ending::Aborted);
        });
        let report = coordinator.abort(&name("meow")).await.expect("abort");
        assert_eq!(report.aborted.iter().map(|id| id.as_str()).collect::<Vec<_>>(), ["after"], "round {round}");
        joined(handed_back).await;
        coordinator.resume(&name("meow"), None).await.expect("resume");
    }
}
