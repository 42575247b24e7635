//! Streamed completions with the arrival time of every token, and the gap statistics the isolation scenes report.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::watch;

/// The tokens of one streamed completion as they arrive.
#[derive(Clone)]
pub(crate) struct Progress {
    times: Arc<Mutex<Vec<Instant>>>,
    count: watch::Sender<usize>,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self { times: Arc::default(), count: watch::Sender::new(0) }
    }

    /// Waits until at least `tokens` have arrived (or the stream has ended: then it returns early).
    pub(crate) async fn reached(&self, tokens: usize) {
        let mut receiver = self.count.subscribe();
        let _ = receiver.wait_for(|count| *count >= tokens).await;
    }

    pub(crate) fn count(&self) -> usize {
        *self.count.borrow()
    }

    /// The arrival times so far.
    pub(crate) fn times(&self) -> Vec<Instant> {
        self.times.lock().expect("not poisoned").clone()
    }

    fn push(&self, now: Instant, tokens: usize) {
        let mut times = self.times.lock().expect("not poisoned");
        times.extend(std::iter::repeat_n(now, tokens));
        self.count.send_replace(times.len());
    }
}

/// How a streamed completion ended.
pub(crate) struct Finished {
    /// loragate's `segments` of the choice (`lora_version`, `start`, `end`), empty from other servers.
    pub(crate) segments: Vec<Value>,
    pub(crate) finish_reason: String,
}

/// Streams `body` (`stream: true` is added) from `url`, recording each token's arrival in `progress` (one
/// `token_ids` entry per token where the server sends them, else one token per chunk with text).
pub(crate) async fn stream_completion(
    client: &reqwest::Client,
    url: &str,
    mut body: Value,
    progress: Progress,
) -> Finished {
    body["stream"] = Value::Bool(true);
    let mut response = client.post(url).json(&body).send().await.expect("request sent");
    assert!(response.status().is_success(), "{url}: {}", response.status());
    let mut pending = String::new();
    let mut finished = Finished { segments: Vec::new(), finish_reason: String::new() };
    while let Some(bytes) = response.chunk().await.expect("stream read") {
        let now = Instant::now();
        pending.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data:").map(str::trim) else { continue };
            if data == "[DONE]" {
                return finished;
            }
            let chunk: Value = serde_json::from_str(data).unwrap_or_else(|_| panic!("a JSON chunk: {data}"));
            assert!(chunk.get("error").is_none(), "{url}: {chunk}");
            let Some(choice) = chunk["choices"].get(0) else { continue };
            let tokens = match choice["token_ids"].as_array() {
                Some(ids) => ids.len(),
                None => usize::from(choice["text"].as_str().is_some_and(|text| !text.is_empty())),
            };
            if tokens > 0 {
                progress.push(now, tokens);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                finished.finish_reason = reason.to_owned();
                finished.segments = choice["segments"].as_array().cloned().unwrap_or_default();
            }
        }
    }
    finished
}

/// The gaps between consecutive arrivals of `times` that lie wholly within `[from, to]`.
pub(crate) fn gaps_between(times: &[Instant], from: Instant, to: Instant) -> Vec<Duration> {
    times.windows(2).filter(|pair| pair[0] >= from && pair[1] <= to).map(|pair| pair[1] - pair[0]).collect()
}

/// The gaps between consecutive arrivals of `times` that overlap `(from, to)`: those within, and those spanning
/// either end.
pub(crate) fn gaps_overlapping(times: &[Instant], from: Instant, to: Instant) -> Vec<Duration> {
    times.windows(2).filter(|pair| pair[1] > from && pair[0] < to).map(|pair| pair[1] - pair[0]).collect()
}

/// The `quantile` (0–1) of `values`, nearest rank.
pub(crate) fn quantile(values: &[Duration], quantile: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    let rank = ((quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or_default()
}

/// Seconds with two decimals.
pub(crate) fn secs(duration: Duration) -> String {
    format!("{:.2} s", duration.as_secs_f64())
}

/// `count` token ids for a synthetic prompt (varied by `seed`, clear of the low ids where control tokens live).
pub(crate) fn prompt_ids(count: usize, seed: usize) -> Vec<u32> {
    (0..count).map(|index| (1000 + (index * 7919 + seed * 104_729) % 30_000) as u32).collect()
}
