//! The limits: counters stay exact under concurrency, a refusal names its limit and counts nothing, and every way a
//! request ends gives its slot back.

use std::time::Duration;

use tokio::task::JoinHandle;

use super::*;
use crate::contract::{AdapterName, SampleOutput};
use crate::coordinator::{Coordinator, CoordinatorConfig};
use crate::sampling::RawSampleRequest;
use crate::testing::{ScriptedEngine, coordinator_with_adapters, eventually};

/// A budget that keeps a scripted request in flight until it is aborted.
const LONG: u32 = 1000;

fn meow() -> AdapterKey {
    AdapterKey::Lora(AdapterName::parse("meow").expect("name"))
}

async fn coordinator(limits: Limits) -> Coordinator {
    let config = CoordinatorConfig { limits, ..CoordinatorConfig::default() };
    coordinator_with_adapters(ScriptedEngine::new(3), config, &["meow", "woof"]).await
}

fn spawn_sample(coordinator: &Coordinator, lora: &str, max_tokens: u32) -> JoinHandle<Result<SampleOutput, CoreError>> {
    let raw = RawSampleRequest {
        lora_name: lora.into(),
        prompt_token_ids: vec![1, 2, 3],
        max_tokens: Some(max_tokens),
        ..Default::default()
    };
    let request = coordinator.parse_sample(raw).expect("valid request");
    let coordinator = coordinator.clone();
    tokio::spawn(async move {
        let hold_until = coordinator.gate_deadline(None);
        coordinator.sample(request, hold_until).await?.collect_output().await
    })
}

async fn joined<T>(task: JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("finished in time").expect("no panic")
}

fn limit_of(result: &Result<SampleOutput, CoreError>) -> Option<Limit> {
    match result {
        Err(CoreError::Overloaded { limit, .. }) => Some(*limit),
        _ => None,
    }
}

#[test]
fn a_refusal_names_its_limit_and_counts_nothing() {
    let limits = Limits { max_in_flight: 2, max_in_flight_per_adapter: Some(1), ..Limits::default() };
    let server = ServerLoad::new(limits);
    let (a, b, c) = (AdapterLoad::new(&server), AdapterLoad::new(&server), AdapterLoad::new(&server));

    let first = a.occupy(Occupancy::InFlight, &meow()).expect("under every cap");
    let err = a.occupy(Occupancy::InFlight, &meow()).expect_err("a's own cap");
    assert!(matches!(err, CoreError::Overloaded { limit: Limit::InFlightPerAdapter, cap: 1, .. }), "{err}");
    assert!(err.to_string().contains("--max-in-flight-per-adapter") && err.to_string().contains("meow"), "{err}");
    let second = b.occupy(Occupancy::InFlight, &meow()).expect("b has room, the server too");
    let err = c.occupy(Occupancy::InFlight, &meow()).expect_err("the server's cap");
    assert!(matches!(err, CoreError::Overloaded { limit: Limit::InFlight, cap: 2, .. }), "{err}");
    assert_eq!(c.in_flight.get(), 0, "a refusal by the server gives back the adapter's count");
    assert_eq!(server.snapshot(), LoadSnapshot { in_flight: 2, held: 0 });

    let held = c.occupy(Occupancy::Held, &meow()).expect("held is counted apart");
    assert_eq!((c.held(), server.snapshot().held), (1, 1));
    drop((first, second, held));
    assert_eq!(server.snapshot(), LoadSnapshot::default());
    assert_eq!((a.in_flight.get(), b.in_flight.get(), c.held()), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_admissions_never_exceed_the_cap_and_every_ending_gives_the_slot_back() {
    let coordinator = coordinator(Limits { max_in_flight: 5, ..Limits::default() }).await;
    let tasks: Vec<_> = (0..60).map(|i| spawn_sample(&coordinator, ["meow", "woof", ""][i % 3], LONG)).collect();
    eventually("every request was admitted or refused", || async {
        coordinator.load().in_flight == 5 && tasks.iter().filter(|task| task.is_finished()).count() == 55
    })
    .await;
    let mut refused = Vec::new();
    let mut running = Vec::new();
    for task in tasks {
        if task.is_finished() { refused.push(joined(task).await) } else { running.push(task) }
    }
    assert!(refused.iter().all(|result| limit_of(result) == Some(Limit::InFlight)), "{refused:?}");
    assert_eq!(running.len(), 5);

    // Aborts hand back meow's and woof's requests; the base model's callers go away.
    for name in ["meow", "woof"] {
        coordinator.abort(&AdapterName::parse(name).expect("name")).await.expect("abort");
    }
    for task in running {
        if task.is_finished() {
            assert!(joined(task).await.is_ok(), "an aborted request is handed back, not failed");
        } else {
            task.abort();
        }
    }
    eventually("every slot is back", || async { coordinator.load() == LoadSnapshot::default() }).await;
    for name in ["meow", "woof"] {
        coordinator.resume(&AdapterName::parse(name).expect("name"), None).await.expect("resume");
    }
    let output = joined(spawn_sample(&coordinator, "meow", 2)).await.expect("admitted again under the cap");
    assert_eq!(output.sequences[0].token_ids, vec![0, 1]);
}

#[tokio::test]
async fn one_adapter_at_its_cap_leaves_the_others_served() {
    let limits = Limits { max_in_flight_per_adapter: Some(2), max_held_per_adapter: Some(1), ..Limits::default() };
    let coordinator = coordinator(limits).await;
    let running: Vec<_> = (0..2).map(|_| spawn_sample(&coordinator, "meow", LONG)).collect();
    eventually("meow is at its cap", || async { coordinator.load().in_flight == 2 }).await;
    let refused = joined(spawn_sample(&coordinator, "meow", 2)).await;
    assert_eq!(limit_of(&refused), Some(Limit::InFlightPerAdapter), "{refused:?}");
    let woof = joined(spawn_sample(&coordinator, "woof", 2)).await.expect("woof has its own budget");
    assert_eq!(woof.sequences[0].token_ids.len(), 2);

    // Held requests are capped apart from admitted ones.
    coordinator.abort(&AdapterName::parse("meow").expect("name")).await.expect("pause meow");
    for task in running {
        joined(task).await.expect("handed back");
    }
    let held = spawn_sample(&coordinator, "meow", 2);
    eventually("one meow request is held", || async { coordinator.load().held == 1 }).await;
    let refused = joined(spawn_sample(&coordinator, "meow", 2)).await;
    assert_eq!(limit_of(&refused), Some(Limit::HeldPerAdapter), "{refused:?}");
    assert!(!held.is_finished());
    coordinator.resume(&AdapterName::parse("meow").expect("name"), None).await.expect("resume");
    joined(held).await.expect("the held request is admitted on resume");
    assert_eq!(coordinator.load(), LoadSnapshot::default());
}

#[tokio::test]
async fn held_requests_over_the_servers_cap_are_refused_at_once() {
    let coordinator = coordinator(Limits { max_held: 2, ..Limits::default() }).await;
    for name in ["meow", "woof"] {
        coordinator.abort(&AdapterName::parse(name).expect("name")).await.expect("pause");
    }
    let held = [spawn_sample(&coordinator, "meow", 2), spawn_sample(&coordinator, "woof", 2)];
    eventually("two requests are held", || async { coordinator.load().held == 2 }).await;
    let refused = joined(spawn_sample(&coordinator, "meow", 2)).await;
    assert_eq!(limit_of(&refused), Some(Limit::Held), "{refused:?}");
    let base = joined(spawn_sample(&coordinator, "", 2)).await.expect("the open base model is not held");
    assert_eq!(base.sequences[0].token_ids.len(), 2);
    for task in held {
        task.abort();
    }
    eventually("held callers that left are counted out", || async { coordinator.load().held == 0 }).await;
}

#[tokio::test]
async fn kept_requests_come_back_even_over_the_cap_and_count_against_it() {
    use crate::contract::{PauseMode, PauseRequest};

    let coordinator = coordinator(Limits { max_in_flight: 2, ..Limits::default() }).await;
    let meow = AdapterName::parse("meow").expect("name");
    let kept: Vec<_> = (0..2).map(|_| spawn_sample(&coordinator, "meow", LONG)).collect();
    eventually("meow fills the cap", || async { coordinator.load().in_flight == 2 }).await;
    let pause = coordinator.pause(&meow, PauseRequest::new(PauseMode::Keep), None).await.expect("keep");
    assert_eq!(pause.kept.len(), 2);
    eventually("kept requests are not in flight", || async { coordinator.load().in_flight == 0 }).await;

    let fresh: Vec<_> = (0..2).map(|_| spawn_sample(&coordinator, "woof", LONG)).collect();
    eventually("woof takes the freed room", || async { coordinator.load().in_flight == 2 }).await;
    coordinator.resume(&meow, Some(pause.pause_id)).await.expect("resume");
    eventually("the kept requests run again, over the cap", || async { coordinator.load().in_flight == 4 }).await;
    assert!(kept.iter().all(|task| !task.is_finished()), "no kept request was refused");
    let refused = joined(spawn_sample(&coordinator, "", 2)).await;
    assert_eq!(limit_of(&refused), Some(Limit::InFlight), "they count against the cap: {refused:?}");

    for task in kept.into_iter().chain(fresh) {
        task.abort();
    }
    eventually("every slot is back", || async { coordinator.load() == LoadSnapshot::default() }).await;
}
