//! The isolation scenes of issue 17 on the real model, against loragate alone (llama.cpp has no adapter swaps, and
//! its slots are sized for the throughput runs):
//! - **swap**: 32 requests of an adapter (100-token prompts) decode beside a base-model stream; the adapter is swapped
//!   with KEEP (`load_inplace`): the stream's largest gap during the swap against its p99 before, and each kept
//!   request's first token of the new version, against prefilling all their tokens in one batch;
//! - **swap-reuse**: the same 32 requests paused with KEEP and `kv_policy: reuse` (their keys and values parked), the
//!   adapter's next version loaded, and the pause released: each kept request's first token of the new version after
//!   the resume, against the batch's decode step before the pause (the goal: within 2 steps, with no prefill);
//! - **head of line**: a 3,000-token prompt arrives while 16 base-model streams decode: their largest gap during its
//!   prefill against their p99 before, and its prefill time beside them and alone.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::streams::{Progress, gaps_between, gaps_overlapping, prompt_ids, quantile, secs, stream_completion};

/// The adapter the swap scene swaps, loaded at start, and the directory (under the adapter root) of its next version.
pub(crate) const SWAPPED_ADAPTER: &str = "alpha";
pub(crate) const NEXT_VERSION_DIR: &str = "alpha-v2";
/// Requests kept across the swap.
pub(crate) const KEPT_REQUESTS: usize = 32;
const KEPT_PROMPT_TOKENS: usize = 100;
const KEPT_MAX_TOKENS: u32 = 160;
/// Tokens every request must have before the "before" window opens, and the window's length in a stream's tokens.
const WARM_UP_TOKENS: usize = 8;
const BEFORE_WINDOW_TOKENS: usize = 20;
const STREAMS: usize = 16;
const LONG_PROMPT_TOKENS: usize = 3000;
/// What a background stream asks for: more than any scene waits for (it is dropped at the scene's end).
const BACKGROUND_MAX_TOKENS: u32 = 4000;

/// The loragate server under test.
pub(crate) struct Target<'a> {
    pub(crate) client: &'a reqwest::Client,
    pub(crate) base_url: &'a str,
    /// The base model's served name.
    pub(crate) model: &'a str,
}

impl Target<'_> {
    fn completions(&self) -> String {
        format!("{}/v1/completions", self.base_url)
    }

    /// Starts a streamed greedy completion; dropping the handle's task ends it.
    fn spawn_stream(&self, model: &str, prompt: Value, max_tokens: u32) -> (Progress, tokio::task::JoinHandle<Value>) {
        let progress = Progress::new();
        let body = json!({
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": true,
        });
        let (client, url, watched) = (self.client.clone(), self.completions(), progress.clone());
        let task = tokio::spawn(async move {
            let finished = stream_completion(&client, &url, body, watched).await;
            json!({"segments": finished.segments, "finish_reason": finished.finish_reason})
        });
        (progress, task)
    }

    /// Runs `prompts` at once, one token each, and returns the time until all have answered.
    async fn prefill(&self, prompts: Vec<Vec<u32>>) -> Duration {
        let url = self.completions();
        let started = Instant::now();
        let requests = prompts.into_iter().map(|prompt| {
            let body = json!({"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0});
            let url = url.clone();
            async move {
                let response = self.client.post(&url).json(&body).send().await.expect("request sent");
                assert!(response.status().is_success(), "prefill: {}", response.status());
                response.bytes().await.expect("answer");
            }
        });
        futures::future::join_all(requests).await;
        started.elapsed()
    }
}

/// A base-model stream and the swap scenes' kept requests of [`SWAPPED_ADAPTER`], all past their warm-up tokens.
struct KeptScene {
    base: Progress,
    base_task: tokio::task::JoinHandle<Value>,
    kept: Vec<(Progress, tokio::task::JoinHandle<Value>)>,
}

impl KeptScene {
    async fn start(target: &Target<'_>) -> Self {
        let story = json!("Tell me a very long story about the sea.");
        let (base, base_task) = target.spawn_stream(target.model, story, BACKGROUND_MAX_TOKENS);
        base.reached(WARM_UP_TOKENS).await;
        let kept: Vec<_> = (0..KEPT_REQUESTS)
            .map(|index| {
                let prompt = json!(prompt_ids(KEPT_PROMPT_TOKENS, index));
                target.spawn_stream(SWAPPED_ADAPTER, prompt, KEPT_MAX_TOKENS)
            })
            .collect();
        for (progress, _) in &kept {
            progress.reached(WARM_UP_TOKENS).await;
        }
        Self { base, base_task, kept }
    }
}

/// When the first token of adapter version `version` of a finished kept request arrived: its `segments` say where
/// that version starts, `times` when each token arrived.
fn first_token_of_version(finished: &Value, times: &[Instant], version: u64) -> Option<Instant> {
    let start = finished["segments"].as_array().into_iter().flatten().find_map(|segment| {
        (segment["lora_version"].as_u64() == Some(version)).then(|| segment["start"].as_u64()).flatten()
    })?;
    Some(*times.get(start as usize).expect("a time for every streamed token"))
}

/// The swap scene; prints its figures.
pub(crate) async fn swap(target: &Target<'_>) {
    let KeptScene { base, base_task, kept } = KeptScene::start(target).await;
    let window_opens = Instant::now();
    let base_at_open = base.count();
    base.reached(base_at_open + BEFORE_WINDOW_TOKENS).await;
    let tokens_at_swap: Vec<usize> = kept.iter().map(|(progress, _)| progress.count()).collect();
    let swap_started = Instant::now();
    let answer: Value = target
        .client
        .post(format!("{}/v1/load_lora_adapter", target.base_url))
        .json(&json!({"lora_name": SWAPPED_ADAPTER, "lora_path": NEXT_VERSION_DIR, "load_inplace": true}))
        .send()
        .await
        .expect("load sent")
        .json()
        .await
        .expect("a JSON answer");
    let swap_answered = swap_started.elapsed();
    let new_version = answer["version"].as_u64().unwrap_or_else(|| panic!("the swap failed: {answer}"));
    let mut first_new_tokens = Vec::new();
    for (progress, task) in kept {
        let finished = task.await.expect("a kept request");
        let times = progress.times();
        if let Some(arrived) = first_token_of_version(&finished, &times, new_version) {
            first_new_tokens.push(arrived - swap_started);
        }
    }
    let all_new = first_new_tokens.iter().max().copied().unwrap_or_default();
    base_task.abort();
    let base_times = base.times();
    let before = gaps_between(&base_times, window_opens, swap_started);
    let during = gaps_overlapping(&base_times, swap_started, swap_started + all_new);
    let refill_prompts = tokens_at_swap
        .iter()
        .enumerate()
        .map(|(index, tokens)| prompt_ids(KEPT_PROMPT_TOKENS + tokens, KEPT_REQUESTS + index))
        .collect();
    let one_batch = target.prefill(refill_prompts).await;
    println!(
        "\nswap with KEEP of {KEPT_REQUESTS} requests ({KEPT_PROMPT_TOKENS}-token prompts, {} tokens each at the swap on \
         average) beside a base-model stream; kept_count {}, the load answered in {}",
        tokens_at_swap.iter().sum::<usize>() / tokens_at_swap.len().max(1),
        answer["kept_count"],
        secs(swap_answered)
    );
    println!("| figure | value |");
    println!("| --- | --- |");
    println!("| base stream: p99 gap before ({} gaps) | {} |", before.len(), secs(quantile(&before, 0.99)));
    println!("| base stream: largest gap during the swap | {} |", secs(quantile(&during, 1.0)));
    println!(
        "| base stream: largest gap during / p99 before (goal ≤ 2) | {:.2} |",
        quantile(&during, 1.0).as_secs_f64() / quantile(&before, 0.99).as_secs_f64()
    );
    println!("| kept requests with a new-version token | {} of {KEPT_REQUESTS} |", first_new_tokens.len());
    println!(
        "| first new-version token after the swap began: median / all | {} / {} |",
        secs(quantile(&first_new_tokens, 0.5)),
        secs(all_new)
    );
    println!("| their tokens prefilled in one batch (32 requests at once, 1 token each) | {} |", secs(one_batch));
    println!(
        "| all new-version tokens / one batch (goal ≤ 3) | {:.2} |",
        all_new.as_secs_f64() / one_batch.as_secs_f64()
    );
}

/// The swap-reuse scene; prints its figures.
pub(crate) async fn swap_reuse(target: &Target<'_>) {
    let KeptScene { base: _, base_task, kept } = KeptScene::start(target).await;
    let window_opens = Instant::now();
    for (progress, _) in &kept {
        progress.reached(WARM_UP_TOKENS + BEFORE_WINDOW_TOKENS).await;
    }
    let control = |path: &str, body: Value| {
        let request = target.client.post(format!("{}{path}", target.base_url)).json(&body);
        async move {
            let answer: Value = request.send().await.expect("sent").json().await.expect("a JSON answer");
            answer
        }
    };
    let paused_at = Instant::now();
    let pause = control(
        "/skyrl/v1/abort_lora_requests",
        json!({"lora_name": SWAPPED_ADAPTER, "mode": "keep", "kv_policy": "reuse"}),
    )
    .await;
    assert_eq!(pause["kv_policy"], "reuse", "the embedded engine parks: {pause}");
    let load = control("/v1/load_lora_adapter", json!({"lora_name": SWAPPED_ADAPTER, "lora_path": NEXT_VERSION_DIR}));
    let new_version = load.await["version"].as_u64().expect("the next version loaded");
    let resumed_at = Instant::now();
    let resume =
        control("/skyrl/v1/resume_lora_requests", json!({"lora_name": SWAPPED_ADAPTER, "pause_id": pause["pause_id"]}));
    assert_eq!(resume.await["still_paused"], false, "the swap's pause was the only one");
    let (mut steps_before, mut first_new_tokens) = (Vec::new(), Vec::new());
    for (progress, task) in kept {
        let finished = task.await.expect("a kept request");
        let times = progress.times();
        steps_before.extend(gaps_between(&times, window_opens, paused_at));
        if let Some(arrived) = first_token_of_version(&finished, &times, new_version) {
            first_new_tokens.push(arrived - resumed_at);
        }
    }
    base_task.abort();
    let step = quantile(&steps_before, 0.5);
    let all_new = first_new_tokens.iter().max().copied().unwrap_or_default();
    let millis = |duration: Duration| format!("{:.1} ms", duration.as_secs_f64() * 1e3);
    println!(
        "\nswap with KEEP and KV reuse of {KEPT_REQUESTS} requests ({KEPT_PROMPT_TOKENS}-token prompts) beside a \
         base-model stream: pause (kept_count {}), load, resume",
        pause["kept_count"]
    );
    println!("| figure | value |");
    println!("| --- | --- |");
    println!(
        "| kept requests: decode step before the pause (median gap, {} gaps) | {} |",
        steps_before.len(),
        millis(step)
    );
    println!("| kept requests with a new-version token | {} of {KEPT_REQUESTS} |", first_new_tokens.len());
    println!(
        "| first new-version token after the resume: median / all | {} / {} |",
        millis(quantile(&first_new_tokens, 0.5)),
        millis(all_new)
    );
    println!("| all first new-version tokens, in decode steps | {:.2} |", all_new.as_secs_f64() / step.as_secs_f64());
}

/// The head-of-line scene; prints its figures.
pub(crate) async fn head_of_line(target: &Target<'_>) {
    let streams: Vec<_> = (0..STREAMS)
        .map(|index| target.spawn_stream(target.model, json!(prompt_ids(20, index)), BACKGROUND_MAX_TOKENS))
        .collect();
    for (progress, _) in &streams {
        progress.reached(WARM_UP_TOKENS).await;
    }
    let window_opens = Instant::now();
    let first = &streams[0].0;
    first.reached(first.count() + BEFORE_WINDOW_TOKENS).await;
    let arrived = Instant::now();
    let beside = target.prefill(vec![prompt_ids(LONG_PROMPT_TOKENS, 1)]).await;
    let answered = arrived + beside;
    let (mut before, mut during) = (Vec::new(), Vec::new());
    for (progress, task) in &streams {
        // The gap that spans the prompt's answer ends with the stream's next token.
        progress.reached(progress.count() + 1).await;
        task.abort();
        let times = progress.times();
        before.extend(gaps_between(&times, window_opens, arrived));
        during.extend(gaps_overlapping(&times, arrived, answered));
    }
    drop(streams);
    let alone = target.prefill(vec![prompt_ids(LONG_PROMPT_TOKENS, 2)]).await;
    println!("\nhead of line: a {LONG_PROMPT_TOKENS}-token prompt (1 token generated) while {STREAMS} streams decode");
    println!("| figure | value |");
    println!("| --- | --- |");
    println!("| streams: p99 gap before ({} gaps) | {} |", before.len(), secs(quantile(&before, 0.99)));
    println!(
        "| streams: p50 / largest gap during its prefill | {} / {} |",
        secs(quantile(&during, 0.5)),
        secs(quantile(&during, 1.0))
    );
    println!("| the prompt answered: beside the streams / alone | {} / {} |", secs(beside), secs(alone));
}
