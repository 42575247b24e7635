//! A keep-mode swap on the demo model, through the coordinator and the candle engine: 32 greedy requests of one
//! adapter are decoding, a keep-mode pause stops them (the core keeps their tokens), the adapter's weights are
//! reloaded, and the resume is timed until every one of them has its first token from the new version. Under
//! KV_POLICY_RECOMPUTE that is until all 32 continuations of `prompt + tokens so far` were prefilled again and
//! decoded one step; under KV_POLICY_REUSE the 32 parked sequences rejoin the batch with their keys and values and
//! decode at once (no prefill): the goal is one or two decode steps of the 32-row batch, which the third figure
//! measures in the same rounds (the resumed batch's own step time).
//!
//! `RAYON_NUM_THREADS=1 cargo bench -p loragate-benches --bench keep_resume`

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use futures::StreamExt;
use loragate_core::{
    AdapterName, AdapterSource, AdapterVersion, Coordinator, CoordinatorConfig, KvPolicy, PauseMode, PauseRequest,
    RawSampleRequest, SampleEvent, SampleStream,
};
use loragate_engine::{CandleEngine, EngineConfig, ensure_demo_files};
use tokio::sync::mpsc;

const REQUESTS: usize = 32;
/// Tokens each request has produced when it is kept (so each continuation re-prefills the prompt plus these).
const TOKENS_BEFORE_PAUSE: usize = 32;
const PROMPT: &str = "Make a single short animal noise.";

async fn demo_coordinator() -> (Coordinator, AdapterSource) {
    let files = ensure_demo_files(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("loragate-cache")).expect("demo");
    let engine = CandleEngine::load(&files.model_dir, EngineConfig::default()).expect("demo model");
    let coordinator = Coordinator::start(Arc::new(engine), CoordinatorConfig::default()).await.expect("coordinator");
    let meow = AdapterName::parse("meow").expect("name");
    let weights = AdapterSource::trusted(&files.meow_dir);
    coordinator.load_adapter(&meow, weights.clone()).await.expect("meow");
    (coordinator, weights)
}

async fn start(coordinator: &Coordinator, index: usize) -> SampleStream {
    let raw = RawSampleRequest {
        request_id: format!("kept-{index}"),
        lora_name: "meow".into(),
        prompt_token_ids: PROMPT.bytes().map(u32::from).collect(),
        max_tokens: Some(2000),
        ignore_eos: true,
        ..Default::default()
    };
    let request = coordinator.parse_sample(raw).expect("valid");
    coordinator.sample(request, coordinator.gate_deadline(None)).await.expect("admitted")
}

/// New-version tokens per request after which the round's step time is read: the time from every request's first
/// new-version token to every request's `STEP_TOKENS`-th, over `STEP_TOKENS - 1`, is the resumed 32-row batch's own
/// decode step, the yardstick of the goal (REUSE within two of them).
const STEP_TOKENS: usize = 9;

/// What a followed stream reports: it reached its pause point, or has this many tokens of the new version.
enum Report {
    Paused,
    NewTokens(usize),
}

/// Reads a stream on its own task: reports once it has `TOKENS_BEFORE_PAUSE` tokens, then at its first and its
/// `STEP_TOKENS`-th token from the version it is told about (the swap's), then drains it.
fn follow(
    mut stream: SampleStream,
    reports: mpsc::UnboundedSender<Report>,
    mut swapped_to: mpsc::UnboundedReceiver<AdapterVersion>,
) {
    tokio::spawn(async move {
        let mut tokens = 0;
        while tokens < TOKENS_BEFORE_PAUSE {
            if let Some(Ok(SampleEvent::Tokens { token_ids, .. })) = stream.next().await {
                tokens += token_ids.len();
            }
        }
        let _ = reports.send(Report::Paused);
        let Some(new_version) = swapped_to.recv().await else { return };
        let mut new_tokens = 0;
        while let Some(event) = stream.next().await {
            if let Ok(SampleEvent::Tokens { version, token_ids, .. }) = event
                && version == new_version
            {
                let before = new_tokens;
                new_tokens += token_ids.len();
                for threshold in [1, STEP_TOKENS] {
                    if before < threshold && new_tokens >= threshold {
                        let _ = reports.send(Report::NewTokens(threshold));
                    }
                }
                if new_tokens >= STEP_TOKENS {
                    break;
                }
            }
        }
        while stream.next().await.is_some() {}
    });
}

/// What one round measured.
struct Round {
    /// From the resume to the first token of the new weights in every kept request.
    first_new_token: Duration,
    /// The resumed batch's decode step: see [`STEP_TOKENS`].
    decode_step: Duration,
}

/// Which of a round's measures a benchmark reports.
type Figure = fn(Round) -> Duration;

/// One round: 32 requests kept, the weights reloaded, resumed.
async fn round(coordinator: &Coordinator, weights: &AdapterSource, kv_policy: KvPolicy) -> Round {
    let meow = AdapterName::parse("meow").expect("name");
    let (reports, mut reported) = mpsc::unbounded_channel();
    let mut resume_signals = Vec::with_capacity(REQUESTS);
    for index in 0..REQUESTS {
        let (signal, resumed) = mpsc::unbounded_channel();
        follow(start(coordinator, index).await, reports.clone(), resumed);
        resume_signals.push(signal);
    }
    for _ in 0..REQUESTS {
        let report = reported.recv().await.expect("a request reached its pause point");
        assert!(matches!(report, Report::Paused), "no new version before the swap");
    }
    let keep = PauseRequest::new(PauseMode::Keep).with_kv_policy(kv_policy);
    let pause = coordinator.pause(&meow, keep, None).await.expect("keep");
    assert_eq!(pause.kept.len(), REQUESTS, "every request was kept: {:?}", pause.kept);
    assert_eq!(pause.kv_policy, kv_policy, "the candle engine applies either policy");
    let new_version = coordinator.load_adapter(&meow, weights.clone()).await.expect("the new weights").version;
    for signal in &resume_signals {
        let _ = signal.send(new_version);
    }
    let started = Instant::now();
    coordinator.resume(&meow, Some(pause.pause_id)).await.expect("resume");
    let (mut firsts, mut steps) = (0, 0);
    let (mut all_first, mut all_step) = (None, None);
    while all_step.is_none() {
        match reported.recv().await.expect("a kept request produced tokens of the new weights") {
            Report::NewTokens(1) => firsts += 1,
            Report::NewTokens(_) => steps += 1,
            Report::Paused => unreachable!("every request reported its pause point already"),
        }
        if firsts == REQUESTS && all_first.is_none() {
            all_first = Some(started.elapsed());
        }
        if steps == REQUESTS {
            all_step = Some(started.elapsed());
        }
    }
    coordinator.abort(&meow).await.expect("end the round");
    coordinator.resume(&meow, None).await.expect("reopen");
    let (first_new_token, all_step) = (all_first.expect("all first"), all_step.expect("all steps"));
    Round { first_new_token, decode_step: (all_step - first_new_token) / (STEP_TOKENS as u32 - 1) }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (coordinator, weights) = runtime.block_on(demo_coordinator());
    let mut group = criterion.benchmark_group("keep_resume");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    let figures: [(&str, KvPolicy, Figure); 3] = [
        ("resume_to_first_new_token_of_32_kept_requests", KvPolicy::Recompute, |round| round.first_new_token),
        ("reuse_resume_to_first_new_token_of_32_parked_requests", KvPolicy::Reuse, |round| round.first_new_token),
        ("reuse_decode_step_of_the_32_resumed_requests", KvPolicy::Reuse, |round| round.decode_step),
    ];
    for (name, kv_policy, figure) in figures {
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter_custom(|iterations| {
                let (coordinator, weights) = (coordinator.clone(), weights.clone());
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iterations {
                        total += figure(round(&coordinator, &weights, kv_policy).await);
                    }
                    total
                }
            });
        });
    }
    group.finish();
    criterion.final_summary();
}
