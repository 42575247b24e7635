//! Whether other tenants notice a long prompt or a swap's refill: the candle engine's token-budget scheduler on a
//! synthetic model of SmolLM2-135M's shape (seeded random weights; its cost is the real model's, its output noise).
//!
//! Scenarios (all but `sweep` run by default; name some to run only those):
//! - `gemm`: this machine's f32 GEMM rate (a 2048 × 2048 × 2048 matmul on candle's CPU backend), the yardstick of
//!   the prefill arithmetic;
//! - `head-of-line`: a 3,000-token prompt arriving while 16 base-model streams decode: the streams' largest
//!   inter-token gap during its prefill (vs their p99 before), the prompt's prefill time beside them and alone, and
//!   that time against its arithmetic at the measured GEMM rate;
//! - `refill`: 32 requests of one adapter (100-token prompts) decode beside a base-model stream, then all come back
//!   at once as continuations of ~135 tokens (what a swap with KEEP resubmits): the stream's largest gap vs its p99
//!   before, and the time until all 32 have their first token vs prefilling all their tokens in one pass;
//! - `sweep`: the 16 streams' decode step and their gap while a long prompt is prefilled, per step budget: how the
//!   default `--max-num-batched-tokens` was chosen.
//!
//! `RAYON_NUM_THREADS=2 cargo bench -p loragate-benches --bench engine_isolation [-- SCENARIO… --budget N]`
//! (`--budget`: the step budget, default the engine's for the device).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use futures::StreamExt;
use loragate_core::{
    AdapterName, AdapterSource, AdapterVersion, Engine, EngineEvent, ModelInfo, RawSampleRequest, SampleRequest,
};
use loragate_engine::{CandleEngine, EngineConfig, ModelShape};
use tokio_util::sync::CancellationToken;

const STREAMS: usize = 16;
const LONG_PROMPT: usize = 3000;
const CONTINUATIONS: usize = 32;
/// The prompt of each request kept across the swap; its continuation adds the tokens it had produced.
const KEPT_PROMPT: usize = 100;
/// Tokens each stream decodes before its gaps are measured, and then the tokens measured.
const WARM_UP_TOKENS: usize = 5;
const MEASURED_TOKENS: usize = 30;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|arg| arg != "--bench").collect();
    let budget = args.iter().position(|arg| arg == "--budget").map(|at| args[at + 1].parse().expect("--budget N"));
    let named: Vec<&str> = args
        .iter()
        .enumerate()
        .filter(|(at, arg)| !arg.starts_with("--") && (*at == 0 || args[at - 1] != "--budget"))
        .map(|(_, arg)| arg.as_str())
        .collect();
    let wanted = |scenario: &str| if named.is_empty() { scenario != "sweep" } else { named.contains(&scenario) };
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all cores".into());
    println!("compute threads (RAYON_NUM_THREADS): {threads}; load average: {}", load_average());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let shape = ModelShape::smollm2_135m();
    let gemm = wanted("gemm") || wanted("head-of-line");
    let rate = gemm.then(gemm_rate);
    if wanted("head-of-line") {
        runtime.block_on(head_of_line(&shape, budget, rate.expect("measured")));
    }
    if wanted("refill") {
        runtime.block_on(refill(&shape, budget));
    }
    if wanted("sweep") {
        for budget in [32, 64, 128, 256, 512] {
            runtime.block_on(sweep(&shape, budget));
        }
    }
    println!("load average at the end: {}", load_average());
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(|_| "unknown".into(), |text| text.trim().to_owned())
}

/// The best of five 2048³ f32 matmuls, in FLOP/s.
fn gemm_rate() -> f64 {
    let n = 2048;
    let a = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu).expect("a");
    let b = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu).expect("b");
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let c = a.matmul(&b).expect("matmul");
        best = best.min(start.elapsed());
        drop(c);
    }
    let rate = 2.0 * (n as f64).powi(3) / best.as_secs_f64();
    println!("gemm: {n}×{n}×{n} f32 in {best:.2?} (best of 5): {:.1} GFLOP/s", rate / 1e9);
    rate
}

/// An engine on `shape` with the step budget `budget` (default: the device's) and room for `max_batch_size` sequences.
fn engine(shape: &ModelShape, budget: Option<usize>, max_batch_size: usize) -> CandleEngine {
    let config = EngineConfig {
        max_num_batched_tokens: budget,
        max_context_length: Some(4096),
        max_batch_size,
        ..EngineConfig::default()
    };
    CandleEngine::with_random_weights(shape, 7, config).expect("synthetic engine")
}

fn request(info: &ModelInfo, lora: &str, prompt: Vec<u32>, max_tokens: u32) -> SampleRequest {
    let raw = RawSampleRequest {
        lora_name: lora.into(),
        prompt_token_ids: prompt,
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Default::default()
    };
    SampleRequest::parse(raw, info).expect("valid request")
}

/// `len` tokens drawn from `seed`.
fn prompt(seed: usize, len: usize, vocab: u32) -> Vec<u32> {
    (0..len).map(|position| ((seed * 7919 + position * 104_729) as u32) % vocab).collect()
}

/// A stream decoding until cancelled, with the arrival time of each of its tokens.
struct Stream {
    arrivals: Arc<Mutex<Vec<Instant>>>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Stream {
    async fn start(engine: &Arc<CandleEngine>, lora: &str, prompt: Vec<u32>) -> Self {
        let cancel = CancellationToken::new();
        let request = request(engine.model_info(), lora, prompt, 1000);
        let mut events = engine.generate(request, cancel.clone()).await.expect("generate");
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&arrivals);
        let task = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                if let Ok(EngineEvent::Tokens { token_ids, .. }) = event {
                    let now = Instant::now();
                    record.lock().expect("arrivals").extend(std::iter::repeat_n(now, token_ids.len()));
                }
            }
        });
        Self { arrivals, cancel, task }
    }

    fn tokens(&self) -> usize {
        self.arrivals.lock().expect("arrivals").len()
    }

    /// The gaps between its tokens that arrived within `from..to` (from the token before `from`).
    fn gaps(&self, from: Instant, to: Instant) -> Vec<Duration> {
        let arrivals = self.arrivals.lock().expect("arrivals");
        let first = arrivals.iter().rposition(|at| *at <= from).unwrap_or(0);
        arrivals[first..].windows(2).take_while(|pair| pair[0] < to).map(|pair| pair[1] - pair[0]).collect()
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.expect("stream task");
    }
}

async fn wait_for(streams: &[Stream], tokens: usize) {
    while streams.iter().any(|stream| stream.tokens() < tokens) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The gaps of every stream while each decodes `MEASURED_TOKENS` more tokens: the undisturbed pace.
async fn pace(streams: &[Stream]) -> Vec<Duration> {
    let from = Instant::now();
    let start = streams.iter().map(Stream::tokens).max().unwrap_or(0);
    wait_for(streams, start + MEASURED_TOKENS).await;
    let to = Instant::now();
    streams.iter().flat_map(|stream| stream.gaps(from, to)).collect()
}

fn percentile(gaps: &[Duration], fraction: f64) -> Duration {
    let mut sorted = gaps.to_vec();
    sorted.sort_unstable();
    sorted.get(((sorted.len() as f64 - 1.0) * fraction).round() as usize).copied().unwrap_or_default()
}

/// Submits `prompt` (one token asked) and waits for its token.
async fn first_token(engine: &CandleEngine, lora: &str, prompt: Vec<u32>) {
    let mut events = engine
        .generate(request(engine.model_info(), lora, prompt, 1), CancellationToken::new())
        .await
        .expect("generate");
    while let Some(event) = events.next().await {
        match event {
            Ok(EngineEvent::Tokens { .. }) => return,
            Ok(_) => {}
            Err(err) => panic!("{err}"),
        }
    }
    panic!("no token");
}

async fn head_of_line(shape: &ModelShape, budget: Option<usize>, gemm_rate: f64) {
    let engine = Arc::new(engine(shape, budget, 64));
    let vocab = engine.model_info().vocab_size;
    let mut streams = Vec::new();
    for index in 0..STREAMS {
        streams.push(Stream::start(&engine, "", prompt(index, 16, vocab)).await);
    }
    wait_for(&streams, WARM_UP_TOKENS).await;
    let before = pace(&streams).await;
    let start = Instant::now();
    first_token(&engine, "", prompt(99, LONG_PROMPT, vocab)).await;
    let end = Instant::now();
    let beside = end - start;
    let during: Vec<Duration> = streams.iter().flat_map(|stream| stream.gaps(start, end)).collect();
    for stream in streams {
        stream.stop().await;
    }
    let start = Instant::now();
    first_token(&engine, "", prompt(98, LONG_PROMPT, vocab)).await;
    let alone = start.elapsed();
    let arithmetic = Duration::from_secs_f64(shape.prefill_flops(LONG_PROMPT) / gemm_rate);
    println!("head of line ({STREAMS} streams, a {LONG_PROMPT}-token prompt):");
    println!("  streams' gaps before: p50 {:.2?}, p99 {:.2?}", percentile(&before, 0.5), percentile(&before, 0.99));
    println!(
        "  streams' gaps during the prefill: p50 {:.2?}, largest {:.2?} (goal < 1 s)",
        percentile(&during, 0.5),
        percentile(&during, 1.0)
    );
    println!("  prefill beside the streams: {beside:.2?}; alone: {alone:.2?}");
    println!(
        "  arithmetic: {:.2} TFLOP at the GEMM rate = {arithmetic:.2?}; alone / arithmetic = {:.2} (goal ≤ 1.5)",
        shape.prefill_flops(LONG_PROMPT) / 1e12,
        alone.as_secs_f64() / arithmetic.as_secs_f64()
    );
}

async fn refill(shape: &ModelShape, budget: Option<usize>) {
    let adapter_dir = tempfile::tempdir().expect("adapter dir");
    write_random_peft(adapter_dir.path(), shape, 8);
    let engine = Arc::new(engine(shape, budget, 64));
    let pirate = AdapterName::parse("pirate").expect("name");
    let source = AdapterSource::trusted(adapter_dir.path());
    engine.load_adapter(&pirate, AdapterVersion(1), &source).await.expect("adapter");
    let vocab = engine.model_info().vocab_size;

    // The issue's scene: 32 requests of `pirate` (100-token prompts) decode beside one base-model stream.
    let base = [Stream::start(&engine, "", prompt(1, 16, vocab)).await];
    let mut kept = Vec::new();
    for index in 0..CONTINUATIONS {
        kept.push(Stream::start(&engine, "pirate", prompt(1000 + index, KEPT_PROMPT, vocab)).await);
    }
    wait_for(&kept, WARM_UP_TOKENS).await;
    wait_for(&base, WARM_UP_TOKENS).await;
    let before = pace(&base).await;
    // The swap: every pirate request stops and comes back as its continuation (prompt plus its tokens so far),
    // prefilled again under the new weights.
    for stream in &kept {
        stream.cancel.cancel();
    }
    let continuations: Vec<Vec<u32>> = kept
        .iter()
        .enumerate()
        .map(|(index, stream)| prompt(1000 + index, KEPT_PROMPT + stream.tokens(), vocab))
        .collect();
    let tokens: usize = continuations.iter().map(Vec::len).sum();
    let start = Instant::now();
    futures::future::join_all(continuations.iter().map(|prompt| first_token(&engine, "pirate", prompt.clone()))).await;
    let end = Instant::now();
    let refill = end - start;
    let during = base[0].gaps(start, end);
    let [base] = base;
    base.stop().await;
    for stream in kept {
        stream.stop().await;
    }

    // The reference: all their tokens in one pass, on an engine whose budget holds them all. A blocker (a 400-token
    // prompt, a second or so) occupies the step thread while they are submitted, so that its next step takes them
    // together; the pass is timed from the blocker's token.
    let config = EngineConfig { max_num_batched_tokens: Some(tokens + 64), ..EngineConfig::default() };
    let one_pass = CandleEngine::with_random_weights(shape, 7, config).expect("engine");
    one_pass.load_adapter(&pirate, AdapterVersion(1), &source).await.expect("adapter");
    let blocker = async {
        first_token(&one_pass, "", prompt(2, 400, vocab)).await;
        Instant::now()
    };
    let batch = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        futures::future::join_all(continuations.iter().map(|prompt| first_token(&one_pass, "pirate", prompt.clone())))
            .await;
        Instant::now()
    };
    let (blocked_until, batched_at) = futures::join!(blocker, batch);
    let batched = batched_at - blocked_until;
    println!(
        "refill ({CONTINUATIONS} pirate requests decoding beside a base-model stream, then resubmitted as \
         continuations of {} tokens on average):",
        tokens / CONTINUATIONS
    );
    println!("  stream's gaps before: p50 {:.2?}, p99 {:.2?}", percentile(&before, 0.5), percentile(&before, 0.99));
    println!(
        "  stream's largest gap during the refill: {:.2?} (goal < 1 s and < 4 × p99 = {:.2?})",
        percentile(&during, 1.0),
        percentile(&before, 0.99) * 4
    );
    println!(
        "  all {CONTINUATIONS} first tokens after {refill:.2?}; all their {tokens} tokens in one pass: {batched:.2?}; \
         ratio {:.2} (goal ≤ 2)",
        refill.as_secs_f64() / batched.as_secs_f64()
    );
}

async fn sweep(shape: &ModelShape, budget: usize) {
    // Room for the streams and the prompt, so that the smallest budgets are allowed.
    let engine = Arc::new(engine(shape, Some(budget), STREAMS + 1));
    let vocab = engine.model_info().vocab_size;
    let mut streams = Vec::new();
    for index in 0..STREAMS {
        streams.push(Stream::start(&engine, "", prompt(index, 16, vocab)).await);
    }
    wait_for(&streams, WARM_UP_TOKENS).await;
    let before = pace(&streams).await;
    let start = Instant::now();
    first_token(&engine, "", prompt(99, 1500, vocab)).await;
    let end = Instant::now();
    let during: Vec<Duration> = streams.iter().flat_map(|stream| stream.gaps(start, end)).collect();
    for stream in streams {
        stream.stop().await;
    }
    let (decode, chunked) = (percentile(&before, 0.5), percentile(&during, 0.5));
    println!(
        "budget {budget}: decode step {decode:.0?}, step with a full chunk {chunked:.0?} ({:.1} decode steps, \
         largest {:.2?}), 1,500-token prefill beside {STREAMS} streams {:.2?}",
        chunked.as_secs_f64() / decode.as_secs_f64(),
        percentile(&during, 1.0),
        end - start
    );
}

/// A PEFT adapter of rank `rank` on every projection of `shape`, with random factors.
fn write_random_peft(dir: &std::path::Path, shape: &ModelShape, rank: usize) {
    let targets = [
        ("self_attn", "q_proj", shape.hidden_size, shape.num_heads * shape.head_dim),
        ("self_attn", "k_proj", shape.hidden_size, shape.num_kv_heads * shape.head_dim),
        ("self_attn", "v_proj", shape.hidden_size, shape.num_kv_heads * shape.head_dim),
        ("self_attn", "o_proj", shape.num_heads * shape.head_dim, shape.hidden_size),
        ("mlp", "gate_proj", shape.hidden_size, shape.intermediate_size),
        ("mlp", "up_proj", shape.hidden_size, shape.intermediate_size),
        ("mlp", "down_proj", shape.intermediate_size, shape.hidden_size),
    ];
    let mut tensors = std::collections::HashMap::new();
    for layer in 0..shape.num_layers {
        for (block, module, fan_in, fan_out) in targets {
            let path = format!("base_model.model.model.layers.{layer}.{block}.{module}");
            let a = Tensor::randn(0f32, 1.0 / (fan_in as f32).sqrt(), (rank, fan_in), &Device::Cpu).expect("A");
            let b = Tensor::randn(0f32, 0.01, (fan_out, rank), &Device::Cpu).expect("B");
            tensors.insert(format!("{path}.lora_A.weight"), a);
            tensors.insert(format!("{path}.lora_B.weight"), b);
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors")).expect("weights");
    let config = serde_json::json!({
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": targets.map(|(_, module, _, _)| module),
        "bias": "none",
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).expect("config");
}
