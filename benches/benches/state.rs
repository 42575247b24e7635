//! Durable state benchmarks (issue 19): admission and hand-back with the embedded store configured against memory
//! only (the hot path must not wait on the store), a recorded pause and resume (what a control call pays for its
//! fsync), and a restart to serving with 100 recorded adapters (the coordinator over a scripted engine, and the
//! whole `loragate serve` on the demo model).
//!
//! `cargo bench -p loragate-benches --bench state`

// criterion_group! and criterion_main! generate undocumented items.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use loragate::{RunningServer, ServeConfig, StateLocation};
use loragate_core::testing::ScriptedEngine;
use loragate_core::{
    AdapterName, AdapterSource, Coordinator, CoordinatorConfig, MemoryStore, PauseMode, PauseRequest, StateStore,
};
use loragate_state::EmbeddedStore;
use tokio::runtime::Runtime;

const RECORDED_ADAPTERS: usize = 100;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

async fn coordinator_on(state: Arc<dyn StateStore>, adapters: &[&str]) -> Coordinator {
    let config = CoordinatorConfig { state, ..CoordinatorConfig::default() };
    let coordinator = Coordinator::start(Arc::new(ScriptedEngine::new(1)), config).await.expect("starts");
    for adapter in adapters {
        let name = AdapterName::parse(adapter).expect("name");
        coordinator.load_adapter(&name, AdapterSource::trusted(format!("/a/{adapter}"))).await.expect("loads");
    }
    coordinator
}

/// The same loop as the coordinator benchmark's `admit_and_release_open_gate`, once per store.
fn admit_and_release(c: &mut Criterion) {
    let runtime = runtime();
    let dir = tempfile::tempdir().expect("state dir");
    let stores: [(&str, Arc<dyn StateStore>); 2] = [
        ("memory_only", Arc::new(MemoryStore::new())),
        ("durable_state", Arc::new(EmbeddedStore::open(dir.path()).expect("the embedded store"))),
    ];
    let mut group = c.benchmark_group("admit_and_release_open_gate");
    for (label, state) in stores {
        let coordinator = runtime.block_on(coordinator_on(state, &["bench"]));
        let adapter = coordinator.lora(&AdapterName::parse("bench").expect("name")).expect("loaded");
        group.bench_function(label, |b| {
            b.iter_custom(|iterations| loragate_benches::time_admit_and_release(&runtime, &adapter, iterations));
        });
    }
    group.finish();
}

/// A named pause with a lease, then its resume: both answered only once recorded.
fn pause_and_resume(c: &mut Criterion) {
    let runtime = runtime();
    let dir = tempfile::tempdir().expect("state dir");
    let stores: [(&str, Arc<dyn StateStore>); 2] = [
        ("memory_only", Arc::new(MemoryStore::new())),
        ("durable_state", Arc::new(EmbeddedStore::open(dir.path()).expect("the embedded store"))),
    ];
    let mut group = c.benchmark_group("recorded_pause_and_resume");
    group.sample_size(30);
    for (label, state) in stores {
        let coordinator = runtime.block_on(coordinator_on(state, &["bench"]));
        let name = AdapterName::parse("bench").expect("name");
        group.bench_function(label, |b| {
            b.to_async(&runtime).iter(|| async {
                let request = PauseRequest::parse(PauseMode::Keep, "trainer", 600.0).expect("valid");
                let pause = coordinator.pause(&name, request, None).await.expect("paused");
                coordinator.resume(&name, Some(pause.pause_id)).await.expect("resumed");
            });
        });
    }
    group.finish();
}

/// A copy of the state file in `recorded`, in a new directory: each restart starts from the same record, and never
/// waits for the previous server's last clone of its store to go.
fn copy_of(recorded: &std::path::Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().expect("state dir");
    std::fs::copy(recorded.join(loragate_state::STATE_FILE), copy.path().join(loragate_state::STATE_FILE))
        .expect("copy the record");
    copy
}

/// Records 100 adapters (and a pause on each), then measures starting again on the record until serving.
fn restart_with_100_recorded_adapters(c: &mut Criterion) {
    let runtime = runtime();
    let names: Vec<String> = (0..RECORDED_ADAPTERS).map(|i| format!("a{i:03}")).collect();
    let mut group = c.benchmark_group("restart_to_serving_100_recorded_adapters");
    group.sample_size(10);

    let dir = tempfile::tempdir().expect("state dir");
    runtime.block_on(async {
        let store: Arc<dyn StateStore> = Arc::new(EmbeddedStore::open(dir.path()).expect("store"));
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let coordinator = coordinator_on(store, &refs).await;
        for name in &names {
            let request = PauseRequest::parse(PauseMode::Keep, "trainer", 3600.0).expect("valid");
            coordinator.pause(&AdapterName::parse(name).expect("name"), request, None).await.expect("paused");
        }
        coordinator.shutdown(Duration::ZERO).await;
    });
    group.bench_function("coordinator_scripted_engine", |b| {
        b.iter_custom(|iterations| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    let copy = copy_of(dir.path());
                    let started = Instant::now();
                    let store: Arc<dyn StateStore> = Arc::new(EmbeddedStore::open(copy.path()).expect("store"));
                    let coordinator = coordinator_on(store, &[]).await;
                    total += started.elapsed();
                    assert_eq!(coordinator.list_adapters().await.len(), RECORDED_ADAPTERS);
                    coordinator.shutdown(Duration::ZERO).await;
                }
                total
            })
        });
    });

    // The whole server on the demo model: its adapters are the demo's two directories, 50 names each.
    let serve_dir = tempfile::tempdir().expect("state dir");
    let cache_dir = loragate::default_cache_dir();
    let config = |state_dir: &std::path::Path| {
        let mut config = ServeConfig::demo(cache_dir.clone());
        config.grpc_addr = "127.0.0.1:0".parse().expect("address");
        config.http_addr = "127.0.0.1:0".parse().expect("address");
        config.state = StateLocation::Directory(state_dir.to_owned());
        config
    };
    runtime.block_on(async {
        let files = loragate::ensure_demo_files(&cache_dir).expect("the demo files");
        let server = RunningServer::start(config(serve_dir.path())).await.expect("serves");
        for (i, name) in names.iter().enumerate() {
            let dir = if i % 2 == 0 { &files.meow_dir } else { &files.woof_dir };
            let name = AdapterName::parse(name).expect("name");
            server.coordinator().load_adapter(&name, AdapterSource::trusted(dir)).await.expect("loads");
        }
        server.shutdown().await;
    });
    group.bench_function("serve_demo_model", |b| {
        b.iter_custom(|iterations| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    let copy = copy_of(serve_dir.path());
                    let started = Instant::now();
                    let server = RunningServer::start(config(copy.path())).await.expect("serves");
                    total += started.elapsed();
                    assert_eq!(server.coordinator().list_adapters().await.len(), RECORDED_ADAPTERS + 2);
                    server.shutdown().await;
                }
                total
            })
        });
    });
    group.finish();
}

criterion_group!(benches, admit_and_release, pause_and_resume, restart_with_100_recorded_adapters);
criterion_main!(benches);
