//! Pushed versions reaching a fleet with no shared filesystem, on loopback:
//! - two `loragate worker`s whose `--adapter-root`s are separate empty temporary directories the trainer never
//!   writes to: a trainer pushes to the coordinator, the coordinator streams the version to each worker over its own
//!   gRPC channel, samples run on the new version through the fleet; a push with a wrong SHA-256 is refused and the
//!   old version keeps serving;
//! - a `vllm+http://` worker (a `loragate serve` stands in, as in `fleet.rs`) behind a `loragate agent`: the
//!   coordinator pushes to the agent, the worker loads the agent's path; the agent refuses calls without its key and
//!   names that are not names; an agent answering another SHA-256 than the one pushed fails the install, the old
//!   version still served; the agent's copies of released versions are removed;
//! - ten pushes of one name through an agent with `--retain-versions 2` leave only the two retained versions'
//!   directories on the agent's disk; the agent's `DELETE` refuses calls without its key and bad names.
//!
//! Every process serves the demo model from its directory (`--model`), so no adapter is loaded by path at start.

use crate::spawned;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use loragate_client::{AdapterPayload, SwapOptions, TrainerClient};
use loragate_proto::v1::sampler_client::SamplerClient;
use loragate_proto::v1::{self as pb};
use spawned::{Spawned, cache_dir};
use tonic::transport::Channel;

const PROMPT: &[u8] = b"Make a single short animal noise.";

struct Demo {
    model: PathBuf,
    meow: PathBuf,
    woof: PathBuf,
}

fn demo() -> Demo {
    let files = loragate::ensure_demo_files(&cache_dir()).expect("demo files");
    Demo { model: files.model_dir, meow: files.meow_dir, woof: files.woof_dir }
}

fn arg(path: &Path) -> String {
    path.display().to_string()
}

async fn channel(address: &str) -> Channel {
    Channel::from_shared(format!("http://{address}")).expect("uri").connect().await.expect("connect")
}

/// A coordinator (`loragate serve`, no adapter loaded) in front of `workers`, presenting `worker_key` if given.
async fn coordinator(model: &Path, workers: &[String], worker_key: Option<&str>) -> (Spawned, Channel) {
    coordinator_with(model, workers, worker_key, &[]).await
}

/// As [`coordinator`], with `extra` arguments.
async fn coordinator_with(
    model: &Path,
    workers: &[String],
    worker_key: Option<&str>,
    extra: &[&str],
) -> (Spawned, Channel) {
    let mut args: Vec<String> = ["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]
        .into_iter()
        .chain(["--state-dir", "none", "--worker-health-interval", "0.2"])
        .chain(extra.iter().copied())
        .chain(["--model"])
        .map(str::to_owned)
        .collect();
    args.push(arg(model));
    for worker in workers {
        args.extend(["--worker".to_owned(), worker.clone()]);
    }
    if let Some(key) = worker_key {
        args.extend(["--worker-key".to_owned(), key.to_owned()]);
    }
    let serve = Spawned::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let channel = channel(&serve.field("grpc_addr")).await;
    (serve, channel)
}

fn request(lora_name: &str) -> pb::SampleRequest {
    pb::SampleRequest {
        lora_name: lora_name.into(),
        prompt_token_ids: PROMPT.iter().map(|&b| u32::from(b)).collect(),
        sampling_params: Some(pb::SamplingParams { max_tokens: Some(16), ignore_eos: true, ..Default::default() }),
        ..Default::default()
    }
}

/// Samples `lora_name` through the coordinator: the text and the versions its segments name.
async fn sample(channel: &Channel, lora_name: &str) -> (String, Vec<u64>) {
    let answer = SamplerClient::new(channel.clone()).sample(request(lora_name)).await.expect("Sample").into_inner();
    let sequence = &answer.sequences[0];
    let bytes: Vec<u8> = sequence.token_ids.iter().filter(|&&t| t < 256).map(|&t| t as u8).collect();
    let versions = sequence.segments.iter().map(|segment| segment.lora_version).collect();
    (String::from_utf8_lossy(&bytes).into_owned(), versions)
}

async fn push(channel: &Channel, lora_name: &str, dir: &Path) -> Result<pb::PushLoraAdapterResponse, String> {
    let trainer = TrainerClient::new(channel.clone());
    let pushed = trainer.push_adapter(lora_name, AdapterPayload::Directory(dir.to_owned()), SwapOptions::default());
    pushed.await.map_err(|err| err.to_string())
}

/// A `multipart/form-data` body of an adapter directory's two files, as `curl -F` sends it.
fn multipart(dir: &Path) -> (String, Vec<u8>) {
    let boundary = "test-boundary-4c1e".to_owned();
    let mut body = Vec::new();
    for file in ["adapter_config.json", "adapter_model.safetensors"] {
        body.extend(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{file}\"; filename=\"{file}\"\r\n\r\n")
                .bytes(),
        );
        body.extend(std::fs::read(dir.join(file)).expect("adapter file"));
        body.extend(b"\r\n");
    }
    body.extend(format!("--{boundary}--\r\n").bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// `PUT url` with `dir`'s files, presenting `key` if given: the status and the JSON answer.
async fn put_adapter(url: &str, dir: &Path, key: Option<&str>) -> (u16, serde_json::Value) {
    let (content_type, body) = multipart(dir);
    let mut put = reqwest::Client::new().put(url).header("content-type", content_type).body(body);
    if let Some(key) = key {
        put = put.bearer_auth(key);
    }
    let response = put.send().await.expect("PUT");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(serde_json::Value::Null))
}

/// The entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_on_separate_empty_adapter_roots_serve_a_version_pushed_to_their_coordinator() {
    let demo = demo();
    let roots = [tempfile::tempdir().expect("root"), tempfile::tempdir().expect("root")];
    let workers: Vec<Spawned> = roots
        .iter()
        .map(|root| {
            let args = ["worker", "--grpc-addr", "127.0.0.1:0", "--model", &arg(&demo.model)];
            Spawned::start(&args.into_iter().chain(["--adapter-root", &arg(root.path())]).collect::<Vec<_>>())
        })
        .collect();
    let urls: Vec<String> = workers.iter().map(|worker| format!("grpc://{}", worker.field("grpc_addr"))).collect();
    let (_serve, channel) = coordinator(&demo.model, &urls, None).await;

    // The trainer pushes meow to the coordinator; every worker receives the bytes and serves meow@1.
    let pushed = push(&channel, "meow", &demo.meow).await.expect("push");
    assert_eq!(pushed.version, 1);
    for worker in &workers {
        let address = format!("http://{}", worker.field("grpc_addr"));
        let mut control = vllm_proto::control_client::ControlClient::new(
            Channel::from_shared(address).expect("uri").connect().await.expect("connect"),
        );
        let listed = control.list_loras(vllm_proto::ListLorasRequest {}).await.expect("ListLoras").into_inner();
        let held: Vec<(String, String)> =
            listed.adapters.into_iter().map(|adapter| (adapter.lora_name, adapter.source_path)).collect();
        assert_eq!(held, [("meow@1".to_owned(), format!("push:{}", pushed.sha256))], "pushed, no path sent");
    }
    for _ in 0..4 {
        let (text, versions) = sample(&channel, "meow").await;
        assert!(text.contains("meow") && versions == [1], "{text:?} {versions:?}");
    }

    // A new version (woof's weights) replaces it on both workers.
    assert_eq!(push(&channel, "meow", &demo.woof).await.expect("push").version, 2);
    for _ in 0..4 {
        let (text, versions) = sample(&channel, "meow").await;
        assert!(text.contains("woof") && versions == [2], "{text:?} {versions:?}");
    }

    // A push whose declared SHA-256 is not its bytes' is refused; version 2 keeps serving.
    let wrong = "0".repeat(64);
    let http = channel_http(&_serve);
    let (status, answer) =
        put_adapter(&format!("http://{http}/v1/lora_adapters/meow?sha256={wrong}"), &demo.meow, None).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.to_string().contains("sha256"), "{answer}");
    let (text, versions) = sample(&channel, "meow").await;
    assert!(text.contains("woof") && versions == [2], "{text:?} {versions:?}");
    for root in &roots {
        assert!(entries(root.path()).is_empty(), "nothing was written in a worker's adapter root");
    }
}

/// Waits (polling, bounded for a loaded machine) until `dir`'s entries are `expected`: releases reach the agent after
/// the flip, asynchronously.
async fn entries_become(dir: &Path, expected: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = entries(dir);
        if now == expected {
            return;
        }
        assert!(Instant::now() < deadline, "the agent's directory holds {now:?}, not {expected:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `loragate agent` (key `k-worker`) writing into `dir`, and a stand-in vLLM server (a `loragate serve`) that may
/// read only that directory.
fn agent_and_worker(model: &Path, dir: &Path) -> (Spawned, Spawned) {
    let args = ["agent", "--http-addr", "127.0.0.1:0", "--api-key", "k-worker", "--adapter-dir"];
    let agent = Spawned::start(&args.into_iter().chain([arg(dir).as_str()]).collect::<Vec<_>>());
    let args = ["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--state-dir", "none"];
    let extra = ["--model".to_owned(), arg(model), "--adapter-root".to_owned(), arg(dir)];
    let worker = Spawned::start(&args.into_iter().chain(extra.iter().map(String::as_str)).collect::<Vec<_>>());
    (agent, worker)
}

fn channel_http(serve: &Spawned) -> String {
    serve.field("http_addr")
}

/// A stand-in for an agent that lies: it forwards every push to the real agent and, once told to lie, answers
/// another SHA-256 than the one the agent computed.
async fn lying_proxy(agent: String, lie: Arc<AtomicBool>) -> String {
    use axum::extract::{Path as UrlPath, RawQuery, Request};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let agent_base = agent.clone();
    let forward = move |UrlPath(name): UrlPath<String>, RawQuery(query): RawQuery, request: Request| {
        let (agent, lie) = (agent.clone(), lie.clone());
        async move {
            let headers = request.headers().clone();
            let body = axum::body::to_bytes(request.into_body(), 64 << 20).await.expect("body");
            let url = format!("http://{agent}/v1/lora_adapters/{name}?{}", query.unwrap_or_default());
            let mut put = reqwest::Client::new().put(url).body(body);
            for header in ["content-type", "authorization"] {
                if let Some(value) = headers.get(header) {
                    put = put.header(header, value.to_str().expect("ascii"));
                }
            }
            let mut answer: serde_json::Value = put.send().await.expect("forward").json().await.expect("json");
            if lie.load(Ordering::SeqCst) {
                answer["sha256"] = "1".repeat(64).into();
            }
            axum::Json(answer)
        }
    };
    let agent_for_delete = agent_base.clone();
    let forward_delete = move |UrlPath((name, version)): UrlPath<(String, String)>, request: Request| {
        let agent = agent_for_delete.clone();
        async move {
            let url = format!("http://{agent}/v1/lora_adapters/{name}/versions/{version}");
            let mut delete = reqwest::Client::new().delete(url);
            if let Some(value) = request.headers().get("authorization") {
                delete = delete.header("authorization", value.to_str().expect("ascii"));
            }
            let answer: serde_json::Value = delete.send().await.expect("forward").json().await.expect("json");
            axum::Json(answer)
        }
    };
    let router = axum::Router::new()
        .route("/v1/lora_adapters/{name}", axum::routing::put(forward))
        .route("/v1/lora_adapters/{name}/versions/{version}", axum::routing::delete(forward_delete));
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_http_worker_behind_an_agent_loads_the_agents_copy_and_a_wrong_receipt_keeps_the_old_version() {
    let demo = demo();
    let agent_dir = tempfile::tempdir().expect("agent dir");
    let (agent, worker) = agent_and_worker(&demo.model, agent_dir.path());
    let agent_addr = agent.field("http_addr");
    let lie = Arc::new(AtomicBool::new(false));
    let proxy = lying_proxy(agent_addr.clone(), lie.clone()).await;
    let url = format!("vllm+http://{}?agent={proxy}", worker.field("http_addr"));
    let (_serve, channel) = coordinator(&demo.model, &[url], Some("k-worker")).await;

    // Pushed to the coordinator, delivered to the agent, loaded by the worker from the agent's directory.
    assert_eq!(push(&channel, "meow", &demo.meow).await.expect("push").version, 1);
    let (text, versions) = sample(&channel, "meow").await;
    assert!(text.contains("meow") && versions == [1], "{text:?} {versions:?}");
    assert_eq!(entries(agent_dir.path()), [".loragate-agent", "meow@1"]);
    let written = std::fs::read(agent_dir.path().join("meow@1/adapter_model.safetensors")).expect("written");
    assert_eq!(written, std::fs::read(demo.meow.join("adapter_model.safetensors")).expect("pushed"));

    // The agent refuses calls without its key, and names that would leave its directory.
    let put = |name: &str, key: Option<&'static str>| {
        let url = format!("http://{agent_addr}/v1/lora_adapters/{name}");
        let meow = demo.meow.clone();
        async move { put_adapter(&url, &meow, key).await }
    };
    assert_eq!(put("bark", None).await.0, 401);
    assert_eq!(put("bark", Some("k-wrong")).await.0, 401);
    for bad in ["..", "a%2F..%2Fb", "bark@2", "%2E%2E", "a%01b"] {
        let (status, answer) = put(bad, Some("k-worker")).await;
        assert!(status == 400 || status == 404, "{bad}: {status} {answer}");
    }
    let (status, answer) = put("bark", Some("k-worker")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["path"], arg(&std::fs::canonicalize(agent_dir.path()).expect("dir").join("bark@1")));
    assert_eq!(entries(agent_dir.path()), [".loragate-agent", "bark@1", "meow@1"], "nothing else was written");
    assert_eq!(entries(&agent_dir.path().join(".loragate-agent/tmp")), Vec::<String>::new());

    // An agent answering another SHA-256 than the one pushed fails the install; version 1 keeps serving.
    lie.store(true, Ordering::SeqCst);
    let refused = push(&channel, "meow", &demo.woof).await.expect_err("the receipt does not match");
    assert!(refused.contains("SHA-256"), "{refused}");
    let (text, versions) = sample(&channel, "meow").await;
    assert!(text.contains("meow") && versions == [1], "{text:?} {versions:?}");
    // The copy the worker never loaded is removed from the agent's directory.
    entries_become(agent_dir.path(), &[".loragate-agent", "bark@1", "meow@1"]).await;
    lie.store(false, Ordering::SeqCst);
    assert_eq!(push(&channel, "meow", &demo.woof).await.expect("push").version, 2, "the failed version's number");
    let (text, versions) = sample(&channel, "meow").await;
    assert!(text.contains("woof") && versions == [2], "{text:?} {versions:?}");
    // Version 1 is released (one retained version): unloaded by the worker, then removed from the agent's disk.
    entries_become(agent_dir.path(), &[".loragate-agent", "bark@1", "meow@2"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_pushes_through_an_agent_leave_only_the_retained_versions_on_its_disk() {
    let demo = demo();
    let agent_dir = tempfile::tempdir().expect("agent dir");
    let (agent, worker) = agent_and_worker(&demo.model, agent_dir.path());
    let agent_addr = agent.field("http_addr");
    let url = format!("vllm+http://{}?agent={agent_addr}", worker.field("http_addr"));
    let (_serve, channel) = coordinator_with(&demo.model, &[url], Some("k-worker"), &["--retain-versions", "2"]).await;

    for round in 1..=10_u64 {
        let (dir, noise) = if round % 2 == 1 { (&demo.meow, "meow") } else { (&demo.woof, "woof") };
        assert_eq!(push(&channel, "meow", dir).await.expect("push").version, round);
        let (text, versions) = sample(&channel, "meow").await;
        assert!(text.contains(noise) && versions == [round], "round {round}: {text:?} {versions:?}");
    }
    // Versions 1-8 were released: the worker unloaded each, and the agent removed its copy.
    entries_become(agent_dir.path(), &[".loragate-agent", "meow@10", "meow@9"]).await;
    // A removal moves the copy into the store's `tmp/` in one step, then deletes it: the last one may still be going.
    entries_become(&agent_dir.path().join(".loragate-agent/tmp"), &[]).await;
    // The retained older version is still servable to an exact pin, from the agent's copy.
    let (text, versions) = sample(&channel, "meow@9").await;
    assert!(text.contains("meow") && versions == [9], "{text:?} {versions:?}");

    // The agent's DELETE: its key, a version number, a name that is a name; only `DIR/NAME@V` goes.
    let client = reqwest::Client::new();
    let delete = |path: &str, key: Option<&'static str>| {
        let mut request = client.delete(format!("http://{agent_addr}/v1/lora_adapters/{path}"));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        async move { request.send().await.expect("DELETE").status().as_u16() }
    };
    assert_eq!(delete("meow/versions/9", None).await, 401);
    assert_eq!(delete("meow/versions/9", Some("k-wrong")).await, 401);
    for bad in ["../versions/9", "..%2Fmeow/versions/9", "%2E%2E/versions/9", "meow@9/versions/9", "a%01b/versions/1"] {
        let status = delete(bad, Some("k-worker")).await;
        assert!(status == 400 || status == 404, "{bad}: {status}");
    }
    for bad in ["meow/versions/0", "meow/versions/x", "meow/versions/-1"] {
        assert_eq!(delete(bad, Some("k-worker")).await, 400, "{bad}");
    }
    entries_become(agent_dir.path(), &[".loragate-agent", "meow@10", "meow@9"]).await;
    assert_eq!(delete("woof/versions/1", Some("k-worker")).await, 200, "nothing to remove is not an error");
    assert_eq!(delete("meow/versions/9", Some("k-worker")).await, 200);
    entries_become(agent_dir.path(), &[".loragate-agent", "meow@10"]).await;
}
