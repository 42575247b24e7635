//! The `loragate` binary as users run it: `serve` on the embedded demo model announces its addresses, serves real
//! Python clients (grpcio, the openai SDK, httpx, and the requests of SkyRL, prime-rl, AReaL, verl and slime, one
//! script per framework against the same server), and exits cleanly on SIGTERM; `demo-model --out` writes files that
//! `serve --model` serves the same way.
//!
//! The Python clients need `$LORAGATE_PYTHON` (default `python3`) with `grpcio grpcio-tools openai httpx`, and
//! `tinker==0.38.0` where that Python is 3.11 or newer; the README's test command (`scripts/test.sh`) sets that up.
//! Without them the tests fail. The only skip: the Tinker SDK test on a Python older than 3.11, where the SDK
//! cannot be installed (it says so on stderr).

use crate::spawned;

use std::path::Path;
use std::process::Command;

use spawned::{Spawned, repo_root};

fn python() -> String {
    std::env::var("LORAGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// Runs `tests/python/SCRIPT ARGS` with `$LORAGATE_PYTHON` and fails with its output unless it succeeds.
fn run_python(script: &str, args: &[&str]) {
    let python = python();
    let output = Command::new(&python)
        .arg(repo_root().join("tests/python").join(script))
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("cannot run {python}: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{script} failed ({}):\n{stdout}\n{stderr}", output.status);
    assert!(stdout.contains("ok: "), "{script} did not report success:\n{stdout}\n{stderr}");
}

#[test]
fn serve_announces_the_demo_and_real_python_clients_pass_over_grpc_and_http() {
    let served = Spawned::serve(&[]);
    assert_eq!(served.ready["model"], "loragate-demo");
    assert_eq!(served.ready["adapters"], serde_json::json!(["meow", "woof"]), "{}", served.ready);
    run_python("grpc_pause_roundtrip.py", &[&served.field("grpc_addr")]);
    let base_url = format!("http://{}", served.field("http_addr"));
    run_python("http_openai_client.py", &[&base_url]);
    run_python("http_skyrl_pause.py", &[&base_url]);
    for framework in ["compat_skyrl.py", "compat_prime_rl.py", "compat_areal.py", "compat_verl_slime.py"] {
        run_python(framework, &[&base_url]);
    }
    let status = served.terminate();
    assert!(status.success(), "SIGTERM is a clean shutdown: {status}");
}

#[test]
fn the_unmodified_tinker_sdk_samples_the_demo_through_the_tinker_front() {
    let version = Command::new(python())
        .args(["-c", "import sys; print(sys.version_info >= (3, 11))"])
        .output()
        .unwrap_or_else(|err| panic!("cannot run {}: {err}", python()));
    if String::from_utf8_lossy(&version.stdout).trim() != "True" {
        eprintln!("SKIPPED: the tinker SDK needs Python >= 3.11, and {} is older", python());
        return;
    }
    let served = Spawned::serve(&[]);
    run_python("tinker_sdk.py", &[&format!("http://{}", served.field("http_addr")), "--pause-modes"]);
    assert!(served.terminate().success());
}

#[test]
fn demo_model_files_serve_the_same_adapters_from_disk() {
    let temp = tempfile::tempdir().expect("a temporary directory");
    let out = temp.path().join("demo");
    // The tests' demo cache: the files are trained once for every test of the run, not again here.
    let written = Command::new(env!("CARGO_BIN_EXE_loragate"))
        .args(["demo-model", "--out"])
        .arg(&out)
        .env("LORAGATE_CACHE_DIR", spawned::cache_dir())
        .output()
        .expect("demo-model runs");
    let progress = String::from_utf8_lossy(&written.stderr);
    assert!(written.status.success(), "{progress}");
    assert!(progress.contains("writing the demo model and its adapters to"), "a progress line: {progress}");
    for file in ["model/config.json", "model/model.safetensors", "model/tokenizer.json"] {
        assert!(out.join(file).is_file(), "{file} written");
    }
    for adapter in ["meow", "woof"] {
        for file in ["adapter_config.json", "adapter_model.safetensors"] {
            assert!(out.join("adapters").join(adapter).join(file).is_file(), "{adapter}/{file} written");
        }
    }

    // The same bytes as the cache's copy (which the run's other tests serve).
    let cached = loragate::ensure_demo_files(&spawned::cache_dir()).expect("the demo files");
    for (copied, original) in [(out.join("adapters/meow"), &cached.meow_dir), (out.join("model"), &cached.model_dir)] {
        for file in ["adapter_config.json", "adapter_model.safetensors", "model.safetensors", "config.json"] {
            if original.join(file).is_file() {
                let read = |dir: &Path| std::fs::read(dir.join(file)).expect("a demo file");
                assert!(read(&copied) == read(original), "{file} copied");
            }
        }
    }

    let dir = |path: &str| out.join(path).display().to_string();
    let (model, meow, woof, root) = (dir("model"), dir("adapters/meow"), dir("adapters/woof"), dir("adapters"));
    let served = Spawned::serve(&[
        "--model",
        &model,
        "--adapter",
        &format!("meow={meow}"),
        "--adapter",
        &format!("woof={woof}"),
        "--adapter-root",
        &root,
    ]);
    assert_eq!(served.ready["model"], "model", "the directory's name is the served name");
    assert_eq!(served.ready["adapters"], serde_json::json!(["meow", "woof"]), "{}", served.ready);
    assert!(served.terminate().success());
}

#[test]
fn a_bad_flag_fails_with_a_message_naming_it() {
    let output = Command::new(env!("CARGO_BIN_EXE_loragate"))
        .args(["serve", "--grpc-addr", "not-an-address"])
        .output()
        .expect("loragate runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--grpc-addr"), "{stderr}");
}

#[test]
fn a_port_in_use_fails_at_once_before_the_model_is_read() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to take");
    let port = taken.local_addr().expect("its address").port().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_loragate"))
        .args(["serve", "--host", "localhost", "--port", &port, "--grpc-port", "0", "--state-dir", "none"])
        .args(["--model", "/nonexistent/loragate-model"])
        .output()
        .expect("loragate runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("binding 127.0.0.1:{port}")) && stderr.contains("in use"), "{stderr}");
    assert!(!stderr.contains("loragate-model"), "the port is bound before the model is read: {stderr}");
}

#[test]
fn the_access_log_names_each_requests_adapter_and_tokens_once_its_answer_has_ended() {
    let served = Spawned::serve(&["--access-log", "--log-format", "json"]);
    let url = format!("http://{}/v1/completions", served.field("http_addr"));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (answer, streamed) = runtime.block_on(async {
        let client = reqwest::Client::new();
        let body = serde_json::json!({"model": "meow", "prompt": "hello there", "max_tokens": 4, "temperature": 0.0});
        let answer: serde_json::Value =
            client.post(&url).json(&body).send().await.expect("sent").json().await.expect("JSON");
        let mut streaming = body.clone();
        streaming["stream"] = serde_json::json!(true);
        streaming["model"] = serde_json::json!("woof");
        let streamed = client.post(&url).json(&streaming).send().await.expect("sent").text().await.expect("text");
        (answer, streamed)
    });
    let usage = &answer["usage"];
    assert!(streamed.contains("[DONE]"), "{streamed}");
    // Lines are written when a body ends: poll for both (a loaded machine may be slow to flush stderr).
    let deadline = std::time::Instant::now() + spawned::PATIENCE;
    let lines = loop {
        let lines: Vec<serde_json::Value> = served
            .stderr()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|line| line["target"] == "loragate_access" && line["fields"]["path"] == "/v1/completions")
            .collect();
        if lines.len() == 2 || std::time::Instant::now() > deadline {
            break lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(lines.len(), 2, "one line per request: {lines:?}");
    let (unary, stream) = (&lines[0]["fields"], &lines[1]["fields"]);
    assert_eq!(unary["adapter"], "meow", "{unary}");
    assert_eq!(unary["status"], 200, "{unary}");
    assert_eq!(unary["prompt_tokens"], usage["prompt_tokens"], "{unary} vs {usage}");
    assert_eq!(unary["generated_tokens"], usage["completion_tokens"], "{unary} vs {usage}");
    assert_eq!(unary["complete"], true, "{unary}");
    assert_eq!(stream["adapter"], "woof", "{stream}");
    assert_eq!(stream["prompt_tokens"], usage["prompt_tokens"], "the same prompt: {stream}");
    assert!(stream["generated_tokens"].as_u64().is_some_and(|tokens| (1..=4).contains(&tokens)), "{stream}");
    assert!(stream["duration_ms"].as_f64() >= stream["latency_ms"].as_f64(), "{stream}");
    served.terminate();
}

/// `GET PATH` over a plain connection (HTTP/1.1, closed after the answer): the status code and the body.
fn plain_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("a connection");
    stream.set_read_timeout(Some(spawned::PATIENCE)).expect("a read timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nhost: loragate\r\nconnection: close\r\n\r\n").expect("the request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("the answer");
    let status = answer.split(' ').nth(1).and_then(|code| code.parse().ok()).expect("a status line");
    let body = answer.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (status, body)
}

#[test]
fn a_start_waiting_for_a_worker_says_so_first_answers_503_starting_and_stops_on_sigterm() {
    use std::io::BufRead;
    // A worker nobody listens on: the start waits for it (up to --worker-wait) as long as this test needs.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("its address");
    let worker = format!("grpc://{closed}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_loragate"))
        .args(["--log-format", "json", "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--state-dir", "none", "--worker", &worker, "--worker-wait", "600"])
        .env("LORAGATE_CACHE_DIR", spawned::cache_dir())
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("loragate starts");
    let mut lines = std::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let first: serde_json::Value =
        serde_json::from_str(&lines.next().expect("a first line").expect("UTF-8")).expect("a JSON log line");
    let message = first["fields"]["message"].as_str().expect("a message").to_owned();
    assert!(message.starts_with("starting: preparing the demo model in "), "{message}");
    assert!(message.contains("waiting for a first of 1 worker(s)"), "the first line names every step: {message}");
    let http_addr = first["fields"]["http_addr"].as_str().expect("the HTTP address on the first line").to_owned();
    // Wait until the start is at the worker (the demo may be generated first), then probe.
    let waiting = lines
        .map_while(Result::ok)
        .find(|line| line.contains("\"starting: waiting for a first of 1 worker(s)"))
        .expect("the step is said as it begins");
    assert!(waiting.contains("starting"), "{waiting}");
    for path in ["/health", "/ready"] {
        let (status, body) = plain_get(&http_addr, path);
        assert_eq!(status, 503, "{path}: {body}");
        let body: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
        assert_eq!(body["status"], "starting", "{path}: {body}");
        assert!(body["step"].as_str().is_some_and(|step| step.contains("worker")), "{path}: {body}");
    }
    let (status, body) = plain_get(&http_addr, "/v1/models");
    assert!(status == 503 && body.contains("GET /ready"), "{status} {body}");

    let sent = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill runs");
    assert!(sent.success());
    let deadline = std::time::Instant::now() + spawned::PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "a signal while starting stops the start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(!status.success(), "nothing was served");
}

#[test]
fn serve_is_ready_once_serving_and_says_what_sigterm_aborted_and_that_shutdown_is_done() {
    let served = Spawned::serve_logging(&["--log-format", "json"], "info");
    let http_addr = served.field("http_addr");
    assert_eq!(plain_get(&http_addr, "/ready"), (200, r#"{"status":"ready"}"#.to_owned()));
    assert_eq!(plain_get(&http_addr, "/health").0, 200);
    let (status, stderr) = served.terminate_with_stderr();
    assert!(status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = stderr.lines().filter_map(|line| serde_json::from_str(line).ok()).collect();
    let first = lines.first().expect("a first line");
    assert!(first["fields"]["message"].as_str().is_some_and(|message| message.starts_with("starting: ")), "{first}");
    let report = lines
        .iter()
        .find(|line| line["fields"]["message"].as_str().is_some_and(|message| message.starts_with("shutdown: ")))
        .unwrap_or_else(|| panic!("the shutdown's counts in {stderr}"));
    for count in ["in_flight", "finished", "aborted", "unacknowledged", "held"] {
        assert_eq!(report["fields"][count], 0, "nothing ran: {report}");
    }
    let last = lines.last().expect("a last line");
    assert_eq!(last["fields"]["message"], "shutdown complete", "{stderr}");
}
