//! The candle engine on the embedded demo model: decode throughput with 1, 8 and 32 concurrent sequences (each a
//! separate request, greedy, 64 new tokens after a short prompt, adapters alternating meow/woof/base), and the
//! time from `cancel()` to the `Abort` hand-back of a running sequence.
//!
//! `cargo bench -p loragate-benches --bench engine`

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use futures::StreamExt;
use loragate_core::{
    AdapterName, AdapterSource, AdapterVersion, Engine, EngineEvent, FinishReason, RawSampleRequest, SampleRequest,
};
use loragate_engine::{CandleEngine, EngineConfig, ensure_demo_files};
use tokio_util::sync::CancellationToken;

const NEW_TOKENS: u32 = 64;
const PROMPT: &str = "Make a single short animal noise.";

fn demo_engine(runtime: &tokio::runtime::Runtime) -> CandleEngine {
    let files = ensure_demo_files(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("loragate-cache")).expect("demo");
    let engine = CandleEngine::load(&files.model_dir, EngineConfig::default()).expect("demo model");
    runtime.block_on(async {
        for (name, dir) in [("meow", &files.meow_dir), ("woof", &files.woof_dir)] {
            let name = AdapterName::parse(name).expect("name");
            engine.load_adapter(&name, AdapterVersion(1), &AdapterSource::trusted(dir)).await.expect("adapter");
        }
    });
    engine
}

fn request(engine: &CandleEngine, lora: &str, max_tokens: u32) -> SampleRequest {
    continuation(engine, lora, max_tokens, 0)
}

/// A greedy request for `max_tokens` after the demo prompt plus `accumulated` already generated tokens (what the
/// retry client resubmits after an abort).
fn continuation(engine: &CandleEngine, lora: &str, max_tokens: u32, accumulated: usize) -> SampleRequest {
    let mut prompt = engine.tokenizer().expect("tokenizer").encode(PROMPT).expect("encode");
    prompt.extend(std::iter::repeat_n(u32::from(b'm'), accumulated));
    let raw = RawSampleRequest {
        lora_name: lora.into(),
        prompt_token_ids: prompt,
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Default::default()
    };
    SampleRequest::parse(raw, engine.model_info()).expect("valid request")
}

/// Runs `sequences` concurrent requests of `NEW_TOKENS` tokens to their end.
async fn decode(engine: &CandleEngine, sequences: usize) {
    let runs = (0..sequences).map(|index| async move {
        let lora = ["meow", "woof", ""][index % 3];
        let mut stream =
            engine.generate(request(engine, lora, NEW_TOKENS), CancellationToken::new()).await.expect("generate");
        let mut tokens = 0;
        while let Some(event) = stream.next().await {
            if let Ok(EngineEvent::Tokens { token_ids, .. }) = event {
                tokens += token_ids.len();
            }
        }
        assert_eq!(tokens, NEW_TOKENS as usize);
    });
    futures::future::join_all(runs).await;
}

/// The refill after a weight swap: `sequences` continuations (the prompt plus `accumulated` tokens already
/// generated) submitted at once, until every one has produced its first new token.
async fn refill(engine: &CandleEngine, sequences: usize, accumulated: usize) {
    let runs = (0..sequences).map(|_| async move {
        let request = continuation(engine, "meow", 1, accumulated);
        let mut stream = engine.generate(request, CancellationToken::new()).await.expect("generate");
        while let Some(event) = stream.next().await {
            if let Ok(EngineEvent::Tokens { .. }) = event {
                return;
            }
        }
        panic!("no token");
    });
    futures::future::join_all(runs).await;
}

/// The time from `cancel()` to the `Abort` event of a sequence that is decoding.
async fn cancel_latency(engine: &CandleEngine) -> Duration {
    let cancel = CancellationToken::new();
    let mut stream = engine.generate(request(engine, "meow", 4000), cancel.clone()).await.expect("generate");
    let mut tokens = 0;
    while tokens < 8 {
        if let Some(Ok(EngineEvent::Tokens { token_ids, .. })) = stream.next().await {
            tokens += token_ids.len();
        }
    }
    let start = Instant::now();
    cancel.cancel();
    while let Some(event) = stream.next().await {
        if let Ok(EngineEvent::Finished { reason, .. }) = event {
            assert_eq!(reason, FinishReason::Abort);
            return start.elapsed();
        }
    }
    panic!("the stream ended without its Abort");
}

fn engine_benches(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let engine = demo_engine(&runtime);

    let mut group = c.benchmark_group("engine_decode");
    group.sample_size(10).measurement_time(Duration::from_secs(8));
    for sequences in [1, 8, 32] {
        group.throughput(Throughput::Elements(sequences as u64 * u64::from(NEW_TOKENS)));
        group.bench_with_input(BenchmarkId::new("sequences", sequences), &sequences, |b, &sequences| {
            b.to_async(&runtime).iter(|| decode(&engine, sequences));
        });
    }
    group.finish();

    let mut group = c.benchmark_group("engine_refill");
    group.sample_size(10).measurement_time(Duration::from_secs(8));
    for sequences in [1, 32] {
        group.bench_with_input(BenchmarkId::new("continuations_of_100_tokens", sequences), &sequences, |b, &n| {
            b.to_async(&runtime).iter(|| refill(&engine, n, 100));
        });
    }
    group.finish();

    let mut group = c.benchmark_group("engine_cancel");
    group.sample_size(20);
    group.bench_function("cancel_to_abort", |b| {
        b.to_async(&runtime).iter_custom(|iterations| {
            let engine = &engine;
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    total += cancel_latency(engine).await;
                }
                total
            }
        });
    });
    group.finish();
}

// What `criterion_group!`/`criterion_main!` expand to, minus their undocumented public function.
fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    engine_benches(&mut criterion);
    criterion.final_summary();
}
