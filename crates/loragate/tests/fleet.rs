//! A real fleet on loopback: worker processes behind `loragate serve --worker ...`, driven over gRPC (the loragate
//! contract, the retry client, the `Fleet` service, each worker's own listing) and HTTP.
//!
//! One fleet per scenario group, shared by the scenarios of the group (they run in order; each leaves the fleet as
//! the next expects it):
//! - a mixed fleet, one worker per protocol: a `loragate worker` over gRPC, and `loragate serve` itself as a vLLM HTTP
//!   worker and as an SGLang HTTP worker (it speaks both dialects): staging `NAME@V` from absolute paths on each,
//!   requests spreading, a pause aborting on every protocol with partial tokens, a swap draining the old version
//!   away on each, seeded samples spreading reproducibly, an HTTP worker killed mid-sample and restarted;
//! - gRPC workers: a worker killed with SIGKILL mid-sample and restarted on its address, `RemoveWorker` with drain,
//!   `AddWorker`;
//! - a coordinator on a state directory (a gRPC and an SGLang HTTP worker), killed and started again: it restores its
//!   adapters at their versions and stages them on the workers from the absolute paths it recorded;
//! - a `loragate worker` started with keys: it refuses calls without the admin key, and serves a coordinator that
//!   presents it with `--worker-key`.
//!
//! The protocols' edge cases (aborts by disconnect, `rid` aborts, explicit budgets, rollback when one protocol's load
//! fails, `--worker-adapter-root`, canonical addresses, back-off) are pinned against fakes in
//! `crates/loragate-fleet/tests/http_workers`.
//!
//! Plus a Python `grpcio` client generated from vllm-proto's own `.proto` files, driving one worker directly. The
//! Python client needs `$LORAGATE_PYTHON` (default `python3`) with `grpcio grpcio-tools`; the README's test command
//! sets that up.

use crate::spawned;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use loragate_client::SamplingClient;
use loragate_core::testing::{eventually, eventually_within};
use loragate_proto::v1::fleet_client::FleetClient;
use loragate_proto::v1::lora_control_client::LoraControlClient;
use loragate_proto::v1::sampler_client::SamplerClient;
use loragate_proto::v1::{self as pb, FinishReason};
use spawned::{PATIENCE, Spawned, cache_dir, repo_root};
use tonic::transport::Channel;
use tonic::{Code, Streaming};

const PROMPT: &[u8] = b"Make a single short animal noise.";

/// Tokens (bytes) of the demo adapters' first word after [`PROMPT`]: a space and the four letters of the noise.
const WHOLE_WORD: usize = 5;

/// The protocol a worker process speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `loragate worker`: vLLM's gRPC protocol.
    Grpc,
    /// `loragate serve` as a vLLM OpenAI HTTP server.
    VllmHttp,
    /// `loragate serve` as an SGLang HTTP server.
    SglangHttp,
}

/// A worker process on 127.0.0.1.
struct Worker {
    process: Spawned,
    kind: Kind,
    port: u16,
    root: Option<PathBuf>,
}

impl Worker {
    /// A worker of `kind` on a free port (`port` 0) or on `port`, with `root` as its adapter root (default: the
    /// demo's).
    fn start(kind: Kind, root: Option<&Path>, port: u16) -> Self {
        Self::start_with(kind, root, port, &[])
    }

    /// [`Worker::start`] with `extra` flags.
    fn start_with(kind: Kind, root: Option<&Path>, port: u16, extra: &[&str]) -> Self {
        let address = format!("127.0.0.1:{port}");
        let mut args: Vec<String> = match kind {
            Kind::Grpc => vec!["worker".into(), "--grpc-addr".into(), address],
            Kind::VllmHttp | Kind::SglangHttp => {
                ["serve", "--grpc-addr", "127.0.0.1:0", "--state-dir", "none", "--http-addr"]
                    .into_iter()
                    .map(str::to_owned)
                    .chain([address])
                    .collect()
            }
        };
        if let Some(root) = root {
            args.extend(["--adapter-root".to_owned(), root.display().to_string()]);
        }
        args.extend(extra.iter().map(|&arg| arg.to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let process = Spawned::start(&args);
        let field = if kind == Kind::Grpc { "grpc_addr" } else { "http_addr" };
        let port = process.field(field).rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
        Self { process, kind, port, root: root.map(Path::to_owned) }
    }

    /// Its address in the fleet (canonical).
    fn url(&self) -> String {
        let scheme = match self.kind {
            Kind::Grpc => "grpc",
            Kind::VllmHttp => "vllm+http",
            Kind::SglangHttp => "sglang+http",
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The versioned adapters the worker itself lists, with the path each was loaded from where it says
    /// (`vllm.Control/ListLoras`, or `GET /v1/models`, where a serving `loragate serve` also lists its own demo
    /// adapters).
    async fn lora_paths(&self) -> BTreeSet<(String, String)> {
        match self.kind {
            Kind::Grpc => {
                let url = format!("http://127.0.0.1:{}", self.port);
                let mut control = vllm_proto::control_client::ControlClient::new(channel(&url).await);
                let listed = control.list_loras(vllm_proto::ListLorasRequest {}).await.expect("ListLoras");
                let adapters = listed.into_inner().adapters.into_iter();
                adapters.map(|adapter| (adapter.lora_name, adapter.source_path)).collect()
            }
            Kind::VllmHttp | Kind::SglangHttp => {
                let url = format!("http://127.0.0.1:{}/v1/models", self.port);
                let listed: serde_json::Value = reqwest::get(url).await.expect("models").json().await.expect("json");
                let cards = listed["data"].as_array().cloned().unwrap_or_default();
                let names = cards.iter().filter_map(|card| card["id"].as_str()).filter(|id| id.contains('@'));
                names.map(|name| (name.to_owned(), String::new())).collect()
            }
        }
    }

    /// The versioned adapters the worker itself lists.
    async fn loras(&self) -> BTreeSet<String> {
        self.lora_paths().await.into_iter().map(|(name, _)| name).collect()
    }

    fn restart(&mut self) {
        self.process.kill();
        *self = Self::start(self.kind, self.root.as_deref(), self.port);
    }
}

/// Workers and the coordinator in front of them.
struct Fleet {
    workers: Vec<Worker>,
    serve: Spawned,
    channel: Channel,
    /// The coordinator's command line (to start it again).
    args: Vec<String>,
}

impl Fleet {
    /// A coordinator in front of `workers`, recording nothing.
    async fn start(workers: Vec<Worker>, adapter_root: Option<&Path>) -> Self {
        Self::start_recorded(workers, adapter_root, None).await
    }

    /// A coordinator in front of `workers`, recording its state in `state_dir` (none: in memory only).
    async fn start_recorded(workers: Vec<Worker>, adapter_root: Option<&Path>, state_dir: Option<&Path>) -> Self {
        let mut args: Vec<String> =
            ["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--worker-health-interval", "0.2"]
                .into_iter()
                .map(str::to_owned)
                .collect();
        let state_dir = state_dir.map_or_else(|| "none".to_owned(), |dir| dir.display().to_string());
        args.extend(["--state-dir".to_owned(), state_dir]);
        for worker in &workers {
            args.extend(["--worker".to_owned(), worker.url()]);
        }
        if let Some(root) = adapter_root {
            args.extend(["--adapter-root".to_owned(), root.display().to_string()]);
        }
        let (serve, channel) = Self::start_coordinator(&args).await;
        assert_eq!(serve.ready["adapters"], serde_json::json!(["meow", "woof"]), "{}", serve.ready);
        Self { workers, serve, channel, args }
    }

    async fn start_coordinator(args: &[String]) -> (Spawned, Channel) {
        let serve = Spawned::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let channel = channel(&format!("http://{}", serve.field("grpc_addr"))).await;
        (serve, channel)
    }

    /// Kills the coordinator with SIGKILL (the workers keep running and keep what they hold) and starts it again
    /// with the same command line.
    async fn restart_coordinator(&mut self) {
        self.serve.kill();
        (self.serve, self.channel) = Self::start_coordinator(&self.args).await;
    }

    fn control(&self) -> LoraControlClient<Channel> {
        LoraControlClient::new(self.channel.clone())
    }

    fn sampler(&self) -> SamplerClient<Channel> {
        SamplerClient::new(self.channel.clone())
    }

    fn fleet(&self) -> FleetClient<Channel> {
        FleetClient::new(self.channel.clone())
    }

    async fn workers(&self) -> pb::ListWorkersResponse {
        self.fleet().list_workers(pb::ListWorkersRequest {}).await.expect("ListWorkers").into_inner()
    }

    async fn worker(&self, url: &str) -> Option<pb::Worker> {
        self.workers().await.workers.into_iter().find(|worker| worker.address == url)
    }

    async fn in_state(&self, url: &str, state: pb::WorkerState) -> bool {
        self.worker(url).await.is_some_and(|worker| worker.state() == state)
    }

    async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.serve.field("http_addr"));
        reqwest::get(url).await.expect("metrics").text().await.expect("text")
    }

    async fn stream(&self, lora_name: &str, max_tokens: u32) -> Streaming<pb::SampleStreamResponse> {
        self.sampler().sample_stream(request(lora_name, max_tokens)).await.expect("SampleStream").into_inner()
    }

    async fn abort(&self, lora_name: &str) -> pb::AbortLoraRequestsResponse {
        let request = pb::AbortLoraRequestsRequest { lora_name: lora_name.into(), ..Default::default() };
        self.control().abort_lora_requests(request).await.expect("AbortLoraRequests").into_inner()
    }

    async fn resume(&self, lora_name: &str) {
        let request = pb::ResumeLoraRequestsRequest { lora_name: lora_name.into(), ..Default::default() };
        self.control().resume_lora_requests(request).await.expect("ResumeLoraRequests");
    }

    async fn load(&self, lora_name: &str, path: &str) -> Result<u64, tonic::Status> {
        let request = pb::LoadLoraAdapterRequest { lora_name: lora_name.into(), path: path.into() };
        Ok(self.control().load_lora_adapter(request).await?.into_inner().version)
    }

    /// Every adapter held by any worker, by the fleet's account and by the workers' own.
    async fn held_anywhere(&self) -> BTreeSet<String> {
        let mut held: BTreeSet<String> = self.workers().await.workers.into_iter().flat_map(|w| w.adapters).collect();
        for worker in &self.workers {
            held.extend(worker.loras().await);
        }
        held
    }

    /// The coordinator's adapters and their versions.
    async fn adapters(&self) -> Vec<(String, u64)> {
        let listed = self.control().list_lora_adapters(pb::ListLoraAdaptersRequest {}).await.expect("ListLoraAdapters");
        let mut adapters: Vec<(String, u64)> =
            listed.into_inner().adapters.into_iter().map(|adapter| (adapter.lora_name, adapter.version)).collect();
        adapters.sort();
        adapters
    }
}

async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_owned()).expect("uri").connect().await.expect("connect")
}

fn request(lora_name: &str, max_tokens: u32) -> pb::SampleRequest {
    pb::SampleRequest {
        lora_name: lora_name.into(),
        prompt_token_ids: PROMPT.iter().map(|&b| u32::from(b)).collect(),
        sampling_params: Some(pb::SamplingParams {
            max_tokens: Some(max_tokens),
            ignore_eos: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn text(tokens: &[u32]) -> String {
    String::from_utf8_lossy(&tokens.iter().filter(|&&t| t < 256).map(|&t| t as u8).collect::<Vec<_>>()).into_owned()
}

/// One sequence as a stream delivered it.
#[derive(Debug, Default)]
struct Received {
    tokens: Vec<u32>,
    finish: Option<FinishReason>,
    segments: Vec<pb::VersionSegment>,
}

impl Received {
    fn covered(&self) -> u32 {
        self.segments.iter().map(|s| s.end - s.start).sum()
    }
}

/// Reads until the stream produced at least `count` tokens (or ended).
async fn read_tokens(stream: &mut Streaming<pb::SampleStreamResponse>, received: &mut Received, count: usize) {
    while received.tokens.len() < count && received.finish.is_none() {
        let chunk = stream.message().await.expect("no error").expect("the stream goes on");
        accept(received, chunk);
    }
}

fn accept(received: &mut Received, chunk: pb::SampleStreamResponse) {
    received.tokens.extend(chunk.token_ids.iter().copied());
    if chunk.finish_reason() != FinishReason::Unspecified {
        received.finish = Some(chunk.finish_reason());
        received.segments = chunk.segments;
    }
}

/// Reads a stream to its end.
async fn read_to_end(mut stream: Streaming<pb::SampleStreamResponse>, mut received: Received) -> Received {
    while let Some(chunk) = stream.message().await.expect("no error") {
        accept(&mut received, chunk);
    }
    received
}

/// A copy of the demo's adapters (`meow`, `woof`) in a temp dir.
fn adapter_root() -> tempfile::TempDir {
    let files = loragate::ensure_demo_files(&cache_dir()).expect("demo files");
    let root = tempfile::tempdir().expect("temp dir");
    for (name, from) in [("meow", &files.meow_dir), ("woof", &files.woof_dir)] {
        std::fs::create_dir(root.path().join(name)).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read adapter dir") {
            let entry = entry.expect("entry");
            std::fs::copy(entry.path(), root.path().join(name).join(entry.file_name())).expect("copy");
        }
    }
    root
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_fleet_stages_and_drains_name_at_v_pauses_per_adapter_and_survives_a_killed_http_worker() {
    let root = adapter_root();
    let kinds = [Kind::Grpc, Kind::VllmHttp, Kind::SglangHttp];
    let workers = kinds.iter().map(|&kind| Worker::start(kind, Some(root.path()), 0)).collect();
    let mut fleet = Fleet::start(workers, Some(root.path())).await;

    // Staged as NAME@V on every worker, by the fleet's account and the workers' own, from absolute paths.
    let listed = fleet.workers().await;
    assert!(listed.epoch >= 6, "three joins and three READY transitions: {}", listed.epoch);
    let urls: Vec<String> = fleet.workers.iter().map(Worker::url).collect();
    assert_eq!(listed.workers.iter().map(|w| w.address.clone()).collect::<Vec<_>>(), urls, "canonical addresses");
    for worker in &listed.workers {
        assert_eq!(worker.state(), pb::WorkerState::Ready, "{worker:?}");
        assert_eq!(worker.adapters, ["meow@1", "woof@1"], "{worker:?}");
        assert_eq!((worker.consecutive_failures, worker.next_probe_unix_ms), (0, 0), "{worker:?}");
    }
    for worker in &fleet.workers {
        assert_eq!(
            worker.loras().await,
            BTreeSet::from(["meow@1".to_owned(), "woof@1".to_owned()]),
            "{:?}",
            worker.kind
        );
    }
    let absolute = |name: &str| root.path().join(name).display().to_string();
    let on_the_wire = fleet.workers[0].lora_paths().await;
    let expected = BTreeSet::from([("meow@1".to_owned(), absolute("meow")), ("woof@1".to_owned(), absolute("woof"))]);
    assert_eq!(on_the_wire, expected, "paths go to the workers absolute, as the coordinator resolved them");

    // Requests spread: six meow samples run two per worker (the least busy worker takes the next). Each is read to
    // its fifth token, the end of its first word (" meow": the greedy text is the noise after a space), so that
    // what the abort below hands back holds a whole word however few tokens the worker made meanwhile (with only
    // four, " meo", the check of the text failed on a loaded machine).
    let mut meows = Vec::new();
    for _ in 0..6 {
        let mut stream = fleet.stream("meow", 3000).await;
        let mut received = Received::default();
        read_tokens(&mut stream, &mut received, WHOLE_WORD).await;
        meows.push((stream, received));
    }
    let in_flight: Vec<u32> = fleet.workers().await.workers.iter().map(|w| w.in_flight).collect();
    assert_eq!(in_flight, [2, 2, 2]);

    // Pausing meow aborts its requests on every protocol, with their partial tokens; woof runs on.
    let woofs: Vec<_> = futures::future::join_all((0..3).map(|_| fleet.stream("woof", 200))).await;
    let woofs: Vec<_> =
        woofs.into_iter().map(|stream| tokio::spawn(read_to_end(stream, Received::default()))).collect();
    let meows: Vec<_> =
        meows.into_iter().map(|(stream, received)| tokio::spawn(read_to_end(stream, received))).collect();
    let aborted = fleet.abort("meow").await;
    assert_eq!((aborted.aborted_count, aborted.unacknowledged_request_ids.len()), (6, 0), "{aborted:?}");
    for meow in meows {
        let meow = meow.await.expect("reader");
        assert_eq!(meow.finish, Some(FinishReason::Abort));
        assert!(meow.tokens.len() >= WHOLE_WORD && meow.tokens.len() < 3000, "partial: {}", meow.tokens.len());
        assert_eq!(meow.covered() as usize, meow.tokens.len(), "segments cover every token");
        assert!(meow.segments.iter().all(|s| s.lora_version == 1));
        assert!(text(&meow.tokens).contains("meow"));
    }
    for woof in woofs {
        let woof = woof.await.expect("reader");
        assert_eq!((woof.finish, woof.tokens.len()), (Some(FinishReason::Length), 200), "woof is not paused");
        assert!(text(&woof.tokens).contains("woof"));
    }
    let metrics = fleet.metrics().await;
    for url in &urls {
        let line = format!("loragate_fleet_worker_abort_calls_total{{worker=\"{url}\"}} ");
        let calls = metrics.lines().find_map(|l| l.strip_prefix(&line)).expect("per-worker abort calls");
        assert!(calls.trim().parse::<u64>().expect("a count") >= 1, "every worker was sent its aborts by a call");
    }
    fleet.resume("meow").await;

    // A swap: the new version is staged on every protocol; the old one stays while a request runs on it, then goes.
    let mut on_v1 = fleet.stream("meow", 3000).await;
    read_tokens(&mut on_v1, &mut Received::default(), 4).await;
    assert_eq!(fleet.load("meow", "woof").await.expect("swap"), 2);
    for worker in &fleet.workers {
        let held = worker.loras().await;
        assert!(held.contains("meow@1") && held.contains("meow@2"), "{:?}: {held:?}", worker.kind);
    }
    let swapped = read_to_end(fleet.stream("meow", 16).await, Received::default()).await;
    assert!(text(&swapped.tokens).contains("woof") && swapped.segments.iter().all(|s| s.lora_version == 2));
    drop(on_v1);
    eventually_within("meow@1 is unloaded from every worker", PATIENCE, || async {
        !fleet.held_anywhere().await.contains("meow@1")
    })
    .await;

    // Several seeded samples of one request spread over the protocols, reproducibly (sequence i uses seed + i
    // whichever worker runs it), with the prompt's logprobs first (the unscored first one NaN).
    let seeded = pb::SampleRequest {
        num_samples: 3,
        include_prompt_logprobs: true,
        sampling_params: Some(pb::SamplingParams {
            max_tokens: Some(24),
            temperature: 1.0,
            seed: Some(11),
            ..Default::default()
        }),
        ..request("woof", 24)
    };
    let first = fleet.sampler().sample(seeded.clone()).await.expect("Sample").into_inner();
    let again = fleet.sampler().sample(seeded).await.expect("Sample").into_inner();
    assert_eq!(first.prompt_logprobs.len(), PROMPT.len());
    assert!(first.prompt_logprobs[0].is_nan() && first.prompt_logprobs[1..].iter().all(|l| l.is_finite() && *l <= 0.0));
    let tokens = |response: &pb::SampleResponse| -> Vec<Vec<u32>> {
        response.sequences.iter().map(|s| s.token_ids.clone()).collect()
    };
    assert_eq!(tokens(&first), tokens(&again), "the same seed gives the same tokens");
    assert!(first.sequences.iter().all(|s| s.token_ids.len() == 24 && s.logprobs.len() == 24));

    // An HTTP worker killed mid-sample: its sample ends ABORT with every token it produced; the others run on.
    let mut running = Vec::new();
    for _ in 0..3 {
        let mut stream = fleet.stream("meow", 3000).await;
        let mut received = Received::default();
        read_tokens(&mut stream, &mut received, 4).await;
        running.push(tokio::spawn(read_to_end(stream, received)));
    }
    let victim = fleet.workers[1].url();
    assert_eq!(fleet.worker(&victim).await.expect("listed").in_flight, 1, "one sample per worker");
    fleet.workers[1].process.kill();
    eventually("the killed worker's sample came back", || async {
        running.iter().filter(|sample| sample.is_finished()).count() == 1
    })
    .await;
    let (done, survivors): (Vec<_>, Vec<_>) = running.into_iter().partition(|sample| sample.is_finished());
    for sample in done {
        let sample = sample.await.expect("reader");
        assert_eq!(sample.finish, Some(FinishReason::Abort));
        assert!(sample.tokens.len() >= 4 && sample.covered() as usize == sample.tokens.len(), "{sample:?}");
    }
    eventually("the killed worker is UNHEALTHY", || fleet.in_state(&victim, pb::WorkerState::Unhealthy)).await;
    let fresh = fleet.sampler().sample(request("meow", 16)).await.expect("new samples succeed").into_inner();
    assert_eq!(fresh.sequences[0].token_ids.len(), 16);
    fleet.abort("meow").await;
    for sample in survivors {
        assert_eq!(sample.await.expect("reader").finish, Some(FinishReason::Abort));
    }
    fleet.resume("meow").await;

    // Restarted on its address, it comes back caught up (after its back-off and probation).
    fleet.workers[1].restart();
    eventually_within("the restarted worker is READY", PATIENCE, || fleet.in_state(&victim, pb::WorkerState::Ready))
        .await;
    assert_eq!(fleet.workers[1].loras().await, BTreeSet::from(["meow@2".to_owned(), "woof@1".to_owned()]));

    // Every front works over the fleet: HTTP completions too.
    let url = format!("http://{}/v1/completions", fleet.serve.field("http_addr"));
    let body = serde_json::json!({"model": "woof", "prompt": "Make a single short animal noise.", "max_tokens": 12,
        "temperature": 0.0});
    let answer: serde_json::Value =
        reqwest::Client::new().post(url).json(&body).send().await.expect("post").json().await.expect("json");
    assert!(answer["choices"][0]["text"].as_str().is_some_and(|t| t.contains("woof")), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_hands_back_its_samples_comes_back_caught_up_and_workers_can_be_drained_and_added() {
    let workers = (0..3).map(|_| Worker::start(Kind::Grpc, None, 0)).collect();
    let mut fleet = Fleet::start(workers, None).await;

    // Six raw samples (two per worker) and three through the retry client (one per worker).
    let mut raws = Vec::new();
    for _ in 0..6 {
        let mut stream = fleet.stream("meow", 3000).await;
        let mut received = Received::default();
        read_tokens(&mut stream, &mut received, 4).await;
        raws.push(tokio::spawn(read_to_end(stream, received)));
    }
    let retried: Vec<_> = (0..3)
        .map(|_| {
            let client = SamplingClient::new(fleet.channel.clone(), "meow");
            tokio::spawn(async move {
                let params = pb::SamplingParams { max_tokens: Some(1500), ignore_eos: true, ..Default::default() };
                client.sample(PROMPT.iter().map(|&b| u32::from(b)).collect(), params, 1).await
            })
        })
        .collect();
    eventually("three sequences run on every worker", || async {
        fleet.workers().await.workers.iter().all(|w| w.in_flight == 3)
    })
    .await;

    // SIGKILL mid-sample: its raw samples come back aborted with their tokens, the retry client finishes its one
    // on the others, the worker turns UNHEALTHY, and new samples succeed.
    let victim = fleet.workers[0].url();
    fleet.workers[0].process.kill();
    eventually("the killed worker's two raw samples came back", || async {
        raws.iter().filter(|raw| raw.is_finished()).count() == 2
    })
    .await;
    let mut running = Vec::new();
    for raw in raws {
        if raw.is_finished() {
            let raw = raw.await.expect("reader");
            assert_eq!(raw.finish, Some(FinishReason::Abort));
            assert!(!raw.tokens.is_empty() && raw.covered() as usize == raw.tokens.len(), "with every token: {raw:?}");
        } else {
            running.push(raw);
        }
    }
    eventually("the killed worker is UNHEALTHY", || fleet.in_state(&victim, pb::WorkerState::Unhealthy)).await;
    assert!(!fleet.worker(&victim).await.expect("listed").last_error.is_empty(), "it says why");
    for retry in retried {
        let response = retry.await.expect("task").expect("the retry client finishes it");
        let sequence = &response.sequences[0];
        assert_eq!((sequence.finish_reason(), sequence.token_ids.len()), (FinishReason::Length, 1500));
        assert_eq!(sequence.segments.iter().map(|s| s.end - s.start).sum::<u32>(), 1500);
    }
    let fresh = fleet.sampler().sample(request("meow", 16)).await.expect("new samples succeed").into_inner();
    assert_eq!(fresh.sequences[0].token_ids.len(), 16);

    // Restarted on the same address, it comes back caught up.
    fleet.workers[0].restart();
    eventually_within("the restarted worker is READY", PATIENCE, || fleet.in_state(&victim, pb::WorkerState::Ready))
        .await;
    assert_eq!(fleet.workers[0].loras().await, BTreeSet::from(["meow@1".to_owned(), "woof@1".to_owned()]));

    // The raw samples on the survivors are handed back by a pause as usual (unless they finished meanwhile).
    let aborted = fleet.abort("meow").await;
    let mut handed_back = 0;
    for raw in running {
        let raw = raw.await.expect("reader");
        match raw.finish {
            Some(FinishReason::Abort) => handed_back += 1,
            Some(FinishReason::Length) => assert_eq!(raw.tokens.len(), 3000),
            other => panic!("unexpected finish {other:?}"),
        }
    }
    assert_eq!(aborted.aborted_count, handed_back, "{aborted:?}");
    fleet.resume("meow").await;

    // RemoveWorker with drain: no new traffic, it leaves once its running samples ended.
    let mut long = Vec::new();
    for _ in 0..3 {
        let mut stream = fleet.stream("meow", 3000).await;
        let mut received = Received::default();
        read_tokens(&mut stream, &mut received, 4).await;
        long.push(tokio::spawn(read_to_end(stream, received)));
    }
    let leaving = fleet.workers[1].url();
    assert_eq!(fleet.worker(&leaving).await.expect("listed").in_flight, 1, "one sample per worker");
    let epoch = fleet.workers().await.epoch;
    let mut client = fleet.fleet();
    let removal = tokio::spawn({
        let leaving = leaving.clone();
        async move { client.remove_worker(pb::RemoveWorkerRequest { address: leaving, drain: true }).await }
    });
    eventually("the worker is DRAINING", || fleet.in_state(&leaving, pb::WorkerState::Draining)).await;
    let mut routed_elsewhere = fleet.stream("meow", 3000).await;
    read_tokens(&mut routed_elsewhere, &mut Received::default(), 4).await;
    assert_eq!(fleet.worker(&leaving).await.expect("listed").in_flight, 1, "no new traffic while draining");
    assert!(!removal.is_finished(), "the removal waits for its running sample");
    drop(routed_elsewhere);
    fleet.abort("meow").await;
    removal.await.expect("task").expect("removed once drained");
    let listed = fleet.workers().await;
    assert!(listed.workers.iter().all(|w| w.address != leaving) && listed.epoch >= epoch + 2, "{listed:?}");
    for sample in long {
        assert_eq!(sample.await.expect("reader").finish, Some(FinishReason::Abort));
    }
    fleet.resume("meow").await;

    // The fleet's engine cannot park: a keep pause asking to reuse keys and values applies RECOMPUTE, and says so.
    let reuse = pb::AbortLoraRequestsRequest {
        lora_name: "meow".into(),
        mode: pb::PauseMode::Keep.into(),
        kv_policy: pb::KvPolicy::Reuse.into(),
        ..Default::default()
    };
    let answer = fleet.control().abort_lora_requests(reuse).await.expect("a keep pause").into_inner();
    assert_eq!(answer.kv_policy(), pb::KvPolicy::Recompute);
    fleet.resume("meow").await;

    // AddWorker: it joins, catches up, and serves.
    fleet.fleet().add_worker(pb::AddWorkerRequest { address: leaving.clone() }).await.expect("AddWorker");
    eventually_within("the added worker is READY", PATIENCE, || fleet.in_state(&leaving, pb::WorkerState::Ready)).await;
    assert_eq!(fleet.workers[1].loras().await, BTreeSet::from(["meow@1".to_owned(), "woof@1".to_owned()]));
    let again = fleet.fleet().add_worker(pb::AddWorkerRequest { address: leaving }).await.expect_err("in the fleet");
    assert_eq!(again.code(), Code::AlreadyExists);
    let bad = fleet.fleet().add_worker(pb::AddWorkerRequest { address: "nowhere".into() }).await.expect_err("bad");
    assert!(bad.code() == Code::InvalidArgument && bad.message().contains("address"), "{bad:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_coordinator_restarted_on_its_state_dir_restores_its_adapters_on_the_workers_from_absolute_paths() {
    let root = adapter_root();
    let state = tempfile::tempdir().expect("state dir");
    let workers =
        vec![Worker::start(Kind::Grpc, Some(root.path()), 0), Worker::start(Kind::SglangHttp, Some(root.path()), 0)];
    let mut fleet = Fleet::start_recorded(workers, Some(root.path()), Some(state.path())).await;

    // A trainer's loads by paths relative to the adapter root: a new adapter, and a swap that retires meow@1.
    assert_eq!(fleet.load("bark", "woof").await.expect("load"), 1);
    assert_eq!(fleet.load("meow", "woof").await.expect("swap"), 2);
    eventually_within("meow@1 is unloaded from every worker", PATIENCE, || async {
        !fleet.held_anywhere().await.contains("meow@1")
    })
    .await;
    let recorded = fleet.adapters().await;
    assert_eq!(recorded, [("bark".to_owned(), 1), ("meow".to_owned(), 2), ("woof".to_owned(), 1)]);

    // Killed and started again on its state directory: the same adapters at the same versions, staged on every
    // worker from the absolute paths it recorded.
    fleet.restart_coordinator().await;
    assert_eq!(fleet.adapters().await, recorded);
    let expected: BTreeSet<String> = ["bark@1", "meow@2", "woof@1"].map(str::to_owned).into();
    eventually_within("every worker is READY with the restored adapters", PATIENCE, || async {
        let listed = fleet.workers().await.workers;
        listed.len() == 2
            && listed.iter().all(|worker| {
                worker.state() == pb::WorkerState::Ready
                    && worker.adapters.iter().cloned().collect::<BTreeSet<_>>() == expected
            })
    })
    .await;
    let woof = root.path().join("woof").display().to_string();
    let on_the_wire = fleet.workers[0].lora_paths().await;
    assert_eq!(on_the_wire, expected.iter().map(|name| (name.clone(), woof.clone())).collect(), "absolute paths");
    assert_eq!(fleet.workers[1].loras().await, expected);
    let sampled = fleet.sampler().sample(request("bark", 16)).await.expect("Sample").into_inner();
    assert!(text(&sampled.sequences[0].token_ids).contains("woof"), "bark serves woof's weights");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_keys_serves_a_coordinator_presenting_its_admin_key_and_refuses_anyone_else() {
    let keys = ["--api-key", "k-api", "--admin-key", "k-admin"];
    let worker = Worker::start_with(Kind::Grpc, None, 0, &keys);
    let mut control =
        vllm_proto::control_client::ControlClient::new(channel(&format!("http://127.0.0.1:{}", worker.port)).await);
    let load = vllm_proto::LoadLoraRequest { lora_name: "meow@9".into(), source_path: "meow".into() };
    let refused = control.load_lora(load).await.expect_err("no key");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let refused = control.shutdown(vllm_proto::ShutdownRequest {}).await.expect_err("no key");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

    // The coordinator presents --worker-key on every call: the worker joins, the adapters are staged, samples run.
    let url = worker.url();
    let args = ["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--state-dir", "none"];
    let args: Vec<&str> = args.into_iter().chain(["--worker", &url, "--worker-key", "k-admin"]).collect();
    let serve = Spawned::start(&args);
    assert_eq!(serve.ready["adapters"], serde_json::json!(["meow", "woof"]), "{}", serve.ready);
    let coordinator = channel(&format!("http://{}", serve.field("grpc_addr"))).await;
    let sampled = SamplerClient::new(coordinator).sample(request("meow", 16)).await.expect("Sample").into_inner();
    assert!(text(&sampled.sequences[0].token_ids).contains("meow"), "{:?}", text(&sampled.sequences[0].token_ids));
}

#[test]
fn a_python_grpcio_client_generated_from_vllm_protos_drives_a_worker() {
    let worker = Worker::start(Kind::Grpc, None, 0);
    // Offline and for this platform only: everything it reads was downloaded by the build; nothing is fetched now.
    let version = Command::new(env!("CARGO")).arg("-vV").output().expect("cargo -vV runs");
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    let host = version.lines().find_map(|line| line.strip_prefix("host: ")).expect("cargo names its host");
    let metadata = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline", "--filter-platform", host])
        .current_dir(repo_root())
        .output();
    let metadata = metadata.expect("cargo metadata runs");
    assert!(metadata.status.success(), "{}", String::from_utf8_lossy(&metadata.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout).expect("JSON");
    let manifest = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|package| package["name"] == "vllm-proto")
        .and_then(|package| package["manifest_path"].as_str())
        .expect("vllm-proto is a dependency");
    let proto_dir = Path::new(manifest).parent().expect("the crate's directory");
    assert!(proto_dir.join("inference.proto").is_file(), "{}", proto_dir.display());

    let python = std::env::var("LORAGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let output = Command::new(&python)
        .arg(repo_root().join("tests/python/vllm_worker_grpc.py"))
        .arg(format!("127.0.0.1:{}", worker.port))
        .arg(proto_dir)
        .output()
        .unwrap_or_else(|err| panic!("cannot run {python}: {err}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "vllm_worker_grpc.py failed ({}):\n{stdout}\n{stderr}", output.status);
    assert!(stdout.contains("ok: vllm_worker_grpc"), "{stdout}\n{stderr}");
}
