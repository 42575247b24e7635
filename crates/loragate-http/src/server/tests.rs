//! The HTTP front over a scripted engine, on a real server at `127.0.0.1:0`, driven by a real HTTP client.
//!
//! The scripted engine emits `hold_after` tokens per sequence at once (token `i` is byte `i`, its logprob
//! `-0.01 * i`), then ends with `length` if the budget allows no more, or waits until aborted.

mod chat;
mod compat;
mod completions;
mod control;
mod errors;
mod gate;
mod generate;
mod hardening;
mod matrix;
mod observability;
mod sglang;
mod strict;
mod versions;

use std::sync::Arc;
use std::time::Duration;

use loragate_core::testing::{ScriptedEngine, coordinator_with_adapters, eventually};
use loragate_core::{AdapterStatus, Coordinator, CoordinatorConfig};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;
use loragate_text::testing::ByteCodec;

/// Tokens each scripted request emits before it waits to be aborted.
const HOLD_AFTER: u32 = 3;
/// What the tests' servers call the base model.
const SERVED_NAME: &str = "demo";
/// The tests' body limit.
const BODY_LIMIT: usize = 16 * 1024;

struct Harness {
    base: String,
    client: reqwest::Client,
    coordinator: Coordinator,
    drain: Option<oneshot::Sender<()>>,
    _stop: oneshot::Sender<()>,
}

/// A server with `adapters` loaded (version 1 each) over `ScriptedEngine::new(HOLD_AFTER)`.
async fn serve(adapters: &[&str]) -> Harness {
    serve_engine(ScriptedEngine::new(HOLD_AFTER), CoordinatorConfig::default(), adapters).await
}

async fn serve_engine(engine: ScriptedEngine, config: CoordinatorConfig, adapters: &[&str]) -> Harness {
    serve_front(engine, config, adapters, |front| front).await
}

/// The tests' chat template: each message as `<role>: content\n`, then `assistant:` for the generation prompt.
const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}\
    {% if add_generation_prompt %}assistant:{% endif %}";

/// A server whose front has [`CHAT_TEMPLATE`].
async fn serve_with_chat(adapters: &[&str]) -> Harness {
    let template = crate::ChatTemplate::new(CHAT_TEMPLATE, None, None).expect("the test template compiles");
    serve_front(ScriptedEngine::new(HOLD_AFTER), CoordinatorConfig::default(), adapters, |front| {
        front.with_chat_template(template)
    })
    .await
}

/// A server over `engine` and `config` (with the served name reserved, as `loragate serve` does), its front set up
/// by `configure`.
async fn serve_front(
    engine: ScriptedEngine,
    mut config: CoordinatorConfig,
    adapters: &[&str],
    configure: impl FnOnce(HttpFront) -> HttpFront,
) -> Harness {
    config.reserved_names.push(SERVED_NAME.to_owned());
    let coordinator = coordinator_with_adapters(engine, config, adapters).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = oneshot::channel::<()>();
    let (drain, drained) = oneshot::channel::<()>();
    let front =
        configure(HttpFront::new(coordinator.clone(), SERVED_NAME, Arc::new(ByteCodec)).with_body_limit(BODY_LIMIT));
    let draining = async move {
        let _ = drained.await;
    };
    tokio::spawn(serve_http(listener, front, draining, async move {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    Harness { base: format!("http://{address}"), client, coordinator, drain: Some(drain), _stop: stop }
}

impl Harness {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POSTs `body` as JSON; returns the status and the JSON answer.
    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self.client.post(self.url(path)).json(&body).send().await.expect("send");
        (response.status(), response.json().await.expect("a JSON answer"))
    }

    /// POSTs `body` as JSON; returns the status and the raw answer (for endpoints that answer an empty body).
    async fn post_empty(&self, path: &str, body: Value) -> (StatusCode, String) {
        let response = self.client.post(self.url(path)).json(&body).send().await.expect("send");
        (response.status(), response.text().await.expect("body"))
    }

    /// GETs `path`; returns the status and the JSON answer.
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self.client.get(self.url(path)).send().await.expect("send");
        (response.status(), response.json().await.expect("a JSON answer"))
    }

    /// POSTs a completion request in the background.
    fn spawn_completion(&self, body: Value, request_id: &str) -> tokio::task::JoinHandle<(StatusCode, Value)> {
        self.spawn_post("/v1/completions", body, request_id)
    }

    /// POSTs `body` to `path` in the background, with `request_id` as `X-Request-Id`.
    fn spawn_post(&self, path: &str, body: Value, request_id: &str) -> tokio::task::JoinHandle<(StatusCode, Value)> {
        let request = self.client.post(self.url(path)).header("X-Request-Id", request_id).json(&body);
        tokio::spawn(async move {
            let response = request.send().await.expect("send");
            (response.status(), response.json().await.expect("a JSON answer"))
        })
    }

    /// POSTs `body` to `path` with `stream: true`; returns the JSON chunks of the finished stream.
    async fn stream(&self, path: &str, mut body: Value) -> Vec<Value> {
        body["stream"] = Value::Bool(true);
        let response = self.client.post(self.url(path)).json(&body).send().await.expect("send");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        sse_chunks(&response.text().await.expect("body"))
    }

    async fn status_of(&self, adapter: &str) -> AdapterStatus {
        let listed = self.coordinator.list_adapters().await;
        listed.into_iter().find(|status| status.key.as_wire_str() == adapter).expect("listed")
    }

    async fn pause(&self, adapter: &str) -> Value {
        let (status, answer) =
            self.post("/skyrl/v1/abort_lora_requests", serde_json::json!({"lora_name": adapter})).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer
    }

    async fn resume(&self, adapter: &str) {
        let (status, answer) =
            self.post("/skyrl/v1/resume_lora_requests", serde_json::json!({"lora_name": adapter})).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
}

/// The `usage` object of `prompt` prompt tokens and `completion` generated tokens (vLLM's shape: nothing cached).
fn usage(prompt: u64, completion: u64) -> Value {
    serde_json::json!({
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
    })
}

/// The `data:` payloads of a server-sent event stream, in order.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            let data = event.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data event: {event:?}"));
            data.to_owned()
        })
        .collect()
}

/// The JSON chunks of a finished stream, checking it ends with `[DONE]`.
fn sse_chunks(body: &str) -> Vec<Value> {
    let mut data = sse_data(body);
    assert_eq!(data.pop().as_deref(), Some("[DONE]"), "the stream ends with [DONE]: {body:?}");
    data.iter().map(|chunk| serde_json::from_str(chunk).expect("a JSON chunk")).collect()
}
