//! What a request held at a paused gate costs the server process (issue 20): 100 completions, each a 1 MiB body
//! that parses to a 512-token prompt, held at once, grow the real server's resident memory by less than 10 MB. The
//! body is gone once parsed, and neither the connections' read buffers nor the allocator keep its megabyte: the
//! test measures the process (`VmRSS`), not just the request's own bytes.

use crate::spawned;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spawned::{PATIENCE, Spawned};

/// How many requests are held at once.
const HELD: usize = 100;
/// Each body's size.
const BODY_BYTES: usize = 1 << 20;
/// The most the held requests may grow the process's resident memory by.
const MAX_GROWTH_BYTES: u64 = 10_000_000;

/// The process's resident set size, in bytes (`VmRSS` of `/proc/PID/status`).
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's /proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// A completion of `meow` with a 512-token prompt, padded with whitespace to `bytes` (if it is shorter).
fn padded_completion(bytes: usize) -> Vec<u8> {
    let prompt: Vec<u32> = (0..512).map(|i| 32 + i % 90).collect();
    let mut body = json!({"model": "meow", "prompt": prompt, "max_tokens": 1, "temperature": 0}).to_string();
    body.push_str(&" ".repeat(bytes.saturating_sub(body.len())));
    body.into_bytes()
}

async fn held(client: &reqwest::Client, base: &str) -> u64 {
    let models: Value =
        client.get(format!("{base}/v1/models")).send().await.expect("models").json().await.expect("json");
    let meow = models["data"].as_array().expect("data").iter().find(|model| model["id"] == "meow").cloned();
    meow.and_then(|meow| meow["held"].as_u64()).expect("meow's held count")
}

/// Sends `count` completions of `bytes` each at once; returns their tasks.
fn send_all(
    client: &reqwest::Client,
    base: &str,
    count: usize,
    bytes: usize,
) -> Vec<tokio::task::JoinHandle<reqwest::StatusCode>> {
    let body = bytes::Bytes::from(padded_completion(bytes));
    (0..count)
        .map(|_| {
            let request = client
                .post(format!("{base}/v1/completions"))
                .header("content-type", "application/json")
                .body(body.clone());
            tokio::spawn(async move { request.send().await.expect("send").status() })
        })
        .collect()
}

async fn wait_for_held(client: &reqwest::Client, base: &str, count: u64) {
    let deadline = Instant::now() + PATIENCE;
    while held(client, base).await != count {
        assert!(Instant::now() < deadline, "{count} requests were not held in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_held_one_mebibyte_completions_grow_the_server_by_less_than_ten_megabytes() {
    let served = Spawned::serve(&[]);
    let base = format!("http://{}", served.field("http_addr"));
    let client = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(0).build().expect("client");
    let pause = |path: &'static str| {
        let request = client.post(format!("{base}{path}")).json(&json!({"lora_name": "meow"}));
        async move { assert!(request.send().await.expect("send").status().is_success(), "{path}") }
    };

    // A round of small bodies first, so that what the server sets up once for a hundred connections (threads,
    // pools, the allocator's arenas) is in the baseline; then the measured round of 1 MiB bodies.
    for (round, bytes) in [(0, 0), (1, BODY_BYTES)] {
        pause("/skyrl/v1/abort_lora_requests").await;
        let before = resident_bytes(served.pid());
        let requests = send_all(&client, &base, HELD, bytes);
        wait_for_held(&client, &base, HELD as u64).await;
        let during = resident_bytes(served.pid());
        if round == 1 {
            let growth = during.saturating_sub(before);
            eprintln!("RSS: {before} B before, {during} B with {HELD} held (+{growth} B)");
            assert!(
                growth < MAX_GROWTH_BYTES,
                "{HELD} held requests of {bytes} B each grew the server by {growth} B (limit {MAX_GROWTH_BYTES})"
            );
        }
        pause("/skyrl/v1/resume_lora_requests").await;
        for request in requests {
            assert_eq!(request.await.expect("task"), reqwest::StatusCode::OK, "every held request completes");
        }
        wait_for_held(&client, &base, 0).await;
    }
    assert!(served.terminate().success());
}
