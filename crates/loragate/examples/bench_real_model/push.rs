//! The push scene of issue 31 on the real model (a loragate of its own, `--retain-versions 2`, its state in a
//! temporary directory), with rank-16 random adapters adapting all seven projections of every layer:
//! - **install**: a new version of one adapter, alternately (the order turning every round) by a path load of its
//!   files from local disk (`POST /v1/load_lora_adapter`, `load_inplace`), an HTTP push (`curl -F`, another
//!   process, streaming the files from disk) and a gRPC push (the Rust `TrainerClient` streaming the directory);
//!   each timed from the call to the first token of the new version (a 1-token completion whose `segments` name
//!   it). The median of each, and each push against the path load (goal: ≤ 1.5×).
//! - **fleet**: a coordinator (`serve --worker …`) in front of three `loragate worker`s on separate empty adapter
//!   roots: a gRPC push to the coordinator, timed to the first token of the new version (the push returns once every
//!   worker serves it), against the single server's gRPC push above (goal: ≤ 2×).
//! - **retention**: 100 pushes of distinct weights to one name: the server's RSS and the store's size after the 5th
//!   and after the 100th (goal: within 10 %).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use loragate_client::{AdapterPayload, SwapOptions, TrainerClient};
use serde_json::{Value, json};

use super::{Args, Server, median, ready_line};

/// The adapter every install replaces.
const NAME: &str = "pushed";
/// Distinct weights pushed to one name in the retention part.
const RETENTION_PUSHES: usize = 100;
/// The push after which the retention part's baseline is taken.
const BASELINE_PUSH: usize = 5;
/// The adapters' rank.
const RANK: &str = "16";

/// How a version is installed.
#[derive(Clone, Copy, Debug)]
enum Install {
    PathLoad,
    HttpPush,
    GrpcPush,
}

impl Install {
    const ALL: [Install; 3] = [Install::PathLoad, Install::HttpPush, Install::GrpcPush];

    fn label(self) -> &'static str {
        match self {
            Install::PathLoad => "path load (`/v1/load_lora_adapter`, local disk)",
            Install::HttpPush => "HTTP push (`curl -F`, `PUT /v1/lora_adapters/{name}`)",
            Install::GrpcPush => "gRPC push (Rust `TrainerClient`, `PushLoraAdapter`)",
        }
    }
}

/// A loragate of the scene's own, and where its adapters and state are.
struct PushServer {
    server: Server,
    grpc_url: String,
    adapters: tempfile::TempDir,
    state: tempfile::TempDir,
}

fn start(args: &Args, model: &Path) -> PushServer {
    let adapters = tempfile::Builder::new().prefix("bench-push-adapters-").tempdir().expect("a temporary directory");
    let state = tempfile::Builder::new().prefix("bench-push-state-").tempdir().expect("a temporary directory");
    for seed in ["11", "12"] {
        let status = Command::new(&args.loragate)
            .args(["random-adapter", "--rank", RANK, "--seed", seed, "--model"])
            .arg(model)
            .arg("--out")
            .arg(adapters.path().join(format!("rank16-{seed}")))
            .stdout(Stdio::null())
            .status()
            .expect("loragate random-adapter runs");
        assert!(status.success(), "random-adapter: {status}");
    }
    let mut child = Command::new(&args.loragate)
        .arg("serve")
        .arg("--model")
        .arg(model)
        .args(["--compute-threads", &args.threads.to_string(), "--retain-versions", "2"])
        .arg("--adapter-root")
        .arg(adapters.path())
        .arg("--state-dir")
        .arg(state.path())
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(&args.loragate_args)
        .env("RUST_LOG", log_filter())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|err| panic!("cannot start {}: {err}", args.loragate.display()));
    let ready = ready_line(&mut child);
    let base_url = format!("http://{}", ready["http_addr"].as_str().expect("http_addr"));
    let grpc_url = format!("http://{}", ready["grpc_addr"].as_str().expect("grpc_addr"));
    let model = ready["model"].as_str().expect("model").to_owned();
    let server = Server { name: "loragate", child, base_url, model, extra: json!({}) };
    PushServer { server, grpc_url, adapters, state }
}

impl PushServer {
    fn adapter_dir(&self, round: usize) -> PathBuf {
        self.adapters.path().join(if round.is_multiple_of(2) { "rank16-11" } else { "rank16-12" })
    }

    /// Installs `dir` as the next version of [`NAME`] by `how`; the version installed.
    async fn install(&self, client: &reqwest::Client, trainer: &TrainerClient, how: Install, dir: &Path) -> u64 {
        match how {
            Install::PathLoad => {
                let body = json!({"lora_name": NAME, "lora_path": dir, "load_inplace": true});
                let url = format!("{}/v1/load_lora_adapter", self.server.base_url);
                let response = client.post(url).json(&body).send().await.expect("sent");
                assert!(response.status().is_success(), "path load: {}", response.status());
                self.current_version(client).await
            }
            Install::HttpPush => {
                let output = Command::new("curl")
                    .args(["-sS", "--fail-with-body", "-X", "PUT"])
                    .arg(format!("{}/v1/lora_adapters/{NAME}", self.server.base_url))
                    .arg("-F")
                    .arg(format!("adapter_config.json=@{}", dir.join("adapter_config.json").display()))
                    .arg("-F")
                    .arg(format!("adapter_model.safetensors=@{}", dir.join("adapter_model.safetensors").display()))
                    .output()
                    .expect("curl runs");
                let answer: Value = serde_json::from_slice(&output.stdout)
                    .unwrap_or_else(|_| panic!("curl: {}", String::from_utf8_lossy(&output.stderr)));
                assert!(output.status.success(), "HTTP push: {answer}");
                answer["version"].as_u64().expect("version")
            }
            Install::GrpcPush => {
                let payload = AdapterPayload::Directory(dir.to_path_buf());
                trainer.push_adapter(NAME, payload, SwapOptions::default()).await.expect("gRPC push").version
            }
        }
    }

    async fn current_version(&self, client: &reqwest::Client) -> u64 {
        let url = format!("{}/v1/lora_adapters/{NAME}", self.server.base_url);
        let state: Value = client.get(url).send().await.expect("sent").json().await.expect("JSON");
        state["version"].as_u64().unwrap_or_else(|| panic!("version in {state}"))
    }

    fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.server.child.id())).expect("status");
        let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("VmRSS");
        let kib: u64 = line.split_whitespace().nth(1).and_then(|value| value.parse().ok()).expect("a number");
        kib * 1024
    }

    /// The store's size once the collection that follows a push's answer has run (it runs after the answer, so a
    /// read right after it may still count the released version): read until two reads 100 ms apart agree, 5 s at
    /// the most.
    async fn settled_store_bytes(&self) -> u64 {
        let mut last = self.store_bytes();
        for _ in 0..50 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let now = self.store_bytes();
            if now == last {
                break;
            }
            last = now;
        }
        last
    }

    fn store_bytes(&self) -> u64 {
        fn size(path: &Path) -> u64 {
            let Ok(entries) = std::fs::read_dir(path) else { return 0 };
            entries
                .map_while(Result::ok)
                .map(|entry| match entry.metadata() {
                    Ok(meta) if meta.is_dir() => size(&entry.path()),
                    Ok(meta) => meta.len(),
                    Err(_) => 0,
                })
                .sum()
        }
        size(&self.state.path().join("adapters"))
    }
}

/// `weights` with a few values of its first tensor changed by `variant`: distinct, valid weights.
fn variant(weights: &[u8], variant: usize) -> Vec<u8> {
    let header_len = u64::from_le_bytes(weights[..8].try_into().expect("8 bytes")) as usize;
    let mut changed = weights.to_vec();
    for (index, byte) in variant.to_le_bytes().iter().take(4).enumerate() {
        changed[8 + header_len + 4 * index] = *byte;
    }
    changed
}

/// The scene: prints the install table and the retention line.
pub(crate) async fn push(args: &Args, model: &Path, client: &reqwest::Client) {
    let scene = start(args, model);
    let trainer = TrainerClient::connect(scene.grpc_url.clone()).await.expect("the trainer connects");
    let weights_bytes =
        std::fs::metadata(scene.adapter_dir(0).join("adapter_model.safetensors")).expect("weights").len();
    // A first version, and one warm-up of each way.
    for (round, how) in Install::ALL.into_iter().enumerate() {
        let version = scene.install(client, &trainer, how, &scene.adapter_dir(round)).await;
        assert_eq!(first_token_version(client, &scene.server.base_url).await, version);
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); Install::ALL.len()];
    for round in 0..args.rounds.max(1) * 3 {
        let mut order: Vec<usize> = (0..Install::ALL.len()).collect();
        order.rotate_left(round % Install::ALL.len());
        for (step, index) in order.into_iter().enumerate() {
            let dir = scene.adapter_dir(round + step);
            let started = Instant::now();
            let version = scene.install(client, &trainer, Install::ALL[index], &dir).await;
            let sampled = first_token_version(client, &scene.server.base_url).await;
            times[index].push(started.elapsed().as_secs_f64());
            assert_eq!(sampled, version, "the first token after the install is of its version");
        }
    }
    println!(
        "\npush (rank 16, all seven projections, {:.1} MB of weights; call → first token of the new version, median \
         of {} each):",
        weights_bytes as f64 / 1e6,
        times[0].len()
    );
    println!("| install | median | / path load |");
    println!("| --- | --- | --- |");
    let path_load = median(&mut times[0].clone());
    for (index, how) in Install::ALL.into_iter().enumerate() {
        let value = median(&mut times[index]);
        println!("| {} | {:.1} ms | {:.2}× |", how.label(), value * 1e3, value / path_load);
    }

    let single_grpc = median(&mut times[2].clone());
    fleet(args, model, client, &scene, single_grpc).await;

    let weights = std::fs::read(scene.adapter_dir(0).join("adapter_model.safetensors")).expect("weights");
    let distinct = scene.adapters.path().join("distinct");
    std::fs::create_dir_all(&distinct).expect("a directory");
    std::fs::copy(scene.adapter_dir(0).join("adapter_config.json"), distinct.join("adapter_config.json")).expect("cp");
    let mut baseline = None;
    for push in 1..=RETENTION_PUSHES {
        std::fs::write(distinct.join("adapter_model.safetensors"), variant(&weights, push)).expect("written");
        let payload = AdapterPayload::Directory(distinct.clone());
        trainer.push_adapter(NAME, payload, SwapOptions::default()).await.expect("a retention push");
        if push == BASELINE_PUSH {
            baseline = Some((scene.rss_bytes(), scene.settled_store_bytes().await));
        }
    }
    let (rss_before, store_before) = baseline.expect("the baseline was taken");
    let (rss_after, store_after) = (scene.rss_bytes(), scene.settled_store_bytes().await);
    println!(
        "\nretention (--retain-versions 2, {RETENTION_PUSHES} pushes of distinct weights to one name): RSS {:.1} MB \
         after push {BASELINE_PUSH}, {:.1} MB after push {RETENTION_PUSHES} ({:+.1} %); the store {:.1} MB, then \
         {:.1} MB ({:+.1} %)",
        rss_before as f64 / 1e6,
        rss_after as f64 / 1e6,
        (rss_after as f64 / rss_before as f64 - 1.0) * 100.0,
        store_before as f64 / 1e6,
        store_after as f64 / 1e6,
        (store_after as f64 / store_before as f64 - 1.0) * 100.0,
    );
}

/// The log filter of the scene's servers: `BENCH_PUSH_LOG` if set (e.g. `loragate_core=debug` for each push's
/// `adapter push timing`), else `warn`.
fn log_filter() -> String {
    std::env::var("BENCH_PUSH_LOG").unwrap_or_else(|_| "warn".to_owned())
}

/// Workers in the fleet part.
const FLEET_WORKERS: usize = 3;

/// The fleet part: three `loragate worker`s behind a coordinator; prints its line.
async fn fleet(args: &Args, model: &Path, client: &reqwest::Client, scene: &PushServer, single_grpc: f64) {
    let roots: Vec<tempfile::TempDir> = (0..FLEET_WORKERS)
        .map(|_| tempfile::Builder::new().prefix("bench-push-worker-").tempdir().expect("a temporary directory"))
        .collect();
    let workers: Vec<Server> = roots
        .iter()
        .map(|root| {
            let mut child = Command::new(&args.loragate)
                .args(["worker", "--grpc-addr", "127.0.0.1:0", "--compute-threads", &args.threads.to_string()])
                .arg("--model")
                .arg(model)
                .arg("--adapter-root")
                .arg(root.path())
                .env("RUST_LOG", log_filter())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("loragate worker starts");
            let ready = ready_line(&mut child);
            let address = format!("grpc://{}", ready["grpc_addr"].as_str().expect("grpc_addr"));
            Server { name: "worker", child, base_url: address, model: String::new(), extra: json!({}) }
        })
        .collect();
    let mut command = Command::new(&args.loragate);
    command.args(["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--state-dir", "none"]);
    command.arg("--model").arg(model);
    for worker in &workers {
        command.args(["--worker", &worker.base_url]);
    }
    let mut child =
        command.env("RUST_LOG", log_filter()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("serve");
    let ready = ready_line(&mut child);
    let base_url = format!("http://{}", ready["http_addr"].as_str().expect("http_addr"));
    let grpc_url = format!("http://{}", ready["grpc_addr"].as_str().expect("grpc_addr"));
    let coordinator = Server { name: "coordinator", child, base_url, model: String::new(), extra: json!({}) };
    let trainer = TrainerClient::connect(grpc_url).await.expect("the trainer connects");
    let mut times = Vec::new();
    let pids: Vec<u32> = std::iter::once(coordinator.child.id()).chain(workers.iter().map(|w| w.child.id())).collect();
    let mut cpu_before = None;
    for round in 0..args.rounds.max(1) * 3 + 1 {
        if round == 1 {
            cpu_before = Some((cpu_seconds(&pids), own_cpu_seconds()));
        }
        let started = Instant::now();
        let payload = AdapterPayload::Directory(scene.adapter_dir(round));
        let version = trainer.push_adapter(NAME, payload, SwapOptions::default()).await.expect("a fleet push").version;
        let sampled = first_token_version(client, &coordinator.base_url).await;
        let elapsed = started.elapsed().as_secs_f64();
        assert_eq!(sampled, version, "the first token after the push is of its version");
        if round > 0 {
            times.push(elapsed);
        }
    }
    let (servers_before, own_before) = cpu_before.expect("taken after the first push");
    let servers_cpu: Vec<f64> =
        cpu_seconds(&pids).iter().zip(&servers_before).map(|(after, before)| after - before).collect();
    let own_cpu = own_cpu_seconds() - own_before;
    let wall: f64 = times.iter().sum();
    let value = median(&mut times);
    let per_push = |seconds: f64| seconds / times.len() as f64 * 1e3;
    let workers_cpu: Vec<String> = servers_cpu[1..].iter().map(|&cpu| format!("{:.0}", per_push(cpu))).collect();
    let total_cpu = servers_cpu.iter().sum::<f64>() + own_cpu;
    println!(
        "fleet push CPU per push (push → first token, the mean of {}): coordinator {:.0} ms, workers {} ms, this \
         client {:.0} ms; {:.0} ms in all over {:.0} ms of wall time ({:.2} cores busy)",
        times.len(),
        per_push(servers_cpu[0]),
        workers_cpu.join(" / "),
        per_push(own_cpu),
        per_push(total_cpu),
        per_push(wall),
        total_cpu / wall
    );
    println!(
        "\nfleet push ({FLEET_WORKERS} `loragate worker`s on separate empty adapter roots behind a coordinator, gRPC \
         push → first token of the new version, median of {}): {:.1} ms = {:.2}× the single server's gRPC push \
         (goal ≤ 2×)",
        times.len(),
        value * 1e3,
        value / single_grpc
    );
    drop(coordinator);
    drop(workers);
}

/// The CPU time (user and system) each of `pids` has used so far, in seconds.
fn cpu_seconds(pids: &[u32]) -> Vec<f64> {
    pids.iter().map(|pid| stat_cpu_seconds(&format!("/proc/{pid}/stat"))).collect()
}

/// The CPU time this process has used so far, in seconds.
fn own_cpu_seconds() -> f64 {
    stat_cpu_seconds("/proc/self/stat")
}

/// `utime + stime` of a `/proc/…/stat` file, in seconds.
fn stat_cpu_seconds(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).expect("a stat file");
    // The fields after the command name (which may hold spaces) in parentheses; utime and stime are the 14th and 15th.
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf reads a constant of the system.
    #[allow(unsafe_code)]
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / per_second as f64
}

/// A 1-token completion of [`NAME`] on the server at `base_url`: the version its token was sampled with.
async fn first_token_version(client: &reqwest::Client, base_url: &str) -> u64 {
    let body = json!({"model": NAME, "prompt": "Hello", "max_tokens": 1, "temperature": 0.0});
    let url = format!("{base_url}/v1/completions");
    let answer: Value = client.post(url).json(&body).send().await.expect("sent").json().await.expect("JSON");
    answer["choices"][0]["segments"][0]["lora_version"].as_u64().unwrap_or_else(|| panic!("segments: {answer}"))
}
