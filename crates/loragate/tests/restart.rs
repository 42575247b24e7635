//! `loragate serve --state-dir DIR` killed (SIGKILL, no shutdown) and started again on the same directory: adapters
//! come back at their versions, no version is ever issued twice, pauses hold with their ids, owners and leases (a
//! lease that ran out while the server was down is gone), an adapter whose directory vanished is listed with its
//! error and refuses samples, two servers never share a directory, and Tinker futures survive (a sample pending at
//! the kill resolves afterwards under its request id, for the SDK's HTTP calls and for the unmodified SDK itself; a
//! finished result is served again; a sample killed while it runs continues from the tokens it had recorded). Every
//! server here has its own temporary state directory.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use loragate_core::state::StateStore;
use loragate_core::testing::eventually_within;
use loragate_proto::v1::lora_control_client::LoraControlClient;
use loragate_proto::v1::{self as pb};
use loragate_tinker::proto::tinker_public::{SampleResponse, StopReason};
use prost::Message;
use rand::Rng;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

use crate::spawned;

use spawned::Spawned;

/// A `loragate serve` on the demo model, on free ports, recording into `state_dir`; killed (SIGKILL) when dropped.
struct Server {
    spawned: Spawned,
    grpc_addr: String,
    http_addr: String,
}

impl Server {
    fn start(state_dir: &Path, extra: &[&str]) -> Self {
        Self::try_start(state_dir, extra).unwrap_or_else(|stderr| panic!("loragate serve did not start: {stderr}"))
    }

    /// Starts it; its stderr if it exits before its ready line.
    fn try_start(state_dir: &Path, extra: &[&str]) -> Result<Self, String> {
        Self::try_start_at(state_dir, "127.0.0.1:0", extra)
    }

    /// Starts it with its HTTP listener on `http_addr` (the address of a server killed before).
    fn start_at(state_dir: &Path, http_addr: &str) -> Self {
        Self::try_start_at(state_dir, http_addr, &[])
            .unwrap_or_else(|stderr| panic!("loragate serve did not start: {stderr}"))
    }

    fn try_start_at(state_dir: &Path, http_addr: &str, extra: &[&str]) -> Result<Self, String> {
        let dir = state_dir.to_str().expect("a UTF-8 temporary path");
        let mut args = vec!["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", http_addr, "--state-dir", dir];
        args.extend_from_slice(extra);
        let spawned = Spawned::try_start(&args)?;
        assert_eq!(spawned.ready["state_dir"].as_str(), Some(dir), "{}", spawned.ready);
        Ok(Self { grpc_addr: spawned.field("grpc_addr"), http_addr: spawned.field("http_addr"), spawned })
    }

    async fn control(&self) -> LoraControlClient<Channel> {
        let channel = Channel::from_shared(format!("http://{}", self.grpc_addr)).expect("uri");
        LoraControlClient::new(channel.connect().await.expect("gRPC connects"))
    }

    /// SIGKILL: nothing is flushed or shut down.
    fn kill(mut self) {
        self.spawned.kill();
    }
}

async fn load(control: &mut LoraControlClient<Channel>, name: &str, path: &str) -> Result<u64, tonic::Status> {
    let request = pb::LoadLoraAdapterRequest { lora_name: name.into(), path: path.into() };
    Ok(control.load_lora_adapter(request).await?.into_inner().version)
}

async fn pause(control: &mut LoraControlClient<Channel>, name: &str, owner: &str, lease_s: f64) -> String {
    let request = pb::AbortLoraRequestsRequest {
        lora_name: name.into(),
        mode: pb::PauseMode::Keep.into(),
        owner: owner.into(),
        lease_s,
        kv_policy: pb::KvPolicy::Unspecified.into(),
    };
    control.abort_lora_requests(request).await.expect("paused").into_inner().pause_id
}

async fn adapters(control: &mut LoraControlClient<Channel>) -> Vec<pb::LoraAdapterStatus> {
    control.list_lora_adapters(pb::ListLoraAdaptersRequest {}).await.expect("listed").into_inner().adapters
}

async fn adapter(control: &mut LoraControlClient<Channel>, name: &str) -> pb::LoraAdapterStatus {
    let listed = adapters(control).await;
    listed.into_iter().find(|adapter| adapter.lora_name == name).unwrap_or_else(|| panic!("{name} is listed"))
}

#[tokio::test]
async fn versions_pauses_and_leases_survive_a_kill() {
    let state = tempfile::tempdir().expect("state dir");
    let server = Server::start(state.path(), &[]);
    let mut control = server.control().await;
    assert_eq!(adapter(&mut control, "meow").await.version, 1);
    assert_eq!(load(&mut control, "meow", "woof").await.expect("swapped to woof's weights"), 2);
    let trainer = pause(&mut control, "meow", "trainer", 600.0).await;
    pause(&mut control, "woof", "short-lived", 1.0).await;
    server.kill();

    let server = Server::start(state.path(), &[]);
    let mut control = server.control().await;
    let meow = adapter(&mut control, "meow").await;
    assert_eq!(meow.version, 2, "the demo's meow flag is unchanged: what was loaded since stays");
    assert!(meow.paused && meow.weights_error.is_empty(), "{meow:?}");
    let held = &meow.pauses[0];
    assert_eq!((held.pause_id.as_str(), held.owner.as_str()), (trainer.as_str(), "trainer"));
    assert_eq!(held.mode, i32::from(pb::PauseMode::Keep));
    assert!(held.lease_left_s > 0.0 && held.lease_left_s <= 600.0, "{held:?}");
    eventually_within("woof's 1 s lease has ended", spawned::PATIENCE, || {
        let mut control = control.clone();
        async move { !adapter(&mut control, "woof").await.paused }
    })
    .await;

    let resumed = pb::ResumeLoraRequestsRequest { lora_name: "meow".into(), pause_id: trainer };
    assert!(control.resume_lora_requests(resumed).await.expect("resumed").into_inner().was_paused);
    assert_eq!(load(&mut control, "meow", "meow").await.expect("loads"), 3, "versions continue above 2");
    server.kill();
}

#[tokio::test]
async fn kills_at_random_points_never_lose_an_answered_change_or_repeat_a_version() {
    let state = tempfile::tempdir().expect("state dir");
    let mut highest_answered = 1; // The demo's meow starts at version 1.
    let mut trainer_pause: Option<String> = None;
    for round in 0..4 {
        let server = Server::start(state.path(), &[]);
        let mut control = server.control().await;
        let meow = adapter(&mut control, "meow").await;
        assert!(meow.version >= highest_answered, "round {round}: version {} < {highest_answered}", meow.version);
        if let Some(pause_id) = &trainer_pause {
            let ids: Vec<&str> = meow.pauses.iter().map(|pause| pause.pause_id.as_str()).collect();
            assert_eq!(ids, [pause_id.as_str()], "round {round}: the answered pause is kept");
        }
        // Loads and pause renewals, one after the other, until a kill at a random point.
        let killer = {
            let pid = server.spawned.pid().to_string();
            let after = Duration::from_millis(rand::rng().random_range(50..600));
            std::thread::spawn(move || {
                std::thread::sleep(after);
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            })
        };
        for step in 0.. {
            let path = if step % 2 == 0 { "woof" } else { "meow" };
            match load(&mut control, "meow", path).await {
                Ok(version) => {
                    assert!(version > highest_answered, "round {round}: version {version} was issued twice");
                    highest_answered = version;
                }
                Err(status) => {
                    assert_ne!(status.code(), Code::InvalidArgument, "{status:?}");
                    break; // Killed.
                }
            }
            let request = pb::AbortLoraRequestsRequest {
                lora_name: "meow".into(),
                mode: pb::PauseMode::Keep.into(),
                owner: "trainer".into(),
                lease_s: 3600.0,
                kv_policy: pb::KvPolicy::Reuse.into(),
            };
            match control.abort_lora_requests(request).await {
                Ok(answer) => trainer_pause = Some(answer.into_inner().pause_id),
                Err(_) => break,
            }
        }
        killer.join().expect("the killer thread");
        server.kill();
    }
    let server = Server::start(state.path(), &[]);
    let mut control = server.control().await;
    let next = load(&mut control, "meow", "meow").await.expect("loads");
    assert!(next > highest_answered, "the next version {next} is above every answered one ({highest_answered})");
}

#[tokio::test]
async fn an_adapter_whose_directory_vanished_is_listed_with_its_error_and_refuses_samples() {
    let state = tempfile::tempdir().expect("state dir");
    let root = tempfile::tempdir().expect("adapter root");
    let demo = loragate::ensure_demo_files(&spawned::cache_dir()).expect("the demo files");
    let copy = |to: &str| {
        std::fs::create_dir_all(root.path().join(to)).expect("mkdir");
        for file in ["adapter_config.json", "adapter_model.safetensors"] {
            std::fs::copy(demo.meow_dir.join(file), root.path().join(to).join(file)).expect("copy");
        }
    };
    copy("pet");
    copy("pet-again");
    let root_arg = root.path().to_str().expect("utf-8").to_owned();
    let server = Server::start(state.path(), &["--adapter-root", &root_arg]);
    let mut control = server.control().await;
    assert_eq!(load(&mut control, "pet", "pet").await.expect("loads"), 1);
    server.kill();
    std::fs::remove_dir_all(root.path().join("pet")).expect("the directory vanishes");

    let server = Server::start(state.path(), &["--adapter-root", &root_arg]);
    let mut control = server.control().await;
    let pet = adapter(&mut control, "pet").await;
    assert_eq!(pet.version, 1, "listed at its recorded version");
    assert!(pet.weights_error.contains("pet") && pet.weights_error.contains("v1"), "{}", pet.weights_error);

    let completion = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", server.http_addr))
        .json(&serde_json::json!({"model": "pet", "prompt": "Hi", "max_tokens": 2}))
        .send()
        .await
        .expect("answers");
    assert_eq!(completion.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let body = completion.text().await.expect("body");
    assert!(body.contains("has no weights") && body.contains("pet"), "{body}");

    assert_eq!(load(&mut control, "pet", "pet-again").await.expect("a load heals it"), 2);
    assert!(adapter(&mut control, "pet").await.weights_error.is_empty());
    let completion = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", server.http_addr))
        .json(&serde_json::json!({"model": "pet", "prompt": "Hi", "max_tokens": 2}))
        .send()
        .await
        .expect("answers");
    assert!(completion.status().is_success(), "{:?}", completion.text().await);
    server.kill();
}

#[tokio::test]
async fn two_servers_never_share_a_state_directory() {
    let state = tempfile::tempdir().expect("state dir");
    let first = Server::start(state.path(), &[]);
    let Err(stderr) = Server::try_start(state.path(), &[]) else { panic!("a second server on the same directory") };
    let dir = state.path().display().to_string();
    assert!(stderr.contains("--state-dir") && stderr.contains(&dir) && stderr.contains("another"), "{stderr}");
    first.kill();
}

/// The Tinker front's HTTP calls, shaped as the SDK (0.38) makes them.
struct Tinker {
    http: reqwest::Client,
    base: String,
}

/// What one `retrieve_future` answered.
enum Polled {
    Finished(bytes::Bytes),
    Json(StatusCode, Value),
}

impl Tinker {
    fn of(server: &Server) -> Self {
        let http = reqwest::Client::builder().no_proxy().build().expect("an HTTP client");
        Self { http, base: format!("http://{}/api/v1", server.http_addr) }
    }

    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.http.post(format!("{}/{path}", self.base)).json(&body).send().await.expect("the server answers")
    }

    async fn sampling_session(&self, adapter: &str) -> String {
        let body = json!({"session_id": "s", "sampling_session_seq_id": 0, "model_path": format!("tinker://loragate/{adapter}")});
        let answer: Value = self.post("create_sampling_session", body).await.json().await.expect("JSON");
        answer["sampling_session_id"].as_str().expect("a sampling session id").to_owned()
    }

    /// A greedy sample of exactly `max_tokens` per sequence (nothing stops it earlier); answers its request id.
    async fn asample(&self, session: &str, seq_id: i64, num_samples: u32, max_tokens: u32) -> String {
        let body = json!({
            "sampling_session_id": session, "seq_id": seq_id, "num_samples": num_samples,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": b"The animal says:".to_vec()}]},
            "sampling_params": {"max_tokens": max_tokens, "temperature": 0.0, "top_k": -1, "top_p": 1.0, "stop": []},
            "prompt_logprobs": false, "topk_prompt_logprobs": 0, "topk_sample_logprobs": 0,
            "prompt_alt_tokens_k": 0, "record_stability_info": false, "type": "sample"
        });
        let response = self.post("asample", body).await;
        assert_eq!(response.status(), StatusCode::OK);
        let answer: Value = response.json().await.expect("JSON");
        answer["request_id"].as_str().expect("a request id").to_owned()
    }

    async fn poll(&self, request_id: &str) -> Polled {
        let response =
            self.post("retrieve_future", json!({"request_id": request_id, "allow_metadata_only": true})).await;
        let status = response.status();
        let protobuf = response.headers().get("content-type").is_some_and(|kind| kind == "application/x-protobuf");
        let body = response.bytes().await.expect("a body");
        if protobuf {
            Polled::Finished(body)
        } else {
            Polled::Json(status, serde_json::from_slice(&body).expect("a JSON body"))
        }
    }

    /// Polls as the SDK does until the sample finished; its encoded `SampleResponse`.
    async fn retrieve(&self, request_id: &str) -> bytes::Bytes {
        let deadline = std::time::Instant::now() + spawned::PATIENCE;
        loop {
            match self.poll(request_id).await {
                Polled::Finished(bytes) => return bytes,
                Polled::Json(StatusCode::OK, body) if body["type"] == "try_again" => {}
                Polled::Json(status, body) => panic!("{request_id}: {status} {body}"),
            }
            assert!(std::time::Instant::now() < deadline, "{request_id} stayed pending");
        }
    }

    /// The queue state a poll of a pending future answers.
    async fn queue_state(&self, request_id: &str) -> Value {
        match self.poll(request_id).await {
            Polled::Json(StatusCode::OK, body) if body["type"] == "try_again" => body["queue_state"].clone(),
            Polled::Json(status, body) => panic!("{request_id} is not pending: {status} {body}"),
            Polled::Finished(_) => panic!("{request_id} is not pending: it finished"),
        }
    }
}

#[tokio::test]
async fn tinker_futures_survive_a_kill_a_pending_sample_resolves_and_a_result_is_served_again() {
    let state = tempfile::tempdir().expect("state dir");
    let server = Server::start(state.path(), &[]);
    let tinker = Tinker::of(&server);
    let woof = tinker.sampling_session("woof").await;
    let finished = tinker.asample(&woof, 0, 1, 8).await;
    let result = tinker.retrieve(&finished).await;
    // The pause answers once recorded; the store commits in the order changes were queued, and the result's record
    // was queued when the sample settled, before the poll above answered: the result is durable too.
    let mut control = server.control().await;
    let trainer = pause(&mut control, "meow", "trainer", 600.0).await;
    let meow = tinker.sampling_session("meow").await;
    // `asample` answers once the pending sample is recorded.
    let pending = tinker.asample(&meow, 0, 2, 24).await;
    assert_eq!(tinker.queue_state(&pending).await, "paused_capacity");
    server.kill();

    let server = Server::start(state.path(), &[]);
    let tinker = Tinker::of(&server);
    assert_eq!(tinker.retrieve(&finished).await, result, "the finished result is served again under its id");
    assert_eq!(tinker.queue_state(&pending).await, "paused_capacity", "pending under its id, meow still paused");
    let mut control = server.control().await;
    let resumed = pb::ResumeLoraRequestsRequest { lora_name: "meow".into(), pause_id: trainer };
    assert!(control.resume_lora_requests(resumed).await.expect("resumed").into_inner().was_paused);
    let response = SampleResponse::decode(tinker.retrieve(&pending).await).expect("a SampleResponse");
    assert_eq!(response.sequences.len(), 2);
    for sequence in &response.sequences {
        assert_eq!(sequence.tokens.len(), 4 * 24, "the whole budget, as int32s: {sequence:?}");
        assert_eq!(sequence.stop_reason(), StopReason::Length);
    }
    server.kill();
}

/// The tokens each sequence of the pending Tinker sample `request_id` had recorded in `state_dir` (read with the
/// server stopped).
async fn recorded_tokens(state_dir: &Path, request_id: &str) -> Vec<Vec<u32>> {
    let store = loragate_state::EmbeddedStore::open(state_dir).expect("the state opens");
    let records = store.recorded().await.expect("read").front_records;
    let record = records.iter().find(|record| record.key == request_id).expect("the sample is recorded");
    let value: Value = serde_json::from_str(&record.value).expect("a JSON record");
    assert_eq!(value["state"], "pending", "{value}");
    let sequences = value["produced"]["sequences"].as_array().cloned().unwrap_or_default();
    sequences.iter().map(|sequence| serde_json::from_value(sequence["tokens"].clone()).expect("token ids")).collect()
}

/// A greedy Tinker sample killed (SIGKILL) while it runs keeps the tokens it had recorded: after the restart its future
/// resolves with the whole budget, starting with exactly those tokens, and the restarted server generated only the
/// rest (each sequence continued from its recorded tokens, not from the prompt).
#[tokio::test]
async fn a_tinker_sample_killed_mid_sample_continues_from_the_tokens_it_had_recorded() {
    const SAMPLES: usize = 2;
    const TOKENS: usize = 3000;
    let state = tempfile::tempdir().expect("state dir");
    let server = Server::start(state.path(), &[]);
    let http = reqwest::Client::builder().no_proxy().build().expect("an HTTP client");
    let tinker = Tinker::of(&server);
    let session = tinker.sampling_session("meow").await;
    let pending = tinker.asample(&session, 0, SAMPLES as u32, TOKENS as u32).await;
    // Progress is recorded every 128 tokens: after a thousand, several records have committed.
    eventually_within("the sample produced a thousand tokens", spawned::PATIENCE, || {
        let (http, server) = (&http, &server);
        async move { generated_tokens(http, server, "meow").await >= 1000.0 }
    })
    .await;
    server.kill();

    let recorded = recorded_tokens(state.path(), &pending).await;
    assert_eq!(recorded.len(), SAMPLES, "every sequence is recorded");
    let kept: usize = recorded.iter().map(Vec::len).sum();
    assert!(kept > 0 && recorded.iter().all(|tokens| tokens.len() < TOKENS), "mid-sample: {kept} tokens kept");

    let server = Server::start(state.path(), &[]);
    let tinker = Tinker::of(&server);
    let response = SampleResponse::decode(tinker.retrieve(&pending).await).expect("a SampleResponse");
    assert_eq!(response.sequences.len(), SAMPLES);
    for (sequence, before) in response.sequences.iter().zip(&recorded) {
        let tokens: Vec<u32> =
            sequence.tokens.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(tokens.len(), TOKENS, "the whole budget");
        assert_eq!(&tokens[..before.len()], before.as_slice(), "it starts with the tokens produced before the kill");
        assert_eq!(sequence.stop_reason(), StopReason::Length);
    }
    let generated = generated_tokens(&http, &server, "meow").await;
    assert_eq!(generated, (SAMPLES * TOKENS - kept) as f64, "the restarted server generated only the rest");
    server.kill();
}

/// A child process killed (if it still runs) when the test ends, passed or not.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What `loragate_generated_tokens_total` says `adapter` generated (summed over versions).
async fn generated_tokens(http: &reqwest::Client, server: &Server, adapter: &str) -> f64 {
    let metrics = http.get(format!("http://{}/metrics", server.http_addr)).send().await.expect("metrics");
    let text = metrics.text().await.expect("metrics text");
    let label = format!("adapter=\"{adapter}\"");
    text.lines()
        .filter(|line| line.starts_with("loragate_generated_tokens_total{") && line.contains(&label))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The unmodified Tinker SDK (`tinker==0.38.0` in `$LORAGATE_PYTHON`'s environment; skipped with a message where that
/// Python is older than 3.11, as the SDK test of `binary.rs`) waits on a sample of a paused adapter while the server is
/// killed (SIGKILL) and started again on the same address and state: once the adapter is resumed its future resolves
/// with the whole budget, and the restarted server generated each token once (the SDK polled the recorded future; it
/// did not resubmit the sample).
#[tokio::test]
async fn the_unmodified_tinker_sdks_future_resolves_across_a_kill() {
    let python = std::env::var("LORAGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let new_enough = Command::new(&python)
        .args(["-c", "import sys; sys.exit(sys.version_info < (3, 11))"])
        .status()
        .is_ok_and(|status| status.success());
    if !new_enough {
        eprintln!("SKIPPED: the tinker SDK needs Python >= 3.11, and {python} is older");
        return;
    }
    const SAMPLES: usize = 2;
    const TOKENS: usize = 24;
    let state = tempfile::tempdir().expect("state dir");
    let server = Server::start(state.path(), &[]);
    let mut control = server.control().await;
    let trainer = pause(&mut control, "meow", "trainer", 600.0).await;
    let script = spawned::repo_root().join("tests/python/tinker_restart.py");
    let base_url = format!("http://{}", server.http_addr);
    let mut sdk = KilledOnDrop(
        Command::new(&python)
            .arg(script)
            .args([base_url.as_str(), &SAMPLES.to_string(), &TOKENS.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot run {python}: {err}")),
    );
    let (lines, said) = std::sync::mpsc::channel();
    let stdout = sdk.0.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    eventually_within("the SDK's sample is held at meow's gate (accepted, so recorded)", spawned::PATIENCE, || {
        let mut control = control.clone();
        async move { adapter(&mut control, "meow").await.held >= 1 }
    })
    .await;
    let http_addr = server.http_addr.clone();
    server.kill();

    let server = Server::start_at(state.path(), &http_addr);
    let mut control = server.control().await;
    let resumed = pb::ResumeLoraRequestsRequest { lora_name: "meow".into(), pause_id: trainer };
    assert!(control.resume_lora_requests(resumed).await.expect("resumed").into_inner().was_paused);
    let answer = loop {
        let line = said.recv_timeout(spawned::PATIENCE).expect("the SDK answers in time");
        if let Some(answer) = line.strip_prefix("ok: ") {
            break serde_json::from_str::<Value>(answer).expect("the SDK's answer");
        }
    };
    let whole_budgets = serde_json::to_value(vec![TOKENS; SAMPLES]).expect("JSON");
    assert_eq!(answer["tokens"], whole_budgets, "the whole budget: {answer}");
    let http = reqwest::Client::builder().no_proxy().build().expect("an HTTP client");
    let generated = generated_tokens(&http, &server, "meow").await;
    assert_eq!(generated, (SAMPLES * TOKENS) as f64, "the restarted server generated each token once");
    let status = sdk.0.wait().expect("the SDK exits");
    assert!(status.success(), "{status}");
    server.kill();
}

#[tokio::test]
async fn a_staleness_bound_set_over_http_survives_a_kill() {
    let state = tempfile::tempdir().expect("state dir");
    let server = Server::start(state.path(), &[]);
    let http = reqwest::Client::builder().no_proxy().build().expect("client");
    let url = format!("http://{}/v1/lora_adapters/meow/staleness", server.http_addr);
    let set = http.put(&url).json(&json!({"max_staleness": 1, "batch_size": 3})).send().await.expect("PUT");
    assert_eq!(set.status(), StatusCode::OK);
    let answer: Value = set.json().await.expect("JSON");
    assert_eq!(answer["staleness"]["capacity"], 6, "(1 + 0 + 1) × 3: {answer}");
    server.kill();

    let server = Server::start(state.path(), &[]);
    let mut control = server.control().await;
    let staleness = adapter(&mut control, "meow").await.staleness.expect("the bound came back");
    assert_eq!((staleness.max_staleness, staleness.batch_size), (1, 3), "{staleness:?}");
    assert!(adapter(&mut control, "woof").await.staleness.is_none(), "only meow had one");
    let http = reqwest::Client::builder().no_proxy().build().expect("client");
    let url = format!("http://{}/v1/lora_adapters/meow/staleness", server.http_addr);
    assert_eq!(http.delete(&url).send().await.expect("DELETE").status(), StatusCode::OK);
    server.kill();

    let server = Server::start(state.path(), &[]);
    let mut control = server.control().await;
    assert!(adapter(&mut control, "meow").await.staleness.is_none(), "the DELETE was recorded too");
    server.kill();
}
