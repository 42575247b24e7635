//! The fleet engine under the real coordinator, over in-process `loragate worker` servers (scripted engines) on
//! 127.0.0.1. Each worker runs on its own thread and runtime, so killing one drops every connection it had, as a
//! killed process would.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use loragate_core::testing::{ScriptedEngine, eventually};
use loragate_core::{
    AdapterName, AdapterRoot, AdapterSource, Coordinator, CoordinatorConfig, CoreError, Engine, EngineError,
    FinishReason, ModelInfo, RawSampleRequest, SampleEvent, SampleStream,
};
use loragate_core::{FleetControl, FleetControlError, WorkerState};
use loragate_worker::{WorkerConfig, serve_worker};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use vllm_proto as pb;

use super::{FleetConfig, FleetEngine};
use crate::address::WorkerAddress;

/// A worker on its own thread and runtime, over a scripted engine whose requests emit 3 tokens and then wait to be
/// cancelled (if their budget allows more).
struct TestWorker {
    address: String,
    port: u16,
    kill: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

const HOLD_AFTER: u32 = 3;

impl TestWorker {
    fn start(root: &Path) -> Self {
        Self::start_on(root, 0)
    }

    fn start_on(root: &Path, port: u16) -> Self {
        Self::serving(Arc::new(ScriptedEngine::new(HOLD_AFTER)), root, port)
    }

    fn serving(engine: Arc<dyn Engine>, root: &Path, port: u16) -> Self {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("addr").port();
        let kill = CancellationToken::new();
        let coordinator_config = CoordinatorConfig {
            adapter_root: Some(AdapterRoot::new(root).expect("root")),
            reserved_names: vec!["scripted".into()],
            ..CoordinatorConfig::default()
        };
        let killed = kill.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let coordinator = Coordinator::start(engine, coordinator_config).await.expect("the coordinator starts");
                tokio::select! {
                    served = serve_worker(listener, coordinator, WorkerConfig::new("scripted")) => {
                        served.expect("the worker serves");
                    }
                    () = killed.cancelled() => {}
                }
            });
            // Dropping the runtime drops every connection task: the clients see the worker vanish.
            drop(runtime);
        });
        Self { address: format!("grpc://127.0.0.1:{port}"), port, kill, thread: Some(thread) }
    }

    fn kill(&mut self) {
        self.kill.cancel();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("worker thread");
        }
    }

    /// The adapters the worker itself lists.
    async fn loras(&self) -> BTreeSet<String> {
        let url = format!("http://127.0.0.1:{}", self.port);
        let channel = Channel::from_shared(url).expect("uri").connect().await.expect("connect");
        let listed = pb::control_client::ControlClient::new(channel).list_loras(pb::ListLorasRequest {}).await;
        listed.expect("list").into_inner().adapters.into_iter().map(|adapter| adapter.lora_name).collect()
    }
}

impl Drop for TestWorker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An adapter root with `meow`, `woof` and (unless `without_kitten`) `kitten`.
fn adapter_root(without_kitten: bool) -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("temp dir");
    for adapter in ["meow", "woof", "kitten"] {
        if adapter == "kitten" && without_kitten {
            continue;
        }
        std::fs::create_dir(root.path().join(adapter)).expect("adapter dir");
    }
    root
}

fn model() -> ModelInfo {
    ModelInfo { vocab_size: 260, context_length: 4096, eos_token_ids: vec![257] }
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

async fn fleet(workers: &[&TestWorker]) -> (Arc<FleetEngine>, Coordinator) {
    let addresses = workers.iter().map(|w| WorkerAddress::parse(&w.address).expect("address")).collect();
    let fleet = Arc::new(FleetEngine::start(model(), addresses, config()).await.expect("fleet"));
    fleet.wait_ready().await.expect("the workers become ready");
    let coordinator = Coordinator::start(fleet.clone(), CoordinatorConfig::default()).await.expect("coordinator");
    (fleet, coordinator)
}

fn name(raw: &str) -> AdapterName {
    AdapterName::parse(raw).expect("name")
}

async fn load(coordinator: &Coordinator, adapter: &str, path: &str) -> Result<u64, CoreError> {
    coordinator.load_adapter(&name(adapter), AdapterSource::trusted(path)).await.map(|installed| installed.version.0)
}

async fn sample(coordinator: &Coordinator, lora_name: &str, max_tokens: u32, num_samples: u32) -> SampleStream {
    let raw = RawSampleRequest {
        lora_name: lora_name.into(),
        prompt_token_ids: vec![72, 105],
        max_tokens: Some(max_tokens),
        num_samples,
        ..Default::default()
    };
    let request = coordinator.parse_sample(raw).expect("valid");
    coordinator.sample(request, coordinator.gate_deadline(None)).await.expect("admitted")
}

/// Reads a stream until each of its `sequences` produced `HOLD_AFTER` tokens; returns the versions seen.
async fn read_held_tokens(stream: &mut SampleStream, sequences: usize) -> Vec<u64> {
    let mut tokens = vec![0; sequences];
    let mut versions = Vec::new();
    while tokens.iter().any(|count| *count < HOLD_AFTER as usize) {
        match stream.next().await.expect("the stream goes on").expect("no error") {
            SampleEvent::Tokens { sequence, token_ids, version, .. } => {
                tokens[sequence as usize] += token_ids.len();
                versions.push(version.0);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    versions
}

/// Drains a stream; returns each sequence's finish reason and token count (its segments cover every token the
/// stream delivered, including those read before).
async fn finish(stream: SampleStream) -> Vec<(FinishReason, usize)> {
    let output = stream.collect_output().await.expect("output");
    let count = |segments: &[loragate_core::Segment]| segments.iter().map(|s| (s.end - s.start) as usize).sum();
    output.sequences.iter().map(|sequence| (sequence.finish_reason, count(&sequence.segments))).collect()
}

fn states(fleet: &FleetEngine) -> Vec<(String, WorkerState, u32, Vec<String>)> {
    fleet
        .snapshot()
        .workers
        .into_iter()
        .map(|worker| (worker.address, worker.state, worker.in_flight, worker.adapters))
        .collect()
}

#[tokio::test]
async fn versions_are_staged_as_name_at_version_requests_spread_and_an_abort_hands_every_one_back() {
    let root = adapter_root(false);
    let workers: Vec<TestWorker> = (0..3).map(|_| TestWorker::start(root.path())).collect();
    let (fleet, coordinator) = fleet(&workers.iter().collect::<Vec<_>>()).await;
    assert_eq!(load(&coordinator, "meow", "meow").await.expect("load"), 1);
    for worker in &workers {
        assert_eq!(worker.loras().await, BTreeSet::from(["meow@1".to_owned()]), "staged on every worker");
    }
    let snapshot = fleet.snapshot();
    assert!(snapshot.epoch >= 6, "three joins and three READY transitions: {}", snapshot.epoch);
    assert!(snapshot.workers.iter().all(|w| w.state == WorkerState::Ready && w.adapters == ["meow@1"]));

    let mut streams = Vec::new();
    for _ in 0..6 {
        let mut stream = sample(&coordinator, "meow", 100, 1).await;
        assert_eq!(read_held_tokens(&mut stream, 1).await, vec![1], "tokens carry the pinned version");
        streams.push(stream);
    }
    assert!(states(&fleet).iter().all(|(_, _, in_flight, _)| *in_flight == 2), "least in flight: {:?}", states(&fleet));

    // The callers keep reading, as fronts do: the hand-back happens when a stream delivers its end.
    let readers: Vec<_> = streams.into_iter().map(|stream| tokio::spawn(finish(stream))).collect();
    let report = coordinator.abort(&name("meow")).await.expect("abort");
    assert_eq!((report.aborted.len(), report.unacknowledged.len()), (6, 0), "every request handed back in time");
    for reader in readers {
        assert_eq!(reader.await.expect("reader"), vec![(FinishReason::Abort, HOLD_AFTER as usize)]);
    }
    coordinator.resume(&name("meow"), None).await.expect("resume");
    assert_eq!(finish(sample(&coordinator, "", 2, 1).await).await, vec![(FinishReason::Length, 2)], "base model");
    let spread = sample(&coordinator, "meow", 100, 3).await;
    eventually("the three sequences of one request run on three workers", || async {
        states(&fleet).iter().all(|(_, _, in_flight, _)| *in_flight == 1)
    })
    .await;
    drop(spread);
    eventually("a request whose caller left leaves every worker", || async {
        states(&fleet).iter().all(|(_, _, in_flight, _)| *in_flight == 0)
    })
    .await;
}

#[tokio::test]
async fn a_swap_unloads_the_old_version_once_nothing_runs_on_it_and_an_unload_removes_every_version() {
    let root = adapter_root(false);
    let workers: Vec<TestWorker> = (0..2).map(|_| TestWorker::start(root.path())).collect();
    let (fleet, coordinator) = fleet(&workers.iter().collect::<Vec<_>>()).await;
    load(&coordinator, "meow", "meow").await.expect("v1");
    let mut on_v1 = sample(&coordinator, "meow", 100, 1).await;
    read_held_tokens(&mut on_v1, 1).await;

    assert_eq!(load(&coordinator, "meow", "woof").await.expect("v2"), 2);
    let mut on_v2 = sample(&coordinator, "meow", 100, 1).await;
    assert_eq!(read_held_tokens(&mut on_v2, 1).await, vec![2], "new requests get the new version");
    for worker in &workers {
        let held = worker.loras().await;
        assert!(held.contains("meow@2"), "{held:?}");
    }
    assert!(
        states(&fleet).iter().any(|(_, _, _, adapters)| adapters.contains(&"meow@1".to_owned())),
        "v1 stays while a request runs on it"
    );

    drop(on_v1);
    eventually("meow@1 is unloaded from every worker", || async {
        let mut all = BTreeSet::new();
        for worker in &workers {
            all.extend(worker.loras().await);
        }
        all == BTreeSet::from(["meow@2".to_owned()])
    })
    .await;

    drop(on_v2);
    coordinator.unload_adapter(&name("meow")).await.expect("unload");
    eventually("no worker holds any meow version", || async {
        let mut all = BTreeSet::new();
        for worker in &workers {
            all.extend(worker.loras().await);
        }
        all.is_empty() && states(&fleet).iter().all(|(_, _, _, adapters)| adapters.is_empty())
    })
    .await;
}

#[tokio::test]
async fn a_load_that_fails_on_one_worker_rolls_back_on_the_others_and_the_old_version_keeps_serving() {
    let (root, partial_root) = (adapter_root(false), adapter_root(true));
    let workers =
        [TestWorker::start(root.path()), TestWorker::start(root.path()), TestWorker::start(partial_root.path())];
    let (fleet, coordinator) = fleet(&workers.iter().collect::<Vec<_>>()).await;
    load(&coordinator, "meow", "meow").await.expect("v1");

    let failed = load(&coordinator, "meow", "kitten").await.expect_err("kitten is missing on one worker");
    let CoreError::Engine(EngineError::AdapterFiles(report)) = &failed else { panic!("{failed:?}") };
    for worker in &workers {
        assert!(report.contains(&worker.address), "the report names every worker: {report}");
    }
    assert!(report.contains("rolled back") && report.contains("1 of 3"), "{report}");
    for worker in &workers {
        assert_eq!(worker.loras().await, BTreeSet::from(["meow@1".to_owned()]), "rolled back everywhere");
    }
    assert!(
        states(&fleet).iter().all(|(_, state, _, adapters)| *state == WorkerState::Ready && adapters == &["meow@1"])
    );
    let mut stream = sample(&coordinator, "meow", 100, 1).await;
    assert_eq!(read_held_tokens(&mut stream, 1).await, vec![1], "the previous version keeps serving");
    // The core gives a failed load's number to the next load: the staging replaces any leftover copy of it.
    assert_eq!(load(&coordinator, "meow", "woof").await.expect("a later load works"), 2);
    drop(stream);
    eventually("v1 is retired and v2 is everywhere", || async {
        let mut every = true;
        for worker in &workers {
            every &= worker.loras().await == BTreeSet::from(["meow@2".to_owned()]);
        }
        every
    })
    .await;
}

#[tokio::test]
async fn a_killed_worker_hands_back_its_sequences_with_their_tokens_and_comes_back_caught_up() {
    let root = adapter_root(false);
    let mut workers: Vec<TestWorker> = (0..3).map(|_| TestWorker::start(root.path())).collect();
    let (fleet, coordinator) = fleet(&workers.iter().collect::<Vec<_>>()).await;
    load(&coordinator, "meow", "meow").await.expect("v1");
    let mut streams = Vec::new();
    for _ in 0..6 {
        let mut stream = sample(&coordinator, "meow", 100, 1).await;
        read_held_tokens(&mut stream, 1).await;
        streams.push(stream);
    }
    let (victim_address, victim_port) = (workers[0].address.clone(), workers[0].port);
    workers[0].kill();

    // Its two sequences come back aborted, with their tokens; the other four keep running.
    eventually("the dead worker's sequences ended", || async {
        fleet.snapshot().workers.iter().any(|w| w.address == victim_address && w.in_flight == 0)
    })
    .await;
    let mut finished = Vec::new();
    let mut running = Vec::new();
    for mut stream in streams {
        match stream.next().now_or_never() {
            Some(Some(Ok(SampleEvent::Finished { reason, segments, .. }))) => {
                finished.push((reason, segments.iter().map(|s| s.end - s.start).sum::<u32>()));
            }
            None => running.push(stream),
            Some(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(finished, vec![(FinishReason::Abort, HOLD_AFTER); 2], "the dead worker's sequences, with their tokens");
    assert_eq!(running.len(), 4);
    eventually("the dead worker turns UNHEALTHY", || async {
        fleet.snapshot().workers.iter().any(|w| w.address == victim_address && w.state == WorkerState::Unhealthy)
    })
    .await;
    let dead = fleet.snapshot().workers.into_iter().find(|w| w.address == victim_address).expect("listed");
    assert!(!dead.last_error.is_empty(), "it says why");
    assert_eq!(
        finish(sample(&coordinator, "meow", 2, 1).await).await,
        vec![(FinishReason::Length, 2)],
        "new samples succeed"
    );

    workers[0] = TestWorker::start_on(root.path(), victim_port);
    eventually("the restarted worker is READY again", || async {
        fleet.snapshot().workers.iter().any(|w| w.address == victim_address && w.state == WorkerState::Ready)
    })
    .await;
    assert_eq!(workers[0].loras().await, BTreeSet::from(["meow@1".to_owned()]), "caught up before serving");
    let readers: Vec<_> = running.into_iter().map(|stream| tokio::spawn(finish(stream))).collect();
    coordinator.abort(&name("meow")).await.expect("abort");
    for reader in readers {
        assert_eq!(reader.await.expect("reader"), vec![(FinishReason::Abort, HOLD_AFTER as usize)]);
    }
}

#[tokio::test]
async fn a_drained_worker_leaves_after_its_requests_and_an_added_one_joins_caught_up() {
    let root = adapter_root(false);
    let workers: Vec<TestWorker> = (0..2).map(|_| TestWorker::start(root.path())).collect();
    let (fleet, coordinator) = fleet(&workers.iter().collect::<Vec<_>>()).await;
    load(&coordinator, "meow", "meow").await.expect("v1");
    let mut first = sample(&coordinator, "meow", 100, 1).await;
    let mut second = sample(&coordinator, "meow", 100, 1).await;
    read_held_tokens(&mut first, 1).await;
    read_held_tokens(&mut second, 1).await;
    let epoch = fleet.snapshot().epoch;

    let leaving = workers[0].address.clone();
    let removal = tokio::spawn({
        let fleet = fleet.clone();
        let leaving = leaving.clone();
        async move { fleet.remove_worker(&leaving, true).await }
    });
    eventually("the worker is DRAINING", || async {
        fleet.snapshot().workers.iter().any(|w| w.address == leaving && w.state == WorkerState::Draining)
    })
    .await;
    let mut third = sample(&coordinator, "meow", 100, 1).await;
    read_held_tokens(&mut third, 1).await;
    let on_leaving = fleet.snapshot().workers.iter().find(|w| w.address == leaving).map(|w| w.in_flight);
    assert_eq!(on_leaving, Some(1), "no new traffic to a draining worker");
    assert!(!removal.is_finished(), "the removal waits for the running request");

    let readers: Vec<_> = [first, second, third].into_iter().map(|stream| tokio::spawn(finish(stream))).collect();
    coordinator.abort(&name("meow")).await.expect("abort");
    removal.await.expect("task").expect("removed once drained");
    for reader in readers {
        assert_eq!(reader.await.expect("reader"), vec![(FinishReason::Abort, HOLD_AFTER as usize)]);
    }
    let snapshot = fleet.snapshot();
    assert_eq!(
        snapshot.workers.iter().map(|w| w.address.as_str()).collect::<Vec<_>>(),
        vec![workers[1].address.as_str()]
    );
    assert!(snapshot.epoch >= epoch + 2, "draining and leaving are membership changes");
    coordinator.resume(&name("meow"), None).await.expect("resume");

    fleet.add_worker(&leaving).await.expect("add it back");
    eventually("the added worker is READY", || async {
        fleet.snapshot().workers.iter().any(|w| w.address == leaving && w.state == WorkerState::Ready)
    })
    .await;
    assert_eq!(workers[0].loras().await, BTreeSet::from(["meow@1".to_owned()]));
    assert!(matches!(fleet.add_worker(&leaving).await, Err(FleetControlError::WorkerExists(_))));
    assert!(matches!(fleet.remove_worker("http://127.0.0.1:1", false).await, Err(FleetControlError::UnknownWorker(_))));
    assert!(matches!(
        fleet.add_worker("127.0.0.1:9").await,
        Err(FleetControlError::InvalidArgument { field: "address", .. })
    ));
}

#[tokio::test]
async fn with_no_ready_worker_the_fleet_says_which_workers_it_has() {
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = format!("grpc://{}", nobody.local_addr().expect("addr"));
    drop(nobody);
    let config = FleetConfig { join_timeout: Duration::from_millis(300), ..config() };
    let fleet = FleetEngine::start(model(), vec![WorkerAddress::parse(&address).expect("address")], config)
        .await
        .expect("fleet");
    let err = fleet.wait_ready().await.expect_err("nobody listens there");
    assert!(err.to_string().contains(&address), "{err}");
    let raw = RawSampleRequest { prompt_token_ids: vec![1], max_tokens: Some(1), ..Default::default() };
    let request = loragate_core::SampleRequest::parse(raw, &model()).expect("valid");
    match fleet.generate(request, CancellationToken::new()).await {
        Err(EngineError::Unavailable(why)) => assert!(why.contains(&address) && why.contains("unhealthy"), "{why}"),
        Err(other) => panic!("unexpected {other:?}"),
        Ok(_) => panic!("no worker can run it"),
    }
}

/// An engine that ignores cancellation: each request gets three tokens, then nothing, ever.
struct DeafEngine(ModelInfo);

#[async_trait::async_trait]
impl Engine for DeafEngine {
    fn model_info(&self) -> &ModelInfo {
        &self.0
    }

    async fn generate(
        &self,
        _request: loragate_core::SampleRequest,
        _cancel: CancellationToken,
    ) -> Result<loragate_core::EngineStream, EngineError> {
        let tokens = loragate_core::EngineEvent::Tokens {
            sequence: 0,
            version: loragate_core::AdapterVersion::BASE,
            token_ids: vec![1, 2, 3],
            logprobs: vec![-0.5; 3],
            top_logprobs: Vec::new(),
        };
        Ok(futures::stream::iter([Ok(tokens)]).chain(futures::stream::pending()).boxed())
    }

    async fn load_adapter(
        &self,
        _name: &AdapterName,
        _version: loragate_core::AdapterVersion,
        _source: &AdapterSource,
    ) -> Result<(), EngineError> {
        Ok(())
    }

    async fn release_version(
        &self,
        _name: &AdapterName,
        _version: loragate_core::AdapterVersion,
    ) -> Result<(), EngineError> {
        Ok(())
    }

    async fn unload_adapter(
        &self,
        _name: &AdapterName,
        _version: loragate_core::AdapterVersion,
    ) -> Result<(), EngineError> {
        Ok(())
    }
}

#[tokio::test]
async fn an_abort_the_worker_never_acknowledges_hands_back_what_arrived_once_the_bound_passes() {
    let root = adapter_root(false);
    let worker = TestWorker::serving(Arc::new(DeafEngine(model())), root.path(), 0);
    let address = WorkerAddress::parse(&worker.address).expect("address");
    let config = FleetConfig { abort_ack_timeout: Duration::from_millis(200), ..config() };
    let fleet = FleetEngine::start(model(), vec![address], config).await.expect("fleet");
    fleet.wait_ready().await.expect("ready");
    let raw = RawSampleRequest { prompt_token_ids: vec![1], max_tokens: Some(100), ..Default::default() };
    let request = loragate_core::SampleRequest::parse(raw, &model()).expect("valid");
    let cancel = CancellationToken::new();
    let mut events = fleet.generate(request, cancel.clone()).await.expect("started");
    let first = events.next().await.expect("an event").expect("no error");
    assert!(matches!(first, loragate_core::EngineEvent::Tokens { ref token_ids, .. } if token_ids.len() == 3));

    cancel.cancel();
    let last = events.next().await.expect("an event").expect("no error");
    assert_eq!(last, loragate_core::EngineEvent::Finished { sequence: 0, reason: FinishReason::Abort });
    assert!(events.next().await.is_none(), "the stream ends after its sequence");
    eventually("the dropped stream leaves the worker's count", || async {
        fleet.snapshot().workers.iter().all(|w| w.in_flight == 0)
    })
    .await;
}

#[tokio::test]
async fn prompt_logprobs_and_top_logprobs_come_through_once_per_request() {
    let root = adapter_root(false);
    let workers: Vec<TestWorker> = (0..3).map(|_| TestWorker::start(root.path())).collect();
    let (fleet, _coordinator) = fleet(&workers.iter().collect::<Vec<_>>()).await;
    let raw = RawSampleRequest {
        prompt_token_ids: vec![1, 2],
        max_tokens: Some(2),
        num_samples: 3,
        include_prompt_logprobs: true,
        top_logprobs: 2,
        ..Default::default()
    };
    let request = loragate_core::SampleRequest::parse(raw, &model()).expect("valid");
    let events: Vec<_> = fleet.generate(request, CancellationToken::new()).await.expect("started").collect().await;
    let events: Vec<_> = events.into_iter().map(|event| event.expect("no error")).collect();
    let prompt: Vec<_> =
        events.iter().filter(|event| matches!(event, loragate_core::EngineEvent::PromptLogprobs(_))).collect();
    assert_eq!(prompt.len(), 1, "one sequence reports the prompt's logprobs");
    assert!(matches!(prompt[0], loragate_core::EngineEvent::PromptLogprobs(l) if l.len() == 2 && l[0].is_nan()));
    // The wire mapping of top logprobs is checked in wire.rs; here, each token arrives with its own entry.
    for event in &events {
        if let loragate_core::EngineEvent::Tokens { token_ids, top_logprobs, .. } = event {
            assert_eq!(top_logprobs.len(), token_ids.len(), "{event:?}");
        }
    }
}

#[test]
fn paths_inside_the_adapter_root_go_to_the_workers_mount_of_it_and_the_rest_as_given() {
    let (root, mount) = (Some(Path::new("/srv/adapters")), Some(Path::new("/mnt/shared/adapters")));
    assert_eq!(
        super::path_for_workers(Path::new("/srv/adapters/meow/step-3"), root, mount),
        "/mnt/shared/adapters/meow/step-3"
    );
    assert_eq!(super::path_for_workers(Path::new("/srv/adapters"), root, mount), "/mnt/shared/adapters");
    assert_eq!(super::path_for_workers(Path::new("/elsewhere/meow"), root, mount), "/elsewhere/meow");
    assert_eq!(super::path_for_workers(Path::new("/srv/adapters/meow"), root, None), "/srv/adapters/meow", "as given");
    assert_eq!(super::path_for_workers(Path::new("/srv/adapters-2/meow"), root, mount), "/srv/adapters-2/meow");
}

mod hostile;
