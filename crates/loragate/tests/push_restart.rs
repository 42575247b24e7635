//! Pushed adapter versions and `loragate serve --state-dir DIR` killed (SIGKILL) and started again: the pushed
//! versions come back with their sha256 and are served (the retained one by its pin), the content-addressed store
//! drops what no recorded version refers to (a stray blob, a half-received upload, a version released by a lower
//! `--retain-versions`), and versions never repeat.

use std::path::{Path, PathBuf};

use loragate_client::{AdapterPayload, SwapOptions, TrainerClient};
use loragate_core::testing::eventually_within;
use serde_json::{Value, json};

use crate::spawned::{self, Spawned};

/// `loragate serve` on the demo model, on free ports, recording into `state_dir`, retaining `retain` versions.
fn serve(state_dir: &Path, retain: u32) -> Spawned {
    let dir = state_dir.to_str().expect("a UTF-8 temporary path");
    let retain = retain.to_string();
    Spawned::start(&[
        "serve",
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        "--state-dir",
        dir,
        "--retain-versions",
        &retain,
    ])
}

/// Pushes the PEFT directory `from` to `name` over gRPC; its version and sha256.
async fn push(server: &Spawned, name: &str, from: &Path) -> (u64, String) {
    let trainer = TrainerClient::connect(server.field("grpc_addr")).await.expect("connects");
    let pushed = trainer
        .push_adapter(name, AdapterPayload::Directory(from.to_path_buf()), SwapOptions::default())
        .await
        .expect("pushed");
    (pushed.version, pushed.sha256)
}

/// `GET /v1/lora_adapters/{name}`.
async fn adapter_state(server: &Spawned, name: &str) -> Value {
    let url = format!("http://{}/v1/lora_adapters/{name}", server.field("http_addr"));
    reqwest::get(url).await.expect("answered").json().await.expect("JSON")
}

/// The version whose weights a completion for `model` (a name or a `NAME@V` pin) was sampled with.
async fn sampled_version(server: &Spawned, model: &str) -> u64 {
    let url = format!("http://{}/v1/completions", server.field("http_addr"));
    let answer: Value = reqwest::Client::new()
        .post(url)
        .json(&json!({"model": model, "prompt": "hi", "max_tokens": 3}))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    answer["choices"][0]["segments"][0]["lora_version"].as_u64().unwrap_or_else(|| panic!("segments: {answer}"))
}

/// The entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).expect("the directory").map(|entry| entry.expect("an entry").path()).collect();
    entries.sort();
    entries
}

#[tokio::test]
async fn pushed_versions_survive_a_kill_and_the_store_keeps_only_what_versions_refer_to() {
    let demo = loragate::ensure_demo_files(&spawned::cache_dir()).expect("the demo files");
    let sha_of = |dir: &Path| {
        use sha2::Digest;
        let bytes = std::fs::read(dir.join("adapter_model.safetensors")).expect("weights");
        sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect::<String>()
    };
    let (meow_sha, woof_sha) = (sha_of(&demo.meow_dir), sha_of(&demo.woof_dir));
    let state = tempfile::tempdir().expect("state dir");
    let blobs = state.path().join("adapters/blobs");
    let uploads = state.path().join("adapters/tmp");

    let server = serve(state.path(), 2);
    assert_eq!(push(&server, "purr", &demo.meow_dir).await, (1, meow_sha.clone()));
    assert_eq!(push(&server, "purr", &demo.woof_dir).await, (2, woof_sha.clone()));
    assert_eq!(entries(&blobs).len(), 2, "both retained versions have their files");
    let mut server = server;
    server.kill();

    // What a crash can leave: files no version refers to, and an upload cut off midway.
    let stray = blobs.join(format!("{}-0000000000000000", "ab".repeat(32)));
    std::fs::create_dir_all(&stray).expect("a stray blob directory");
    std::fs::write(stray.join("adapter_model.safetensors"), b"not referenced").expect("a stray file");
    std::fs::write(uploads.join("upload-cut-off"), b"half a push").expect("a half upload");

    let server = serve(state.path(), 2);
    let purr = adapter_state(&server, "purr").await;
    assert_eq!((purr["version"].as_u64(), purr["sha256"].as_str()), (Some(2), Some(woof_sha.as_str())), "{purr}");
    let listed: Vec<(Option<u64>, Option<&str>, Option<&str>)> = purr["versions"]
        .as_array()
        .unwrap_or_else(|| panic!("versions: {purr}"))
        .iter()
        .map(|version| (version["version"].as_u64(), version["sha256"].as_str(), version["source"].as_str()))
        .collect();
    assert!(listed.contains(&(Some(2), Some(woof_sha.as_str()), Some("push"))), "{purr}");
    assert!(listed.contains(&(Some(1), Some(meow_sha.as_str()), Some("push"))), "{purr}");
    assert_eq!(sampled_version(&server, "purr").await, 2);
    assert_eq!(sampled_version(&server, "purr@1").await, 1, "the retained version is served by its pin");
    eventually_within("the store is collected at start", spawned::PATIENCE, || {
        let (blobs, uploads) = (blobs.clone(), uploads.clone());
        async move { entries(&blobs).len() == 2 && entries(&uploads).is_empty() }
    })
    .await;
    assert!(!stray.exists(), "the stray blob is gone");
    let mut server = server;
    server.kill();

    // Retaining one version: version 1 is released and its files go; the versions go on from 2.
    let server = serve(state.path(), 1);
    let purr = adapter_state(&server, "purr").await;
    assert_eq!((purr["version"].as_u64(), purr["sha256"].as_str()), (Some(2), Some(woof_sha.as_str())), "{purr}");
    eventually_within("version 1's files are collected", spawned::PATIENCE, || {
        let blobs = blobs.clone();
        async move { entries(&blobs).len() == 1 }
    })
    .await;
    assert_eq!(push(&server, "purr", &demo.meow_dir).await, (3, meow_sha), "a version number is never reused");
    assert_eq!(sampled_version(&server, "purr").await, 3);
}
