//! The fleet over every protocol at once, on 127.0.0.1, under the real coordinator: a `loragate worker` over gRPC
//! (scripted engine) and small fakes of vLLM's and SGLang's HTTP servers written from their public API (test code
//! only), each on its own thread and runtime so that killing one drops its connections as a killed process would.
//! The fakes record what they are sent, which pins the protocols' edge cases: explicit budgets, `NAME@V` names,
//! absolute paths, aborts by call (with the id vLLM reports) or by disconnect, SGLang's `rid` aborts.

mod bounded;
mod fake_sglang;
mod fake_vllm;
mod fakes;
mod hostile;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use loragate_core::testing::{ScriptedEngine, eventually};
use loragate_core::{
    AdapterName, AdapterRoot, AdapterSource, Coordinator, CoordinatorConfig, CoreError, EngineError, FinishReason,
    FleetControl, FleetControlError, Key, Keyring, RawSampleRequest, SampleEvent, SampleStream, TenantKeys,
    WorkerState,
};
use loragate_fleet::{FleetConfig, FleetEngine, FleetError, WorkerAddress};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::fakes::{FakeServer, FakeState};

/// Every fake sequence (and the scripted engine's) produces this many tokens, then waits to be aborted.
const HOLD_AFTER: u32 = 3;

/// A `loragate worker` over a scripted engine on its own thread and runtime.
struct GrpcWorker {
    port: u16,
    kill: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GrpcWorker {
    fn start(root: &Path) -> Self {
        Self::start_with_keys(root, Keyring::open())
    }

    /// A worker that only answers callers presenting `keys`.
    fn start_with_keys(root: &Path, keys: Keyring) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("address").port();
        let coordinator_config = CoordinatorConfig {
            adapter_root: Some(AdapterRoot::new(root).expect("root")),
            auth: keys,
            reserved_names: vec!["scripted".into()],
            ..CoordinatorConfig::default()
        };
        let config = loragate_worker::WorkerConfig::new("scripted");
        let kill = CancellationToken::new();
        let killed = kill.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let engine = Arc::new(ScriptedEngine::new(HOLD_AFTER));
                let coordinator = Coordinator::start(engine, coordinator_config).await.expect("the coordinator starts");
                tokio::select! {
                    served = loragate_worker::serve_worker(listener, coordinator, config) => served.expect("serves"),
                    () = killed.cancelled() => {}
                }
            });
            drop(runtime);
        });
        Self { port, kill, thread: Some(thread) }
    }

    fn url(&self) -> String {
        format!("grpc://127.0.0.1:{}", self.port)
    }

    /// The adapters it holds, with the paths it loaded them from (its own `ListLoras`).
    async fn loras(&self) -> Vec<(String, String)> {
        let url = format!("http://127.0.0.1:{}", self.port);
        let channel = tonic::transport::Channel::from_shared(url).expect("uri").connect().await.expect("connect");
        let mut control = vllm_proto::control_client::ControlClient::new(channel);
        let listed = control.list_loras(vllm_proto::ListLorasRequest {}).await.expect("ListLoras").into_inner();
        listed.adapters.into_iter().map(|adapter| (adapter.lora_name, adapter.source_path)).collect()
    }
}

impl Drop for GrpcWorker {
    fn drop(&mut self) {
        self.kill.cancel();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("worker thread");
        }
    }
}

/// A fake HTTP worker and its state.
struct Fake {
    server: FakeServer,
    state: Arc<FakeState>,
    scheme: &'static str,
}

impl Fake {
    fn vllm(token_api: bool) -> Self {
        let state = FakeState::new(HOLD_AFTER);
        Self { server: FakeServer::start(fake_vllm::router(state.clone(), token_api), 0), state, scheme: "vllm+http" }
    }

    fn sglang() -> Self {
        let state = FakeState::new(HOLD_AFTER);
        Self { server: FakeServer::start(fake_sglang::router(state.clone()), 0), state, scheme: "sglang+http" }
    }

    /// Fakes of vLLM (with the token API) and SGLang started with `--api-key key`.
    fn keyed(key: &'static str) -> [Self; 2] {
        let (vllm, sglang) = (FakeState::new(HOLD_AFTER), FakeState::new(HOLD_AFTER));
        [
            Self {
                server: FakeServer::start(fakes::with_api_key(fake_vllm::router(vllm.clone(), true), key), 0),
                state: vllm,
                scheme: "vllm+http",
            },
            Self {
                server: FakeServer::start(fakes::with_api_key(fake_sglang::router(sglang.clone()), key), 0),
                state: sglang,
                scheme: "sglang+http",
            },
        ]
    }

    fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.server.port)
    }

    fn loaded(&self) -> Vec<(String, String)> {
        self.state.loaded.lock().iter().map(|(name, path)| (name.clone(), path.clone())).collect()
    }

    /// The streamed sampling bodies it received.
    fn streamed(&self) -> Vec<Value> {
        let routes = ["/v1/completions", "/inference/v1/generate", "/generate"];
        let bodies = routes.iter().flat_map(|route| self.state.bodies_on(route));
        bodies.filter(|body| body["stream"] == true).collect()
    }
}

fn config() -> FleetConfig {
    FleetConfig {
        health_interval: Duration::from_millis(50),
        health_timeout: Duration::from_millis(500),
        adapter_timeout: Duration::from_secs(5),
        abort_ack_timeout: Duration::from_secs(2),
        join_timeout: Duration::from_secs(10),
        max_probe_backoff: Duration::from_millis(400),
        ..FleetConfig::default()
    }
}

async fn fleet_with(urls: &[String], config: FleetConfig) -> (Arc<FleetEngine>, Coordinator) {
    let addresses = urls.iter().map(|url| WorkerAddress::parse(url).expect("address")).collect();
    let model = ScriptedEngine::new(HOLD_AFTER);
    let info = loragate_core::Engine::model_info(&model).clone();
    let fleet = Arc::new(FleetEngine::start(info, addresses, config).await.expect("fleet"));
    fleet.wait_ready().await.expect("the workers become ready");
    let coordinator = Coordinator::start(fleet.clone(), CoordinatorConfig::default()).await.expect("coordinator");
    (fleet, coordinator)
}

/// An adapter root (canonical) with `meow`, `woof` and `kitten`.
fn adapter_root() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    for adapter in ["meow", "woof", "kitten"] {
        std::fs::create_dir(dir.path().join(adapter)).expect("adapter dir");
    }
    let root = std::fs::canonicalize(dir.path()).expect("canonical");
    (dir, root)
}

fn name(raw: &str) -> AdapterName {
    AdapterName::parse(raw).expect("name")
}

async fn load(coordinator: &Coordinator, adapter: &str, dir: &Path) -> Result<u64, CoreError> {
    coordinator.load_adapter(&name(adapter), AdapterSource::trusted(dir)).await.map(|installed| installed.version.0)
}

fn raw(lora_name: &str, max_tokens: u32) -> RawSampleRequest {
    RawSampleRequest {
        lora_name: lora_name.into(),
        prompt_token_ids: vec![72, 105, 33],
        max_tokens: Some(max_tokens),
        ..Default::default()
    }
}

async fn sample(coordinator: &Coordinator, raw: RawSampleRequest) -> SampleStream {
    let request = coordinator.parse_sample(raw).expect("valid");
    coordinator.sample(request, coordinator.gate_deadline(None)).await.expect("admitted")
}

/// Reads a one-sequence stream until it produced `HOLD_AFTER` tokens.
async fn read_held(stream: &mut SampleStream) {
    let mut produced = 0;
    while produced < HOLD_AFTER as usize {
        match stream.next().await.expect("the stream goes on").expect("no error") {
            SampleEvent::Tokens { token_ids, .. } => produced += token_ids.len(),
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Each sequence's finish and token count, and the versions that produced them.
async fn finish(stream: SampleStream) -> Vec<(FinishReason, usize, Vec<u64>)> {
    let output = stream.collect_output().await.expect("output");
    let count = |segments: &[loragate_core::Segment]| segments.iter().map(|s| (s.end - s.start) as usize).sum();
    let versions = |segments: &[loragate_core::Segment]| segments.iter().map(|s| s.version.0).collect();
    output.sequences.iter().map(|s| (s.finish_reason, count(&s.segments), versions(&s.segments))).collect()
}

fn in_flight(fleet: &FleetEngine) -> Vec<u32> {
    fleet.snapshot().workers.iter().map(|worker| worker.in_flight).collect()
}

fn worker_state(fleet: &FleetEngine, url: &str) -> Option<(WorkerState, u32, bool)> {
    let snapshot = fleet.snapshot();
    let worker = snapshot.workers.into_iter().find(|worker| worker.address == url)?;
    Some((worker.state, worker.consecutive_failures, worker.next_probe.is_some()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_stages_name_at_v_from_absolute_paths_and_a_pause_aborts_on_each_with_partial_tokens() {
    let (_dir, root) = adapter_root();
    let grpc = GrpcWorker::start(&root);
    let (generate_api, completions, sglang) = (Fake::vllm(true), Fake::vllm(false), Fake::sglang());
    let fakes = [&generate_api, &completions, &sglang];
    let urls = vec![grpc.url(), generate_api.url(), completions.url(), sglang.url()];
    let (fleet, coordinator) = fleet_with(&urls, config()).await;

    // NAME@V everywhere, from the absolute path as given.
    assert_eq!(load(&coordinator, "meow", &root.join("meow")).await.expect("load"), 1);
    assert_eq!(load(&coordinator, "woof", &root.join("woof")).await.expect("load"), 1);
    let absolute = |adapter: &str| root.join(adapter).display().to_string();
    let expected = vec![("meow@1".to_owned(), absolute("meow")), ("woof@1".to_owned(), absolute("woof"))];
    assert_eq!(grpc.loras().await, expected);
    for fake in fakes {
        assert_eq!(fake.loaded(), expected, "{}", fake.url());
    }
    assert!(fleet.snapshot().workers.iter().all(|worker| worker.adapters == ["meow@1", "woof@1"]));

    // Eight meow samples spread two per worker; four woof samples run to their end meanwhile.
    let mut meows = Vec::new();
    for _ in 0..8 {
        let mut stream = sample(&coordinator, raw("meow", 1000)).await;
        read_held(&mut stream).await;
        meows.push(stream);
    }
    assert_eq!(in_flight(&fleet), [2, 2, 2, 2]);
    let woofs: Vec<_> = (0..4).map(|_| raw("woof", HOLD_AFTER)).collect();
    let mut woof_streams = Vec::new();
    for woof in woofs {
        woof_streams.push(sample(&coordinator, woof).await);
    }

    // Pausing meow aborts its samples on every protocol, each handed back with its tokens.
    let report = coordinator.abort(&name("meow")).await.expect("abort");
    assert_eq!((report.aborted.len(), report.unacknowledged.len()), (8, 0), "{report:?}");
    for stream in meows {
        assert_eq!(finish(stream).await, [(FinishReason::Abort, HOLD_AFTER as usize, vec![1])]);
    }
    for stream in woof_streams {
        assert_eq!(finish(stream).await, [(FinishReason::Length, HOLD_AFTER as usize, vec![1])], "woof runs on");
    }
    coordinator.resume(&name("meow"), None).await.expect("resume");

    // How each protocol was aborted: vLLM's token API by the id its stream reported, vLLM's completions by closing
    // the stream, SGLang by `rid`.
    // (Its abort route was probed when the worker joined, with an id nothing runs under, never an empty list.)
    let by_call = generate_api.state.aborted_by_call.lock().clone();
    let (probes, by_call): (Vec<&String>, Vec<&String>) = by_call.iter().partition(|id| *id == "loragate-probe");
    assert!(!probes.is_empty(), "the abort route was probed at the join");
    assert_eq!(by_call.len(), 2, "{by_call:?}");
    assert!(by_call.iter().all(|id| id.starts_with("generate-tokens-")), "the id vLLM reported: {by_call:?}");
    eventually("the completions fake saw its two clients leave", || async {
        completions.state.disconnects.load(Ordering::Relaxed) == 2
    })
    .await;
    assert!(completions.state.aborted_by_call.lock().is_empty());
    let rids = sglang.state.aborted_by_call.lock().clone();
    let sent_rids: Vec<String> =
        sglang.streamed().iter().filter_map(|body| body["rid"].as_str().map(str::to_owned)).collect();
    assert_eq!(rids.len(), 2);
    assert!(rids.iter().all(|rid| sent_rids.contains(rid)), "{rids:?} among {sent_rids:?}");

    // Every streamed request named its adapter version and carried its real budget.
    for fake in fakes {
        for body in fake.streamed() {
            let (model, budget) = match fake.scheme {
                "sglang+http" => (&body["lora_path"], &body["sampling_params"]["max_new_tokens"]),
                _ if body["sampling_params"].is_object() => (&body["model"], &body["sampling_params"]["max_tokens"]),
                _ => (&body["model"], &body["max_tokens"]),
            };
            let model = model.as_str().expect("an adapter");
            assert!(model == "meow@1" || model == "woof@1", "{body}");
            let budget = budget.as_u64().expect("an explicit budget");
            assert_eq!(budget, if model == "meow@1" { 1000 } else { u64::from(HOLD_AFTER) }, "{body}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_stages_the_new_version_on_every_protocol_and_drains_the_old_one_away() {
    let (_dir, root) = adapter_root();
    let grpc = GrpcWorker::start(&root);
    let (vllm, sglang) = (Fake::vllm(true), Fake::sglang());
    let (fleet, coordinator) = fleet_with(&[grpc.url(), vllm.url(), sglang.url()], config()).await;
    load(&coordinator, "meow", &root.join("meow")).await.expect("load");

    let mut on_v1 = Vec::new();
    for _ in 0..3 {
        let mut stream = sample(&coordinator, raw("meow", 1000)).await;
        read_held(&mut stream).await;
        on_v1.push(stream);
    }
    assert_eq!(in_flight(&fleet), [1, 1, 1]);
    assert_eq!(load(&coordinator, "meow", &root.join("kitten")).await.expect("swap"), 2);
    let both = ["meow@1", "meow@2"];
    for fake in [&vllm, &sglang] {
        assert_eq!(fake.loaded().iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(), both);
    }
    let fresh = sample(&coordinator, raw("meow", 2)).await;
    assert_eq!(finish(fresh).await, [(FinishReason::Length, 2, vec![2])], "new requests get the new version");

    drop(on_v1);
    eventually("meow@1 is unloaded from every worker, by their account and the fleet's", || async {
        let held_by_fakes = [&vllm, &sglang].iter().any(|fake| fake.loaded().iter().any(|(name, _)| name == "meow@1"));
        let in_the_fleets_account = fleet.snapshot().workers.iter().any(|worker| worker.adapters != ["meow@2"]);
        !held_by_fakes && !in_the_fleets_account && !grpc.loras().await.iter().any(|(name, _)| name == "meow@1")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_refused_by_one_protocol_rolls_back_on_the_others_and_the_old_version_keeps_serving() {
    let (_dir, root) = adapter_root();
    let grpc = GrpcWorker::start(&root);
    let (vllm, sglang) = (Fake::vllm(false), Fake::sglang());
    *sglang.state.refuse_paths_containing.lock() = Some("kitten".into());
    let (_fleet, coordinator) = fleet_with(&[grpc.url(), vllm.url(), sglang.url()], config()).await;
    load(&coordinator, "meow", &root.join("meow")).await.expect("load");

    let err = load(&coordinator, "meow", &root.join("kitten")).await.expect_err("SGLang cannot read it");
    let CoreError::Engine(EngineError::AdapterFiles(report)) = &err else { panic!("{err:?}") };
    assert!(report.contains("failed on 1 of 3 workers") && report.contains(&sglang.url()), "{report}");
    assert_eq!(report.matches("loaded, rolled back").count(), 2, "{report}");
    assert!(!grpc.loras().await.iter().any(|(name, _)| name == "meow@2"));
    assert_eq!(vllm.loaded().iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(), ["meow@1"]);
    let still = sample(&coordinator, raw("meow", 2)).await;
    assert_eq!(finish(still).await, [(FinishReason::Length, 2, vec![1])], "the previous version keeps serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_go_to_the_workers_mount_of_the_adapter_root_and_a_returning_worker_catches_up_the_same_way() {
    let mut vllm = Fake::vllm(true);
    let config = FleetConfig {
        adapter_root: Some(PathBuf::from("/srv/adapters")),
        worker_adapter_root: Some(PathBuf::from("/mnt/shared/adapters")),
        ..config()
    };
    let (fleet, coordinator) = fleet_with(&[vllm.url()], config).await;
    load(&coordinator, "meow", Path::new("/srv/adapters/meow/step-3")).await.expect("load");
    load(&coordinator, "woof", Path::new("/elsewhere/woof")).await.expect("load");
    let expected = vec![
        ("meow@1".to_owned(), "/mnt/shared/adapters/meow/step-3".to_owned()),
        ("woof@1".to_owned(), "/elsewhere/woof".to_owned()),
    ];
    assert_eq!(vllm.loaded(), expected);

    // Killed and restarted empty on its port: it catches up with the same paths.
    let (url, port) = (vllm.url(), vllm.server.port);
    vllm.server.kill();
    eventually("the killed worker is UNHEALTHY", || async {
        worker_state(&fleet, &url).is_some_and(|(state, _, _)| state == WorkerState::Unhealthy)
    })
    .await;
    let state = FakeState::new(HOLD_AFTER);
    vllm = Fake { server: FakeServer::start(fake_vllm::router(state.clone(), true), port), state, scheme: "vllm+http" };
    eventually("the restarted worker is READY", || async {
        worker_state(&fleet, &url).is_some_and(|(state, _, _)| state == WorkerState::Ready)
    })
    .await;
    assert_eq!(vllm.loaded(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_is_one_worker_whatever_its_spelling_credentials_are_refused_and_the_fleet_is_bounded() {
    let (vllm, sglang, third) = (Fake::vllm(true), Fake::sglang(), Fake::sglang());
    let port = vllm.server.port;
    let duplicates = [vllm.url(), format!("VLLM+HTTP://localhost:{port}/")];
    let addresses = duplicates.iter().map(|url| WorkerAddress::parse(url).expect("valid")).collect();
    let model = loragate_core::Engine::model_info(&ScriptedEngine::new(1)).clone();
    let started = FleetEngine::start(model, addresses, config()).await;
    assert!(matches!(started, Err(FleetError::WorkerExists { .. })), "one process listed twice at start");

    let config = FleetConfig { max_workers: 2, ..config() };
    let (fleet, _coordinator) = fleet_with(&[vllm.url()], config).await;
    assert_eq!(fleet.snapshot().workers[0].address, format!("vllm+http://127.0.0.1:{port}"));
    for same in [
        format!("vllm+http://LOCALHOST:{port}/"),
        format!("sglang+http://127.0.0.1:{port}"),
        format!("http://127.0.0.1:0{port}"),
    ] {
        let err = fleet.add_worker(&same).await.expect_err(&same);
        assert!(
            matches!(&err, FleetControlError::WorkerExists(message) if message.contains(&vllm.url())),
            "{same}: {err}"
        );
    }
    let err = fleet.add_worker(&format!("vllm+http://user:hunter2@127.0.0.1:{}", sglang.server.port)).await;
    let err = err.expect_err("credentials");
    assert!(
        matches!(err, FleetControlError::InvalidArgument { field: "address", .. })
            && !err.to_string().contains("hunter2"),
        "{err}"
    );

    fleet.add_worker(&sglang.url()).await.expect("a second worker");
    let full = fleet.add_worker(&third.url()).await.expect_err("over --max-workers");
    assert!(matches!(full, FleetControlError::TooManyWorkers { max: 2 }), "{full}");
    fleet
        .remove_worker(&format!("SGLANG+HTTP://localhost:{}/", sglang.server.port), false)
        .await
        .expect("any spelling");
    fleet.add_worker(&third.url()).await.expect("room again");
    assert_eq!(fleet.snapshot().workers.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_worker_backs_off_and_serves_again_only_after_its_probation() {
    let (steady, flaky) = (Fake::vllm(true), Fake::sglang());
    let config = FleetConfig {
        health_interval: Duration::from_millis(30),
        failure_threshold: 2,
        max_probe_backoff: Duration::from_millis(240),
        ..config()
    };
    let (fleet, coordinator) = fleet_with(&[steady.url(), flaky.url()], config).await;
    let (_dir, root) = adapter_root();
    load(&coordinator, "meow", &root.join("meow")).await.expect("load");

    flaky.state.healthy.store(false, Ordering::Relaxed);
    eventually("the failing worker backs off", || async {
        worker_state(&fleet, &flaky.url()).is_some_and(|(state, failures, backing_off)| {
            state == WorkerState::Unhealthy && failures >= 3 && backing_off
        })
    })
    .await;
    // Backing off: over 0.6 s it is probed far less than every 30 ms (a loaded machine probes less, never more).
    let before = flaky.state.health_checks.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let probes = flaky.state.health_checks.load(Ordering::Relaxed) - before;
    assert!(probes <= 6, "{probes} probes in 0.6 s");
    // Meanwhile every request goes to the steady worker.
    for _ in 0..4 {
        assert_eq!(finish(sample(&coordinator, raw("meow", 2)).await).await, [(FinishReason::Length, 2, vec![1])]);
    }
    assert!(flaky.streamed().is_empty(), "no traffic while failing");

    // Healthy again: it must pass two checks in a row (its probation) before it serves.
    let recovered_at = flaky.state.health_checks.load(Ordering::Relaxed);
    flaky.state.healthy.store(true, Ordering::Relaxed);
    eventually("the worker serves again", || async {
        worker_state(&fleet, &flaky.url()).is_some_and(|(state, _, _)| state == WorkerState::Ready)
    })
    .await;
    assert!(flaky.state.health_checks.load(Ordering::Relaxed) - recovered_at >= 2, "two checks before it served");
    eventually("two more checks while serving clear its record", || async {
        worker_state(&fleet, &flaky.url()).is_some_and(|(_, failures, backing_off)| failures == 0 && !backing_off)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_http_worker_hands_back_each_of_its_sequences_with_its_tokens() {
    let (_dir, root) = adapter_root();
    let (vllm, mut sglang) = (Fake::vllm(false), Fake::sglang());
    let (fleet, coordinator) = fleet_with(&[vllm.url(), sglang.url()], config()).await;
    load(&coordinator, "meow", &root.join("meow")).await.expect("load");
    let mut streams = Vec::new();
    for _ in 0..4 {
        let mut stream = sample(&coordinator, raw("meow", 1000)).await;
        read_held(&mut stream).await;
        streams.push(stream);
    }
    assert_eq!(in_flight(&fleet), [2, 2]);
    sglang.server.kill();
    let mut finished = Vec::new();
    let mut running = Vec::new();
    for stream in streams {
        let reader = tokio::spawn(finish(stream));
        running.push(reader);
    }
    eventually("the killed worker's two samples came back", || async {
        running.iter().filter(|reader| reader.is_finished()).count() == 2
    })
    .await;
    let (done, still): (Vec<_>, Vec<_>) = running.into_iter().partition(|reader| reader.is_finished());
    for reader in done {
        finished.push(reader.await.expect("reader"));
    }
    assert_eq!(finished, vec![vec![(FinishReason::Abort, HOLD_AFTER as usize, vec![1])]; 2], "with every token");
    eventually("the killed worker is UNHEALTHY", || async {
        worker_state(&fleet, &sglang.url()).is_some_and(|(state, _, _)| state == WorkerState::Unhealthy)
    })
    .await;
    coordinator.abort(&name("meow")).await.expect("abort the others");
    for reader in still {
        assert_eq!(reader.await.expect("reader"), [(FinishReason::Abort, HOLD_AFTER as usize, vec![1])]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_and_per_sequence_seeds_come_through_both_http_protocols() {
    for fake in [Fake::vllm(true), Fake::vllm(false), Fake::sglang()] {
        let (_dir, root) = adapter_root();
        let (_fleet, coordinator) = fleet_with(&[fake.url()], config()).await;
        load(&coordinator, "meow", &root.join("meow")).await.expect("load");
        let request = RawSampleRequest {
            num_samples: 2,
            seed: Some(11),
            temperature: 1.0,
            include_prompt_logprobs: true,
            prompt_top_logprobs: Some(1),
            ..raw("meow", 2)
        };
        let output = sample(&coordinator, request).await.collect_output().await.expect("output");
        assert!(output.prompt_logprobs[0].is_nan(), "{}", fake.url());
        assert_eq!(&output.prompt_logprobs[1..], &[-1.0, -1.0], "{}", fake.url());
        assert_eq!(output.prompt_top_logprobs[1].top, [(7, -0.25)], "{}", fake.url());
        assert!(output.sequences.iter().all(|sequence| sequence.token_ids == [10, 11]), "{}", fake.url());
        let mut seeds: Vec<u64> = fake
            .streamed()
            .iter()
            .map(|body| {
                let fields = if body["sampling_params"].is_object() { &body["sampling_params"] } else { body };
                fields["seed"].as_u64().or_else(|| fields["sampling_seed"].as_u64()).expect("a seed")
            })
            .collect();
        seeds.sort_unstable();
        assert_eq!(seeds, [11, 12], "sequence i uses seed + i: {}", fake.url());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_key_is_presented_to_every_protocol_and_a_fleet_without_it_never_gets_ready() {
    let (_dir, root) = adapter_root();
    let keys = Keyring::new(None, Some(Key::parse("k-worker").expect("key")), TenantKeys::default()).expect("keys");
    let grpc = GrpcWorker::start_with_keys(&root, keys);
    let [vllm, sglang] = Fake::keyed("k-worker");
    let urls = [grpc.url(), vllm.url(), sglang.url()];

    let without = FleetConfig { join_timeout: Duration::from_millis(500), ..config() };
    let addresses = urls.iter().map(|url| WorkerAddress::parse(url).expect("address")).collect();
    let info = loragate_core::Engine::model_info(&ScriptedEngine::new(HOLD_AFTER)).clone();
    let keyless = FleetEngine::start(info, addresses, without).await.expect("fleet");
    assert!(keyless.wait_ready().await.is_err(), "no worker answers a coordinator without the key");
    drop(keyless);

    let with = FleetConfig { worker_key: Some(Key::parse("k-worker").expect("key")), ..config() };
    let (_fleet, coordinator) = fleet_with(&urls, with).await;
    // Staging succeeds only if every worker accepted the load.
    assert_eq!(load(&coordinator, "meow", &root.join("meow")).await.expect("staged on every worker"), 1);
    for fake in [&vllm, &sglang] {
        assert_eq!(fake.loaded().len(), 1, "{}", fake.url());
    }
    for _ in 0..3 {
        let output = sample(&coordinator, raw("meow", 2)).await.collect_output().await.expect("output");
        assert_eq!(output.sequences[0].finish_reason, FinishReason::Length);
    }
}
