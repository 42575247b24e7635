//! Coordinator benchmarks (issue 2): admission on an open gate (also under a staleness bound, issue 32), aborting
//! 1,000 in-flight requests until every one was handed back, releasing 10,000 waiters on resume, and admitting 1,000
//! requests held for a minimum version once the version is installed (issue 32).
//!
//! `cargo bench -p loragate-benches --bench coordinator`

// criterion_group! and criterion_main! generate undocumented items.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use loragate_core::testing::{ScriptedEngine, coordinator_with_adapters};
use loragate_core::{
    AdapterName, AdapterSource, Coordinator, CoordinatorConfig, Ending, MAX_STALENESS_VALUE, RequestId, StalenessPolicy,
};
use tokio::runtime::Runtime;

/// A coordinator over a model-less scripted engine, with one loaded adapter, `bench`: the coordinator benchmarks
/// measure the gate and the registry, not a model.
async fn coordinator_with_one_adapter() -> (Coordinator, AdapterName) {
    let coordinator = coordinator_with_adapters(ScriptedEngine::new(1), CoordinatorConfig::default(), &["bench"]).await;
    (coordinator, AdapterName::parse("bench").expect("valid name"))
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

/// Registers a request on an open gate and hands it back (which deregisters it): see
/// [`loragate_benches::time_admit_and_release`].
fn admit_and_release(c: &mut Criterion) {
    let runtime = runtime();
    let (coordinator, name) = runtime.block_on(coordinator_with_one_adapter());
    let adapter = coordinator.lora(&name).expect("loaded");
    c.bench_function("admit_and_release_open_gate", |b| {
        b.iter_custom(|iterations| loragate_benches::time_admit_and_release(&runtime, &adapter, iterations));
    });
}

/// [`admit_and_release`] with a staleness bound set on the adapter: every admission is counted against the bound
/// (set as wide as allowed, so that no iteration is ever held).
fn admit_and_release_with_staleness(c: &mut Criterion) {
    let runtime = runtime();
    let (coordinator, name) = runtime.block_on(coordinator_with_one_adapter());
    let widest = StalenessPolicy { max_staleness: MAX_STALENESS_VALUE, batch_size: MAX_STALENESS_VALUE };
    runtime.block_on(coordinator.set_staleness(&name, Some(widest))).expect("the bound is set");
    let adapter = coordinator.lora(&name).expect("loaded");
    c.bench_function("admit_and_release_open_gate_with_staleness", |b| {
        b.iter_custom(|iterations| loragate_benches::time_admit_and_release(&runtime, &adapter, iterations));
    });
}

/// Holds 1,000 sampling requests for the adapter's next version (`min_lora_version`), then times from the load of
/// that version until every one of them was admitted (its `sample` call answered).
fn admit_1000_held_for_a_minimum_version(c: &mut Criterion) {
    const HELD: u32 = 1000;
    let runtime = runtime();
    let (coordinator, name) = runtime.block_on(coordinator_with_one_adapter());
    let mut group = c.benchmark_group("min_version");
    group.sample_size(10);
    group.bench_function("admit_1000_held_for_a_minimum_version_after_its_load", |b| {
        b.iter_custom(|iterations| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    let adapter = coordinator.lora(&name).expect("loaded");
                    let next = adapter.status().await.expect("status").version.0 + 1;
                    let held: Vec<_> = (0..HELD)
                        .map(|_| {
                            let request = loragate_benches::min_version_request(&coordinator, &name, next);
                            let coordinator = coordinator.clone();
                            tokio::spawn(async move {
                                let stream = coordinator.sample(request, coordinator.gate_deadline(None)).await;
                                stream.expect("admitted once the version is installed")
                            })
                        })
                        .collect();
                    while adapter.status().await.expect("status").held < HELD {
                        tokio::task::yield_now().await;
                    }
                    let started = Instant::now();
                    coordinator.load_adapter(&name, AdapterSource::trusted("/a/bench")).await.expect("loads");
                    let streams = futures::future::join_all(held).await;
                    total += started.elapsed();
                    for stream in streams {
                        stream.expect("request task").collect_output().await.expect("finished");
                    }
                }
                total
            })
        });
    });
    group.finish();
}

/// Aborts an adapter with 1,000 requests in flight; each request's task hands it back when its token fires.
fn abort_1000_in_flight(c: &mut Criterion) {
    const IN_FLIGHT: usize = 1000;
    let runtime = runtime();
    let (coordinator, name) = runtime.block_on(coordinator_with_one_adapter());
    let adapter = coordinator.lora(&name).expect("loaded");
    let mut group = c.benchmark_group("abort");
    group.sample_size(30);
    group.bench_function("abort_1000_in_flight_until_acknowledged", |b| {
        b.iter_custom(|iterations| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    let mut running = Vec::with_capacity(IN_FLIGHT);
                    for i in 0..IN_FLIGHT {
                        let id = RequestId::parse_or_generate(&format!("r{i}")).expect("id");
                        let admission = adapter.admit(id, tokio::time::Instant::now()).await.expect("admitted");
                        running.push(tokio::spawn(async move {
                            admission.cancel_token().cancelled().await;
                            admission.hand_back(Ending::Aborted);
                        }));
                    }
                    let started = Instant::now();
                    let report = coordinator.abort(&name).await.expect("abort");
                    total += started.elapsed();
                    assert_eq!(report.aborted.len(), IN_FLIGHT);
                    adapter.resume(None).await.expect("resume");
                    for task in running {
                        task.await.expect("request task");
                    }
                }
                total
            })
        });
    });
    group.finish();
}

/// Resumes an adapter with 10,000 `wait_unpaused` callers and waits until every one has its answer.
fn resume_10000_waiters(c: &mut Criterion) {
    const WAITERS: u32 = 10_000;
    let runtime = runtime();
    let (coordinator, name) = runtime.block_on(coordinator_with_one_adapter());
    let adapter = coordinator.lora(&name).expect("loaded");
    let mut group = c.benchmark_group("resume");
    group.sample_size(20);
    group.bench_function("resume_10000_waiters_until_released", |b| {
        b.iter_custom(|iterations| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    coordinator.abort(&name).await.expect("pause");
                    let waiters: Vec<_> = (0..WAITERS)
                        .map(|_| {
                            let adapter = adapter.clone();
                            tokio::spawn(async move { adapter.wait_unpaused(Duration::from_secs(600)).await })
                        })
                        .collect();
                    while adapter.status().await.expect("status").waiting < WAITERS {
                        tokio::task::yield_now().await;
                    }
                    let started = Instant::now();
                    adapter.resume(None).await.expect("resume");
                    for waiter in futures::future::join_all(waiters).await {
                        assert!(!waiter.expect("waiter task").expect("answered"), "released as unpaused");
                    }
                    total += started.elapsed();
                }
                total
            })
        });
    });
    group.finish();
}

criterion_group!(
    benches,
    admit_and_release,
    admit_and_release_with_staleness,
    abort_1000_in_flight,
    resume_10000_waiters,
    admit_1000_held_for_a_minimum_version
);
criterion_main!(benches);
