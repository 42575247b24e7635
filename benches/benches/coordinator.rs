//! Coordinator benchmarks (issue 2): admission on an open gate, aborting 1,000 in-flight requests until every one
//! was handed back, and releasing 10,000 waiters on resume.
//!
//! `cargo bench -p loragate-benches --bench coordinator`

// criterion_group! and criterion_main! generate undocumented items.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use loragate_core::testing::{ScriptedEngine, coordinator_with_adapters};
use loragate_core::{AdapterName, Coordinator, CoordinatorConfig, Ending, RequestId};
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

criterion_group!(benches, admit_and_release, abort_1000_in_flight, resume_10000_waiters);
criterion_main!(benches);
