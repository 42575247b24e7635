//! Fleet benchmarks (issues 10 and 18), the coordinator over workers on 127.0.0.1, each on its own thread and
//! runtime: `loragate worker` servers (gRPC), and `loragate serve`'s HTTP front as vLLM and SGLang HTTP workers:
//! - aborting 1,000 in-flight requests spread over 3 workers until every one was handed back, over 3 gRPC workers,
//!   over 3 workers of mixed protocols (gRPC, vLLM HTTP, SGLang HTTP), over 3 vLLM HTTP and over 3 SGLang HTTP
//!   workers (scripted engines: the fleet's abort path, the batched abort calls and the abort acknowledgements, not
//!   a model);
//! - tokens/s of 32 concurrent samples (64 greedy tokens each, the demo model's `meow`) through the coordinator and
//!   the fleet engine vs straight to the same worker, over gRPC (vLLM's `GenerateStream`) and over vLLM's HTTP
//!   (`/inference/v1/generate`, streamed);
//! - the time from a worker's death to the hand-back of the last of its samples (scripted engines).
//!
//! `RAYON_NUM_THREADS=1 cargo bench -p loragate-benches --bench fleet` (the mixed abort holds about 1,400 sockets
//! open: `ulimit -n` 4096 or more).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use futures::StreamExt;
use loragate_benches::{ThreadHttpWorker, ThreadWorker};
use loragate_core::testing::ScriptedEngine;
use loragate_core::{
    AdapterName, AdapterSource, Coordinator, CoordinatorConfig, Engine, FinishReason, RawSampleRequest, SampleEvent,
};
use loragate_core::{FleetControl, WorkerState};
use loragate_engine::{CandleEngine, EngineConfig, ensure_demo_files};
use loragate_fleet::{FleetConfig, FleetEngine, WorkerAddress};
use tokio::runtime::Runtime;
use vllm_proto as pb;

const PROMPT: &[u8] = b"Make a single short animal noise.";

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// A fleet over the workers at `urls` with a coordinator in front, `adapter` loaded from `path` (absolute: the
/// workers' adapter root).
async fn fleet_over(
    urls: &[String],
    info: loragate_core::ModelInfo,
    adapter: &str,
    path: &Path,
) -> (Arc<FleetEngine>, Coordinator) {
    let addresses = urls.iter().map(|url| WorkerAddress::parse(url).expect("address")).collect();
    let config = FleetConfig { health_interval: Duration::from_millis(200), ..FleetConfig::default() };
    let fleet = Arc::new(FleetEngine::start(info, addresses, config).await.expect("fleet"));
    fleet.wait_ready().await.expect("ready");
    let coordinator = Coordinator::start(fleet.clone(), CoordinatorConfig::default()).await.expect("coordinator");
    let name = AdapterName::parse(adapter).expect("name");
    coordinator.load_adapter(&name, AdapterSource::trusted(path)).await.expect("load");
    (fleet, coordinator)
}

fn raw(lora_name: &str, max_tokens: u32) -> RawSampleRequest {
    RawSampleRequest {
        lora_name: lora_name.into(),
        prompt_token_ids: PROMPT.iter().map(|&b| u32::from(b)).collect(),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Default::default()
    }
}

/// Starts `count` samples that hold after their first token; each is read by a task that reports its first token
/// and answers when (and how) it ended.
async fn start_held_samples(
    coordinator: &Coordinator,
    count: usize,
) -> Vec<tokio::task::JoinHandle<(Instant, FinishReason)>> {
    let (first_tokens, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let mut readers = Vec::with_capacity(count);
    for _ in 0..count {
        let request = coordinator.parse_sample(raw("bench", 1000)).expect("valid");
        let mut stream = coordinator.sample(request, coordinator.gate_deadline(None)).await.expect("admitted");
        let first_tokens = first_tokens.clone();
        readers.push(tokio::spawn(async move {
            while let Some(event) = stream.next().await {
                match event.expect("no error") {
                    SampleEvent::Tokens { .. } => {
                        let _ = first_tokens.send(());
                    }
                    SampleEvent::Finished { reason, .. } => return (Instant::now(), reason),
                    SampleEvent::PromptLogprobs(_) | SampleEvent::PromptTopLogprobs(_) => {}
                }
            }
            panic!("the stream ended without finishing");
        }));
    }
    for _ in 0..count {
        seen.recv().await.expect("a first token");
    }
    readers
}

/// An adapter root (canonical) with one adapter directory, `bench`.
fn bench_root() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("bench")).expect("adapter dir");
    let root = std::fs::canonicalize(dir.path()).expect("canonical");
    (dir, root)
}

fn abort_1000_over_3_workers(c: &mut Criterion) {
    let (_dir, root) = bench_root();
    let scripted = || -> Arc<dyn Engine> { Arc::new(ScriptedEngine::new(1)) };
    let grpc: Vec<ThreadWorker> = (0..3).map(|_| ThreadWorker::start(scripted(), &root, 0)).collect();
    let urls: Vec<String> = grpc.iter().map(|worker| worker.url.clone()).collect();
    abort_1000_over(c, "abort_1000_in_flight_over_3_grpc_workers_until_handed_back", &urls, &root);
    drop(grpc);

    let grpc = ThreadWorker::start(scripted(), &root, 0);
    let (vllm, sglang) = (ThreadHttpWorker::start(scripted(), &root, 0), ThreadHttpWorker::start(scripted(), &root, 0));
    let urls = [
        grpc.url.clone(),
        format!("vllm+http://127.0.0.1:{}", vllm.port),
        format!("sglang+http://127.0.0.1:{}", sglang.port),
    ];
    abort_1000_over(
        c,
        "abort_1000_in_flight_over_grpc_vllm_http_and_sglang_http_workers_until_handed_back",
        &urls,
        &root,
    );
    drop((grpc, vllm, sglang));

    // One protocol at a time over the same three HTTP servers, to tell the protocols' shares apart.
    let http: Vec<ThreadHttpWorker> = (0..3).map(|_| ThreadHttpWorker::start(scripted(), &root, 0)).collect();
    for (scheme, protocol) in [("vllm+http", "vllm_http"), ("sglang+http", "sglang_http")] {
        let urls: Vec<String> = http.iter().map(|worker| format!("{scheme}://127.0.0.1:{}", worker.port)).collect();
        abort_1000_over(c, &format!("abort_1000_in_flight_over_3_{protocol}_workers_until_handed_back"), &urls, &root);
    }
}

/// Aborting 1,000 held requests spread over the workers at `urls` until every one was handed back.
fn abort_1000_over(c: &mut Criterion, name: &str, urls: &[String], root: &Path) {
    const IN_FLIGHT: usize = 1000;
    let runtime = runtime();
    let info = ScriptedEngine::new(1).model_info().clone();
    let (_fleet, coordinator) = runtime.block_on(fleet_over(urls, info, "bench", &root.join("bench")));
    let adapter = AdapterName::parse("bench").expect("name");
    let mut group = c.benchmark_group("fleet_abort");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    group.bench_function(name, |b| {
        b.iter_custom(|iterations| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    let readers = start_held_samples(&coordinator, IN_FLIGHT).await;
                    let started = Instant::now();
                    let report = coordinator.abort(&adapter).await.expect("abort");
                    total += started.elapsed();
                    assert_eq!((report.aborted.len(), report.unacknowledged.len()), (IN_FLIGHT, 0));
                    coordinator.resume(&adapter, None).await.expect("resume");
                    for reader in readers {
                        assert_eq!(reader.await.expect("reader").1, FinishReason::Abort);
                    }
                }
                total
            })
        });
    });
    group.finish();
}

/// What the fleet sends for one greedy `meow` sequence, sent straight to the worker.
fn direct_request(new_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        request_id: loragate_core::RequestId::generate().to_string(),
        lora_name: "meow@1".into(),
        prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds {
            ids: PROMPT.iter().map(|&b| u32::from(b)).collect(),
        })),
        temperature: Some(0.0),
        stopping: Some(pb::StoppingCriteria { max_new_tokens: new_tokens, ignore_eos: true, ..Default::default() }),
        response: Some(pb::ResponseOptions { output_token_ids: true, output_logprobs: true, ..Default::default() }),
        ..Default::default()
    }
}

/// How a benchmark reaches a worker without the coordinator.
enum Direct {
    /// vLLM's `GenerateStream` on this channel.
    Grpc(tonic::transport::Channel),
    /// vLLM's `/inference/v1/generate`, streamed, at this base URL.
    Http(reqwest::Client, String),
}

fn tokens_32_through_the_coordinator_vs_direct(c: &mut Criterion) {
    let files = ensure_demo_files(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("loragate-cache")).expect("demo");
    let root = std::fs::canonicalize(&files.adapters_dir).expect("canonical");
    let demo = || CandleEngine::load(&files.model_dir, EngineConfig::default()).expect("demo model");
    let runtime = runtime();

    let engine = demo();
    let info = engine.model_info().clone();
    let worker = ThreadWorker::start(Arc::new(engine), &root, 0);
    let (fleet, coordinator) =
        runtime.block_on(fleet_over(std::slice::from_ref(&worker.url), info, "meow", &root.join("meow")));
    let http_base = worker.url.replace("grpc://", "http://");
    let channel = runtime.block_on(async {
        tonic::transport::Channel::from_shared(http_base).expect("uri").connect().await.expect("connect")
    });
    tokens_through_vs_direct(c, &runtime, "grpc", &coordinator, &Direct::Grpc(channel));
    drop((coordinator, fleet, worker));

    let engine = demo();
    let info = engine.model_info().clone();
    let worker = ThreadHttpWorker::start(Arc::new(engine), &root, 0);
    let url = format!("vllm+http://127.0.0.1:{}", worker.port);
    let (_fleet, coordinator) = runtime.block_on(fleet_over(&[url], info, "meow", &root.join("meow")));
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    tokens_through_vs_direct(c, &runtime, "vllm_http", &coordinator, &Direct::Http(client, worker.base()));
}

/// 32 samples × 64 greedy tokens of `meow` through the coordinator vs straight to its one worker.
fn tokens_through_vs_direct(
    c: &mut Criterion,
    runtime: &Runtime,
    protocol: &str,
    coordinator: &Coordinator,
    direct: &Direct,
) {
    const SAMPLES: usize = 32;
    const NEW_TOKENS: u32 = 64;
    let mut group = c.benchmark_group(format!("fleet_tokens_{protocol}"));
    group.sample_size(10).measurement_time(Duration::from_secs(15));
    group.throughput(Throughput::Elements(SAMPLES as u64 * u64::from(NEW_TOKENS)));
    // Both paths read each sample on its own task, as separate callers would.
    group.bench_function("32_samples_through_the_coordinator", |b| {
        b.to_async(runtime).iter(|| through_the_coordinator(coordinator, SAMPLES, NEW_TOKENS));
    });
    group.bench_function("32_samples_straight_to_the_worker", |b| {
        b.to_async(runtime).iter(|| straight_to_the_worker(direct, SAMPLES, NEW_TOKENS));
    });
    group.finish();

    // The machine is shared: alternate the two paths round by round, so both see the same load, and report the
    // median of the per-round ratio as well.
    const ROUNDS: usize = 20;
    let tokens = (SAMPLES as u32 * NEW_TOKENS) as f64;
    let (mut via, mut straight_to, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    runtime.block_on(async {
        for round in 0..ROUNDS {
            // Whichever path runs second in a round measures faster: swap the order every round.
            let (mut through, mut straight) = (0.0, 0.0);
            for path in 0..2 {
                let started = Instant::now();
                if (path + round) % 2 == 0 {
                    through_the_coordinator(coordinator, SAMPLES, NEW_TOKENS).await;
                    through = tokens / started.elapsed().as_secs_f64();
                } else {
                    straight_to_the_worker(direct, SAMPLES, NEW_TOKENS).await;
                    straight = tokens / started.elapsed().as_secs_f64();
                }
            }
            via.push(through);
            straight_to.push(straight);
            ratios.push(through / straight);
        }
    });
    println!(
        "fleet_tokens_{protocol} interleaved ({ROUNDS} rounds): through the coordinator {:.0} tokens/s, straight to \
         the worker {:.0} tokens/s, median ratio {:.1} %",
        median(&mut via),
        median(&mut straight_to),
        100.0 * median(&mut ratios)
    );
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn through_the_coordinator(coordinator: &Coordinator, samples: usize, new_tokens: u32) {
    let samples: Vec<_> = (0..samples)
        .map(|_| {
            let coordinator = coordinator.clone();
            tokio::spawn(async move {
                let request = coordinator.parse_sample(raw("meow", new_tokens)).expect("valid");
                let stream = coordinator.sample(request, coordinator.gate_deadline(None)).await.expect("admitted");
                let output = stream.collect_output().await.expect("output");
                assert_eq!(output.sequences[0].token_ids.len(), new_tokens as usize);
            })
        })
        .collect();
    for sample in samples {
        sample.await.expect("sample task");
    }
}

async fn straight_to_the_worker(direct: &Direct, samples: usize, new_tokens: u32) {
    let samples: Vec<_> = (0..samples)
        .map(|_| match direct {
            Direct::Grpc(channel) => {
                let mut client = pb::inference_client::InferenceClient::new(channel.clone());
                tokio::spawn(async move {
                    let mut stream =
                        client.generate_stream(direct_request(new_tokens)).await.expect("stream").into_inner();
                    let mut tokens = 0;
                    while let Some(message) = stream.message().await.expect("message") {
                        tokens += message.outputs.map_or(0, |output| output.token_ids.len());
                    }
                    assert_eq!(tokens, new_tokens as usize);
                })
            }
            Direct::Http(client, base) => {
                let request = client.post(format!("{base}/inference/v1/generate")).json(&serde_json::json!({
                    "token_ids": PROMPT.iter().map(|&b| u32::from(b)).collect::<Vec<u32>>(),
                    "model": "meow@1",
                    "stream": true,
                    "sampling_params": {"max_tokens": new_tokens, "temperature": 0.0, "logprobs": 0, "ignore_eos": true},
                }));
                tokio::spawn(async move {
                    let response = request.send().await.expect("send");
                    assert!(response.status().is_success(), "{}", response.status());
                    let mut body = response.bytes_stream();
                    let (mut pending, mut tokens) = (Vec::new(), 0);
                    while let Some(chunk) = body.next().await {
                        pending.extend_from_slice(&chunk.expect("chunk"));
                        while let Some(end) = pending.windows(2).position(|pair| pair == b"\n\n") {
                            let event: Vec<u8> = pending.drain(..end + 2).collect();
                            let Some(data) = event.strip_prefix(b"data: ") else { continue };
                            if let Ok(chunk) = serde_json::from_slice::<serde_json::Value>(data) {
                                tokens += chunk["choices"][0]["token_ids"].as_array().map_or(0, Vec::len);
                            }
                        }
                    }
                    assert_eq!(tokens, new_tokens as usize);
                })
            }
        })
        .collect();
    for sample in samples {
        sample.await.expect("sample task");
    }
}

fn worker_death_to_last_hand_back(c: &mut Criterion) {
    const SAMPLES: usize = 30;
    let runtime = runtime();
    let (_dir, root) = bench_root();
    let mut workers: Vec<ThreadWorker> =
        (0..3).map(|_| ThreadWorker::start(Arc::new(ScriptedEngine::new(1)), &root, 0)).collect();
    let info = ScriptedEngine::new(1).model_info().clone();
    let urls: Vec<String> = workers.iter().map(|worker| worker.url.clone()).collect();
    let (fleet, coordinator) = runtime.block_on(fleet_over(&urls, info, "bench", &root.join("bench")));
    let name = AdapterName::parse("bench").expect("name");

    let mut group = c.benchmark_group("fleet_worker_death");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    group.bench_function("worker_death_to_last_sample_handed_back", |b| {
        b.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                let victim_url = workers[0].url.clone();
                let readers = runtime.block_on(start_held_samples(&coordinator, SAMPLES));
                let on_victim = fleet
                    .snapshot()
                    .workers
                    .iter()
                    .find(|w| w.address == victim_url)
                    .map_or(0, |w| w.in_flight as usize);
                assert_eq!(on_victim, SAMPLES / 3, "the samples spread evenly");
                // The death: the worker's runtime and every connection it had go (kill returns once they went).
                let died = Instant::now();
                workers[0].kill();
                let (ended, others) = runtime.block_on(async {
                    let mut ended = Vec::new();
                    let mut others = Vec::new();
                    let mut readers = readers;
                    while ended.len() < on_victim {
                        let (done, waiting): (Vec<_>, Vec<_>) = readers.into_iter().partition(|r| r.is_finished());
                        for reader in done {
                            ended.push(reader.await.expect("reader"));
                        }
                        readers = waiting;
                        tokio::time::sleep(Duration::from_micros(200)).await;
                    }
                    others.extend(readers);
                    (ended, others)
                });
                let last = ended.iter().map(|(at, _)| *at).max().expect("ended");
                assert!(ended.iter().all(|(_, reason)| *reason == FinishReason::Abort));
                total += last.saturating_duration_since(died);

                runtime.block_on(async {
                    coordinator.abort(&name).await.expect("abort the others");
                    coordinator.resume(&name, None).await.expect("resume");
                    for reader in others {
                        reader.await.expect("reader");
                    }
                });
                let port = workers[0].port;
                workers[0] = ThreadWorker::start(Arc::new(ScriptedEngine::new(1)), &root, port);
                runtime.block_on(async {
                    while !fleet.snapshot().workers.iter().all(|w| w.state == WorkerState::Ready) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                });
            }
            total
        });
    });
    group.finish();
}

// What `criterion_group!`/`criterion_main!` expand to, minus their undocumented public function.
fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    abort_1000_over_3_workers(&mut criterion);
    tokens_32_through_the_coordinator_vs_direct(&mut criterion);
    worker_death_to_last_hand_back(&mut criterion);
    criterion.final_summary();
}
