//! Rollouts keep sampling while a trainer swaps their adapter's weights every few hundred milliseconds.
//!
//! Starts the demo server in-process, loads adapter `policy` from the `meow` weights, then runs 16 rollout workers
//! (each samples 8 times, 128 greedy tokens per sample) while a trainer loop swaps `policy` between the `woof` and
//! `meow` weights every 300 ms. Every sample must come back finished with its whole budget, whatever it was
//! interrupted by; each one's version segments say which weights produced which tokens. Exits non-zero if any
//! sample was lost, short or inconsistent.
//!
//! ```sh
//! cargo run --release -p loragate --example rollouts_during_swaps
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use loragate::{RunningServer, ServeConfig, default_cache_dir};
use loragate_client::{SamplingClient, TrainerClient};
use loragate_proto::v1::lora_control_client::LoraControlClient;
use loragate_proto::v1::{FinishReason, LoadLoraAdapterRequest, SampledSequence, SamplingParams};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const ADAPTER: &str = "policy";
const WORKERS: usize = 16;
const SAMPLES_PER_WORKER: usize = 8;
const MAX_TOKENS: u32 = 128;
const SWAP_EVERY: Duration = Duration::from_millis(300);
const PROMPT: &[u8] = b"Make a single short animal noise.";

fn main() -> ExitCode {
    // SAFETY: first thing in `main`, before any other thread (the runtime starts below).
    #[allow(unsafe_code)]
    unsafe {
        loragate::set_compute_threads(loragate::default_compute_threads());
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("rollouts_during_swaps: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("rollouts_during_swaps: {problem}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let mut config = ServeConfig::demo(default_cache_dir());
    config.grpc_addr = ([127, 0, 0, 1], 0).into();
    config.http_addr = ([127, 0, 0, 1], 0).into();
    let server = RunningServer::start(config).await.map_err(|err| err.to_string())?;
    let channel = Channel::from_shared(format!("http://{}", server.grpc_addr()))
        .map_err(|err| err.to_string())?
        .connect()
        .await
        .map_err(|err| err.to_string())?;
    let load = LoadLoraAdapterRequest { lora_name: ADAPTER.into(), path: "meow".into() };
    let loaded =
        LoraControlClient::new(channel.clone()).load_lora_adapter(load).await.map_err(|err| err.to_string())?;
    println!("serving {ADAPTER} v{} (meow weights) on {}", loaded.into_inner().version, server.grpc_addr());

    let started = Instant::now();
    let rollouts_done = CancellationToken::new();
    let trainer = tokio::spawn(train(TrainerClient::new(channel.clone()), rollouts_done.clone()));
    let workers: Vec<_> = (0..WORKERS).map(|worker| tokio::spawn(rollouts(channel.clone(), worker))).collect();

    let mut samples = Vec::new();
    for worker in workers {
        samples.extend(worker.await.map_err(|err| err.to_string())??);
    }
    let elapsed = started.elapsed();
    rollouts_done.cancel();
    let (swaps, aborted) = trainer.await.map_err(|err| err.to_string())??;

    for (label, sequence) in samples.iter().take(8) {
        let segments: Vec<String> =
            sequence.segments.iter().map(|s| format!("v{}[{}..{})", s.lora_version, s.start, s.end)).collect();
        println!("{label}: {}", segments.join(" "));
    }
    println!("… and {} more", samples.len().saturating_sub(8));
    let problems: Vec<String> =
        samples.iter().filter_map(|(label, sequence)| check(sequence).err().map(|p| format!("{label}: {p}"))).collect();
    let interrupted = samples.iter().filter(|(_, sequence)| sequence.segments.len() > 1).count();
    println!(
        "{} samples of {} tokens in {:.1} s; {swaps} swaps aborted {aborted} requests; {interrupted} samples span \
         more than one version",
        samples.len(),
        MAX_TOKENS,
        elapsed.as_secs_f64()
    );
    server.shutdown().await;
    let expected = WORKERS * SAMPLES_PER_WORKER;
    if samples.len() != expected {
        return Err(format!("lost samples: {} of {expected} came back", samples.len()));
    }
    if let Some(problem) = problems.first() {
        return Err(format!("{} inconsistent samples, first {problem}", problems.len()));
    }
    println!("no sample lost: every one finished with its whole budget and consistent version segments");
    Ok(())
}

/// One rollout worker: samples one after another, each continued across any number of swaps by the retry client.
async fn rollouts(channel: Channel, worker: usize) -> Result<Vec<(String, SampledSequence)>, String> {
    let client = SamplingClient::new(channel, ADAPTER);
    let mut samples = Vec::with_capacity(SAMPLES_PER_WORKER);
    for sample in 0..SAMPLES_PER_WORKER {
        let params = SamplingParams { max_tokens: Some(MAX_TOKENS), ignore_eos: true, ..Default::default() };
        let prompt = PROMPT.iter().map(|&byte| u32::from(byte)).collect();
        let response = client.sample(prompt, params, 1).await.map_err(|err| err.to_string())?;
        for sequence in response.sequences {
            samples.push((format!("worker {worker:2} sample {sample}"), sequence));
        }
    }
    Ok(samples)
}

/// The trainer: swaps the adapter's weights every [`SWAP_EVERY`] until the rollouts are done.
async fn train(trainer: TrainerClient, rollouts_done: CancellationToken) -> Result<(usize, u32), String> {
    let (mut swaps, mut aborted) = (0, 0);
    loop {
        tokio::select! {
            () = rollouts_done.cancelled() => break,
            () = tokio::time::sleep(SWAP_EVERY) => {}
        }
        let weights = if swaps % 2 == 0 { "woof" } else { "meow" };
        let swap_started = Instant::now();
        let swap = trainer.swap_adapter(ADAPTER, weights).await.map_err(|err| err.to_string())?;
        println!(
            "step {swaps}: {ADAPTER} v{} ({weights} weights), aborted {} in {:.0?}",
            swap.version,
            swap.aborted_count,
            swap_started.elapsed()
        );
        swaps += 1;
        aborted += swap.aborted_count;
    }
    Ok((swaps, aborted))
}

/// A finished sample's invariants: the whole budget, segments that tile the tokens with increasing versions.
fn check(sequence: &SampledSequence) -> Result<(), String> {
    if sequence.finish_reason() != FinishReason::Length || sequence.token_ids.len() != MAX_TOKENS as usize {
        return Err(format!("finished {:?} with {} tokens", sequence.finish_reason(), sequence.token_ids.len()));
    }
    let mut next_start = 0;
    let mut last_version = 0;
    for segment in &sequence.segments {
        if segment.start != next_start || segment.end <= segment.start || segment.lora_version <= last_version {
            return Err(format!("segments do not tile the tokens in version order: {:?}", sequence.segments));
        }
        next_start = segment.end;
        last_version = segment.lora_version;
    }
    if next_start != MAX_TOKENS {
        return Err(format!("segments cover {next_start} of {MAX_TOKENS} tokens"));
    }
    Ok(())
}
