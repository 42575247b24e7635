//! A real vLLM (`vllm serve`, PyPI's CPU build: docs/fleet.md, "A real vLLM on a CPU") started on a free loopback
//! port in a process group of its own, waited for, and stopped with its engine process: shared by the opt-in interop
//! test (`vllm_interop`) and `bench_real_model`'s vLLM peer (`#[path]`-included by both).

#![allow(dead_code, unreachable_pub)]

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `vllm serve MODEL` on 127.0.0.1 as `served_name`, with float32 weights, `flags` and `env` added to what
/// it needs on a CPU without a network; its output goes to `log`. Returns the process (the leader of its own group)
/// and its port; it serves once [`wait_until_serving`] returns.
pub fn spawn_vllm(
    vllm: &Path,
    model: &Path,
    served_name: &str,
    flags: &[&str],
    env: &[(&str, &str)],
    log: &Path,
) -> (Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let output = File::create(log).expect("vLLM's log");
    let child = Command::new(vllm)
        .arg("serve")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--served-model-name", served_name])
        .args(["--dtype", "float32"])
        .args(flags)
        .env("VLLM_CPU_KVCACHE_SPACE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("HF_HUB_OFFLINE", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(output.try_clone().expect("log"))
        .stderr(output)
        // Its own process group, so that stopping it stops the engine process it starts too.
        .process_group(0)
        .spawn()
        .unwrap_or_else(|err| panic!("cannot start {}: {err}", vllm.display()));
    (child, port)
}

/// Waits until vLLM's `/health` at `base_url` answers 200 (it serves only once its engine is up), at most `within`;
/// panics with the end of its `log` if it exits or takes longer.
pub async fn wait_until_serving(child: &mut Child, base_url: &str, log: &Path, within: Duration) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("vLLM exited ({status}) before serving:\n{}", log_tail(log));
        }
        let health = client.get(format!("{base_url}/health")).timeout(Duration::from_secs(5)).send().await;
        if health.is_ok_and(|answer| answer.status().is_success()) {
            return;
        }
        assert!(Instant::now() < deadline, "vLLM did not serve within {within:?}:\n{}", log_tail(log));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The last 40 lines of vLLM's `log`.
pub fn log_tail(log: &Path) -> String {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Stops vLLM's process group (the API server and its engine process): SIGTERM, up to 30 s to exit, then SIGKILL.
pub fn stop_vllm(child: &mut Child) {
    let group = format!("-{}", child.id());
    let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
    let _ = child.wait();
}
