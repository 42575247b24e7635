//! The bounded loopback soak (issue 13): hundreds of concurrent samplers over four adapters on the real demo model,
//! while a trainer pauses, swaps and resumes them, clients walk away mid-request, and adapters are loaded and
//! unloaded under live traffic. At the end nothing may be lost or hung, every counter is back to 0, memory is back
//! near where it started, and every listed adapter still samples.
//!
//! [`SoakConfig::short`] runs in CI (well under two minutes); [`SoakConfig::long`] is the documented long form
//! (`LORAGATE_SOAK_SECS=600 cargo test -p loragate-tests --test integration soak:: -- --ignored --nocapture`), whose
//! figures are in `docs/benchmarks.md`.
//!
//! What runs at once:
//! - `samplers` retry clients ([`SamplingClient`]), each on one of the four adapters, sampling `max_tokens` tokens
//!   again and again over gRPC (spread over several connections); every sample must come back finished (never
//!   `ABORT`) with exactly its budget of tokens and segments covering them, across any number of pauses;
//! - every tenth request of a sampler instead walks away after a few milliseconds (held, queued or running);
//! - `http_clients` clients on the HTTP front, half of them dropping their streamed completion after the first
//!   chunk (a 429 is an allowed answer: HTTP clients do not retry);
//! - a trainer cycling over the adapters and the pause modes: abort (with a weight load while paused), keep (the
//!   requests continue server-side when the adapter reopens), wait (drain), and the atomic `SwapLoraAdapter`;
//! - a churn loop loading a fresh adapter, sampling it and unloading it while those samples run;
//! - the server's in-flight cap is below the number of samplers, so overload (RESOURCE_EXHAUSTED, retried by the
//!   clients with backoff) is part of the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use loragate_client::{RetryPolicy, SamplingClient};
use loragate_proto::v1::{self as pb, FinishReason};
use rand::Rng;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;

use loragate_core::testing::eventually_within as eventually;
use loragate_tests::{DemoServer, PATIENCE, PROMPT, copy_dir, tokens};

/// The four adapters every sampler and the trainer work on (two are loaded at start from copies of the demo's).
pub(crate) const ADAPTERS: [&str; 4] = ["meow", "woof", "meow-b", "woof-b"];

/// How long and how hard the soak runs.
#[derive(Clone, Debug)]
pub(crate) struct SoakConfig {
    /// Concurrent gRPC samplers (retry clients).
    pub(crate) samplers: usize,
    /// Concurrent HTTP clients.
    pub(crate) http_clients: usize,
    /// Tokens each sample asks for.
    pub(crate) max_tokens: u32,
    /// The server's `--max-in-flight` (below `samplers`, so that overload happens).
    pub(crate) max_in_flight: u32,
    /// How long the load runs before the baseline is measured.
    pub(crate) warm_up: Duration,
    /// How long the measured load runs.
    pub(crate) duration: Duration,
}

impl SoakConfig {
    /// The CI form: 512 samplers and 32 HTTP clients for 30 s after a 6 s warm-up.
    pub(crate) fn short() -> Self {
        Self {
            samplers: 512,
            http_clients: 32,
            max_tokens: 6,
            max_in_flight: 384,
            warm_up: Duration::from_secs(6),
            duration: Duration::from_secs(30),
        }
    }

    /// The long form: the short form's load for `duration`.
    pub(crate) fn long(duration: Duration) -> Self {
        Self { duration, warm_up: Duration::from_secs(20), ..Self::short() }
    }
}

/// What a soak did.
#[derive(Clone, Debug, Default)]
// Its fields are read through `Debug` (the test prints the report).
#[allow(dead_code)]
pub(crate) struct SoakReport {
    /// Samples that came back finished through the retry client.
    pub(crate) samples_finished: u64,
    /// Of those, samples whose tokens came from more than one adapter version (a swap happened mid-sample).
    pub(crate) samples_across_swaps: u64,
    /// Requests whose client walked away mid-request.
    pub(crate) walked_away: u64,
    /// HTTP completions answered (200), and refused for overload (429).
    pub(crate) http_answered: u64,
    /// HTTP completions refused with 429.
    pub(crate) http_overloaded: u64,
    /// Pauses by the trainer (abort, keep, wait and swaps).
    pub(crate) pauses: u64,
    /// Weight swaps (loads under a loaded name while paused, and atomic swaps).
    pub(crate) swaps: u64,
    /// Adapters loaded, sampled and unloaded under traffic.
    pub(crate) churned: u64,
    /// Resident memory of the test process after the warm-up, in KiB.
    pub(crate) rss_start_kib: u64,
    /// Resident memory at the end, every request gone, in KiB.
    pub(crate) rss_end_kib: u64,
    /// How long the measured load ran.
    pub(crate) measured_for: Duration,
}

#[derive(Default)]
struct Counters {
    finished: AtomicU64,
    across_swaps: AtomicU64,
    walked_away: AtomicU64,
    http_answered: AtomicU64,
    http_overloaded: AtomicU64,
    pauses: AtomicU64,
    swaps: AtomicU64,
    churned: AtomicU64,
}

/// The resident set size of this process, in KiB.
pub(crate) fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("a VmRSS line");
    line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("VmRSS in kB")
}

/// The soak server's KV cache (`--kv-cache-memory-bytes`): room for every sampler's sequences several times over.
const KV_CACHE_BYTES: u64 = 16 << 20;

/// Runs the soak and checks its invariants (panicking on the first violation); returns its figures.
pub(crate) async fn run(config: SoakConfig) -> SoakReport {
    let demo = DemoServer::start_with(|serve| {
        serve.limits.max_in_flight = config.max_in_flight;
        // On a CPU the KV cache's pages become resident as its blocks are first written, and cached prefixes keep
        // them: up to this many bytes of growth are the cache filling, not a leak (see the memory check below).
        serve.engine.kv_cache_memory_bytes = Some(KV_CACHE_BYTES);
    })
    .await;
    for (name, from) in [("meow-b", "meow"), ("woof-b", "woof")] {
        copy_dir(&demo.adapter_root.join(from), &demo.adapter_root.join(name));
        let load = pb::LoadLoraAdapterRequest { lora_name: name.into(), path: name.into() };
        demo.control().load_lora_adapter(load).await.expect("the extra adapters load");
    }
    // Several connections: one HTTP/2 connection would cap the concurrent streams.
    let mut channels = Vec::new();
    for _ in 0..8 {
        let endpoint = Channel::from_shared(format!("http://{}", demo.server.grpc_addr())).expect("uri");
        channels.push(endpoint.connect().await.expect("connect"));
    }
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    for index in 0..config.samplers {
        let channel = channels[index % channels.len()].clone();
        tasks.push(tokio::spawn(sampler(
            channel,
            ADAPTERS[index % ADAPTERS.len()],
            config.clone(),
            counters.clone(),
            stop.clone(),
        )));
    }
    for index in 0..config.http_clients {
        let url = demo.http_url("/v1/completions");
        let streamed = index % 2 == 1;
        let model = ADAPTERS[index % ADAPTERS.len()];
        tasks.push(tokio::spawn(http_client(url, model, streamed, config.max_tokens, counters.clone(), stop.clone())));
    }
    tasks.push(tokio::spawn(trainer(channels[0].clone(), counters.clone(), stop.clone())));
    tasks.push(tokio::spawn(churn(channels[1].clone(), config.max_tokens, counters.clone(), stop.clone())));

    tokio::time::sleep(config.warm_up).await;
    let rss_start_kib = rss_kib();
    let measured_from = Instant::now();
    tokio::time::sleep(config.duration).await;
    let measured_for = measured_from.elapsed();
    stop.store(true, Ordering::Release);

    // Nothing hangs: every task ends within the patience once told to stop.
    let joined = tokio::time::timeout(PATIENCE, futures::future::join_all(tasks)).await;
    for task in joined.expect("every sampler, client, the trainer and the churn loop stop in time") {
        task.expect("no task panicked: every invariant held");
    }

    // Every counter is back to 0, nothing is paused, and no churned adapter is left.
    let coordinator = demo.server.coordinator();
    eventually("every request is gone from every adapter", PATIENCE, || async {
        let statuses = coordinator.statuses().await;
        statuses.iter().all(|s| (s.in_flight, s.held, s.waiting, s.paused) == (0, 0, 0, false))
            && coordinator.load() == loragate_core::LoadSnapshot::default()
    })
    .await;
    let listed = demo.control().list_lora_adapters(pb::ListLoraAdaptersRequest {}).await.expect("list").into_inner();
    let mut names: Vec<String> = listed.adapters.iter().map(|adapter| adapter.lora_name.clone()).collect();
    names.sort();
    let mut expected: Vec<String> = ADAPTERS.iter().map(|name| (*name).to_owned()).collect();
    expected.sort();
    assert_eq!(names, expected, "exactly the four adapters are listed");

    // Every listed adapter (and the base model) samples.
    for name in names.iter().map(String::as_str).chain([""]) {
        let client = SamplingClient::new(channels[0].clone(), name);
        let params = pb::SamplingParams { max_tokens: Some(config.max_tokens), ..Default::default() };
        let response = client.sample(tokens(PROMPT), params, 1).await.unwrap_or_else(|err| panic!("{name:?}: {err}"));
        assert_eq!(response.sequences[0].finish_reason(), FinishReason::Length, "{name:?}");
    }

    let rss_end_kib = rss_kib();
    let report = SoakReport {
        samples_finished: counters.finished.load(Ordering::Acquire),
        samples_across_swaps: counters.across_swaps.load(Ordering::Acquire),
        walked_away: counters.walked_away.load(Ordering::Acquire),
        http_answered: counters.http_answered.load(Ordering::Acquire),
        http_overloaded: counters.http_overloaded.load(Ordering::Acquire),
        pauses: counters.pauses.load(Ordering::Acquire),
        swaps: counters.swaps.load(Ordering::Acquire),
        churned: counters.churned.load(Ordering::Acquire),
        rss_start_kib,
        rss_end_kib,
        measured_for,
    };
    assert!(report.samples_finished > 0 && report.pauses > 0 && report.churned > 0, "{report:?}");
    assert!(
        report.rss_end_kib * 10 <= report.rss_start_kib * 11 + KV_CACHE_BYTES / 1024 * 10,
        "memory did not come back within 10 % of where it started (plus the KV cache's {} KiB): {report:?}",
        KV_CACHE_BYTES / 1024
    );
    report
}

/// A random duration in `millis` milliseconds (drawn before any await: the thread-local generator is not `Send`).
fn jitter(millis: std::ops::Range<u64>) -> Duration {
    Duration::from_millis(rand::rng().random_range(millis))
}

/// The retry policy of the soak's samplers: pauses come every second or so while hundreds of requests queue, so an
/// attempt is often aborted before its first token; the client keeps going until its deadline.
fn soak_policy() -> RetryPolicy {
    RetryPolicy {
        deadline: Duration::from_secs(120),
        max_attempts_without_progress: u32::MAX,
        ..RetryPolicy::default()
    }
}

async fn sampler(
    channel: Channel,
    adapter: &'static str,
    config: SoakConfig,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    let client = SamplingClient::new(channel.clone(), adapter).with_policy(soak_policy());
    let mut raw = pb::sampler_client::SamplerClient::new(channel);
    let params = pb::SamplingParams { max_tokens: Some(config.max_tokens), ignore_eos: true, ..Default::default() };
    let mut round = 0u64;
    while !stop.load(Ordering::Acquire) {
        round += 1;
        if round.is_multiple_of(10) {
            // Walk away mid-request: held, queued or running, it must leave nothing behind.
            let mut request = tonic::Request::new(pb::SampleRequest {
                lora_name: adapter.into(),
                prompt_token_ids: tokens(PROMPT),
                sampling_params: Some(params.clone()),
                ..Default::default()
            });
            request.set_timeout(jitter(2..60));
            match raw.sample(request).await {
                Ok(_) => {}
                Err(status) => assert!(
                    matches!(
                        status.code(),
                        Code::DeadlineExceeded | Code::Cancelled | Code::Unavailable | Code::ResourceExhausted
                    ),
                    "{adapter}: a walked-away request failed with {status:?}"
                ),
            }
            counters.walked_away.fetch_add(1, Ordering::AcqRel);
            continue;
        }
        let response = client
            .sample(tokens(PROMPT), params.clone(), 1)
            .await
            .unwrap_or_else(|err| panic!("{adapter}: a sample was lost: {err}"));
        let sequence = &response.sequences[0];
        assert_eq!(sequence.finish_reason(), FinishReason::Length, "{adapter}: never handed back unfinished");
        assert_eq!(sequence.token_ids.len(), config.max_tokens as usize, "{adapter}: token-exact across aborts");
        assert_eq!(sequence.logprobs.len(), sequence.token_ids.len(), "{adapter}: one logprob per token");
        let mut next = 0;
        for segment in &sequence.segments {
            assert_eq!(segment.start, next, "{adapter}: segments are contiguous: {:?}", sequence.segments);
            next = segment.end;
        }
        assert_eq!(next as usize, sequence.token_ids.len(), "{adapter}: segments cover every token");
        counters.finished.fetch_add(1, Ordering::AcqRel);
        if sequence.segments.len() > 1 {
            counters.across_swaps.fetch_add(1, Ordering::AcqRel);
        }
    }
}

async fn http_client(
    url: String,
    model: &'static str,
    streamed: bool,
    max_tokens: u32,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    let body = serde_json::json!({"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "stream": streamed});
    while !stop.load(Ordering::Acquire) {
        let response = client.post(&url).json(&body).send().await.expect("the HTTP front answers");
        match response.status().as_u16() {
            200 if streamed => {
                // Walk away after the first chunk.
                let mut chunks = response.bytes_stream();
                let first = chunks.next().await.expect("a first chunk").expect("readable");
                assert!(!first.is_empty());
                counters.walked_away.fetch_add(1, Ordering::AcqRel);
                counters.http_answered.fetch_add(1, Ordering::AcqRel);
            }
            200 => {
                let answer: serde_json::Value = response.json().await.expect("json");
                let reason = answer["choices"][0]["finish_reason"].as_str().unwrap_or_default().to_owned();
                assert!(["length", "abort", "stop"].contains(&reason.as_str()), "{answer}");
                counters.http_answered.fetch_add(1, Ordering::AcqRel);
            }
            429 => {
                counters.http_overloaded.fetch_add(1, Ordering::AcqRel);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("{model}: HTTP {other}: {:?}", response.text().await),
        }
    }
}

/// Pauses and resumes the adapters in turn, cycling through the pause modes (abort with a weight load while paused,
/// keep, wait) and the atomic swap; always leaves them open.
async fn trainer(channel: Channel, counters: Arc<Counters>, stop: Arc<AtomicBool>) {
    let mut control = pb::lora_control_client::LoraControlClient::new(channel);
    let mut turn = 0usize;
    while !stop.load(Ordering::Acquire) {
        let adapter = ADAPTERS[turn % ADAPTERS.len()];
        let step = turn / ADAPTERS.len() % 4;
        turn += 1;
        if step == 3 {
            // The atomic swap: pause (keep, parking the kept sequences where the engine can), load, reopen, in one call.
            let swap = pb::SwapLoraAdapterRequest {
                lora_name: adapter.into(),
                path: adapter.into(),
                mode: 0,
                kv_policy: pb::KvPolicy::Reuse.into(),
            };
            control.swap_lora_adapter(swap).await.expect("an atomic swap");
            counters.swaps.fetch_add(1, Ordering::AcqRel);
            counters.pauses.fetch_add(1, Ordering::AcqRel);
            tokio::time::sleep(jitter(100..300)).await;
            continue;
        }
        let mode = [pb::PauseMode::Abort, pb::PauseMode::Keep, pb::PauseMode::Wait][step];
        let mut pause = tonic::Request::new(pb::AbortLoraRequestsRequest {
            lora_name: adapter.into(),
            mode: mode.into(),
            owner: "soak-trainer".into(),
            lease_s: 30.0,
            kv_policy: pb::KvPolicy::Unspecified.into(),
        });
        // A wait-mode pause drains what runs; with hundreds queued it may not finish in time, and is then withdrawn.
        // Abort and keep answer once every request was handed back, or at the server's ack timeout (10 s) with the
        // stragglers listed: their deadline only guards against a hang.
        let answer_within = if mode == pb::PauseMode::Wait { Duration::from_secs(2) } else { Duration::from_secs(30) };
        pause.set_timeout(answer_within);
        let report = match control.abort_lora_requests(pause).await {
            Ok(report) => report.into_inner(),
            // Not answered in time: the server's deadline (DeadlineExceeded) or, on a loaded machine, the client's own
            // timer first (tonic's Cancelled "Timeout expired"); either way the call is dropped and the pause withdrawn.
            Err(status)
                if mode == pb::PauseMode::Wait
                    && (status.code() == Code::DeadlineExceeded
                        || (status.code() == Code::Cancelled && status.message() == "Timeout expired")) =>
            {
                tokio::time::sleep(jitter(100..300)).await;
                continue;
            }
            Err(status) => panic!("{adapter}: a {mode:?} pause failed: {status:?}"),
        };
        assert!(report.unacknowledged_request_ids.is_empty(), "{adapter}: every stopped request was handed back");
        counters.pauses.fetch_add(1, Ordering::AcqRel);
        tokio::time::sleep(jitter(5..60)).await;
        if mode == pb::PauseMode::Abort {
            let load = pb::LoadLoraAdapterRequest { lora_name: adapter.into(), path: adapter.into() };
            control.load_lora_adapter(load).await.expect("a load while paused");
            counters.swaps.fetch_add(1, Ordering::AcqRel);
        }
        let resume = pb::ResumeLoraRequestsRequest { lora_name: adapter.into(), pause_id: report.pause_id };
        control.resume_lora_requests(resume).await.expect("resume");
        tokio::time::sleep(jitter(100..300)).await;
    }
}

/// Loads a fresh adapter, samples it, and unloads it while those samples run.
async fn churn(channel: Channel, max_tokens: u32, counters: Arc<Counters>, stop: Arc<AtomicBool>) {
    let mut control = pb::lora_control_client::LoraControlClient::new(channel.clone());
    let mut round = 0u64;
    while !stop.load(Ordering::Acquire) {
        round += 1;
        let name = format!("churn-{round}");
        let load = pb::LoadLoraAdapterRequest { lora_name: name.clone(), path: ADAPTERS[round as usize % 2].into() };
        control.load_lora_adapter(load).await.expect("a fresh adapter loads");
        let samples: Vec<_> = (0..8)
            .map(|_| {
                let mut sampler = pb::sampler_client::SamplerClient::new(channel.clone());
                let request = pb::SampleRequest {
                    lora_name: name.clone(),
                    prompt_token_ids: tokens(PROMPT),
                    sampling_params: Some(pb::SamplingParams { max_tokens: Some(max_tokens), ..Default::default() }),
                    ..Default::default()
                };
                tokio::spawn(async move { sampler.sample(request).await })
            })
            .collect();
        tokio::time::sleep(jitter(0..40)).await;
        let unload = pb::UnloadLoraAdapterRequest { lora_name: name.clone() };
        control.unload_lora_adapter(unload).await.expect("unload under traffic");
        for sample in samples {
            match sample.await.expect("task") {
                Ok(_) => {}
                Err(status) => assert!(
                    matches!(status.code(), Code::NotFound | Code::Unavailable | Code::ResourceExhausted),
                    "{name}: a sample racing its unload failed with {status:?}"
                ),
            }
        }
        counters.churned.fetch_add(1, Ordering::AcqRel);
        tokio::time::sleep(jitter(50..200)).await;
    }
}
