//! Requests held for a version not yet installed are parked in the registry and admitted by the install's pass (see
//! `adapter::parked`). These tests race holders with short and long deadlines, cancellations, installs, pauses and
//! crashes of the actor over many randomised interleavings: no parked entry, held count, registration or place under
//! the staleness bound is left behind, no request is admitted through a closed gate unseen, and every admission is at
//! a version the request accepts.

use super::*;
use std::sync::atomic::AtomicU64;

use crate::contract::{Ending, StalenessPolicy};

/// Holders per seed.
const HOLDERS: usize = 24;
/// Changes (installs, pauses, resumes, crashes, cancellations) per seed, while the holders wait.
const CHANGES: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_requests_racing_installs_pauses_deadlines_and_crashes_leave_nothing_behind() {
    for seed in 0..60u64 {
        race_parked_requests(seed).await;
    }
}

/// What the holders saw.
#[derive(Default)]
struct Seen {
    violations: Mutex<Vec<String>>,
    admitted: AtomicU64,
}

async fn race_parked_requests(seed: u64) {
    let coordinator = coordinator(&["meow"]).await;
    let adapter = coordinator.lora(&name("meow")).expect("loaded");
    let mut rng = StdRng::seed_from_u64(seed);
    // A bound with room for everything: only its count is checked.
    let bounded = rng.random_bool(0.5);
    if bounded {
        adapter.set_staleness(Some(StalenessPolicy { max_staleness: 1000, batch_size: 1000 })).await.expect("set");
    }
    // Set once a pause returned (its pass over the registry done), cleared before its resume.
    let paused = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let first = adapter.gate().version.0;

    let holders: Vec<_> = (0..HOLDERS)
        .map(|index| {
            let (adapter, paused, seen) = (adapter.clone(), paused.clone(), seen.clone());
            let want = AdapterVersion(first + rng.random_range(1..=3));
            // Some give up within a few milliseconds, the rest wait for as long as the test runs.
            let patience = match rng.random_bool(0.3) {
                true => Duration::from_micros(rng.random_range(0..300)),
                false => Duration::from_secs(600),
            };
            let yields = rng.random_range(0..4);
            tokio::spawn(async move {
                let id = RequestId::parse_or_generate(&format!("h{index}")).expect("id");
                match adapter.admit_min_version(id, want, Instant::now() + patience).await {
                    Ok(admission) => {
                        // No await since the admission returned: a cancelled task counted it here or never had it.
                        seen.admitted.fetch_add(1, Ordering::AcqRel);
                        if admission.version_at_admission() < want {
                            seen.violations.lock().push(format!("h{index} admitted at an older version"));
                        }
                        if paused.load(Ordering::Acquire) && !admission.cancel_token().is_cancelled() {
                            seen.violations.lock().push(format!("h{index} admitted through a closed gate, unseen"));
                        }
                        for _ in 0..yields {
                            tokio::task::yield_now().await;
                        }
                        let ending =
                            if admission.cancel_token().is_cancelled() { Ending::Aborted } else { Ending::Completed };
                        admission.hand_back(ending);
                    }
                    Err(CoreError::VersionNotReached { .. } | CoreError::GateHoldExpired { .. }) => {}
                    Err(err) => seen.violations.lock().push(format!("h{index}: {err}")),
                }
            })
        })
        .collect();

    for _ in 0..CHANGES {
        match rng.random_range(0..10) {
            0..=2 => {
                // A load may meet a crash: it then fails, and a later one installs.
                let _ = coordinator.load_adapter(&name("meow"), AdapterSource::trusted("/a/meow")).await;
            }
            3 | 4 if !paused.load(Ordering::Acquire) => {
                let request = PauseRequest::new(PauseMode::Abort);
                adapter.pause(request, Duration::from_secs(30), Instant::now()).await.expect("pause");
                paused.store(true, Ordering::Release);
            }
            3..=5 => {
                paused.store(false, Ordering::Release);
                adapter.resume(None).await.expect("resume");
            }
            6 => {
                // A crash: the parked entries go with the registry, and their waiters park again in the next one.
                adapter.cell().current_actor().expect("running").kill();
            }
            _ => holders[rng.random_range(0..HOLDERS)].abort(),
        }
        for _ in 0..rng.random_range(0..6) {
            tokio::task::yield_now().await;
        }
    }
    paused.store(false, Ordering::Release);
    if seed.is_multiple_of(2) {
        // Release whoever still waits: an open gate and every version wanted.
        adapter.resume(None).await.expect("resume");
        while adapter.gate().version.0 < first + 3 {
            let _ = coordinator.load_adapter(&name("meow"), AdapterSource::trusted("/a/meow")).await;
        }
    } else {
        // Or cancel them all where they wait: each takes its parked entry away (no later install sweeps it).
        for holder in &holders {
            holder.abort();
        }
    }
    for holder in holders {
        match tokio::time::timeout(Duration::from_secs(30), holder).await.expect("holder finished in time") {
            Ok(()) => {}
            Err(err) => assert!(err.is_cancelled(), "seed {seed}: a holder panicked: {err}"),
        }
    }

    assert!(seen.violations.lock().is_empty(), "seed {seed}: {:?}", seen.violations.lock());
    let parked = || adapter.cell().current_registry().expect("loaded").lock().parked_len();
    assert_eq!(parked(), 0, "seed {seed}: a parked entry was left behind");
    let status = status(&coordinator, "meow").await;
    assert_eq!(status.held, 0, "seed {seed}: a held count was left behind");
    eventually("the registry empties", || async { status_of(&adapter).await.in_flight == 0 }).await;
    if bounded {
        let started = status.staleness.expect("the bound").started;
        assert_eq!(started, seen.admitted.load(Ordering::Acquire), "seed {seed}: places taken and admissions");
    }
}

async fn status_of(adapter: &AdapterHandle) -> AdapterStatus {
    adapter.status().await.expect("status")
}

/// The install's pass admits every parked request itself: each waiter's answer is there before it runs again, and it
/// wakes registered at the new version, not to decide again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_requests_wake_already_admitted_by_the_install() {
    let coordinator = coordinator(&["meow"]).await;
    let adapter = coordinator.lora(&name("meow")).expect("loaded");
    let next = AdapterVersion(adapter.gate().version.0 + 1);
    let registry = adapter.cell().current_registry().expect("loaded");
    let holders: Vec<_> = (0..50)
        .map(|index| {
            let adapter = adapter.clone();
            tokio::spawn(async move {
                let id = RequestId::parse_or_generate(&format!("h{index}")).expect("id");
                adapter.admit_min_version(id, next, Instant::now() + Duration::from_secs(600)).await
            })
        })
        .collect();
    eventually("all 50 are parked", || async { registry.lock().parked_len() == 50 }).await;
    assert_eq!(status_of(&adapter).await.held, 50);
    assert_eq!(status_of(&adapter).await.in_flight, 0);
    // Nothing runs the holders while the pass holds the registry's lock: once it is free again, every one of them
    // is registered, before any of them ran.
    let loaded = coordinator.load_adapter(&name("meow"), AdapterSource::trusted("/a/meow")).await.expect("load");
    assert_eq!(loaded.version, next);
    eventually("the pass ran", || async { registry.lock().parked_len() == 0 }).await;
    assert_eq!(registry.lock().len(), 50, "every parked request was registered by the pass");
    for holder in holders {
        let admission = joined(holder).await.expect("admitted");
        assert_eq!(admission.version_at_admission(), next);
        admission.hand_back(Ending::Completed);
    }
    eventually("the registry empties", || async { status_of(&adapter).await.in_flight == 0 }).await;
}
