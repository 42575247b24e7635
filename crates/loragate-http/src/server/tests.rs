//! The HTTP front over a scripted engine, on a real server at `127.0.0.1:0`, driven by a real HTTP client.
//!
//! The scripted engine emits `hold_after` tokens per sequence at once (token `i` is byte `i`, its logprob
//! `-0.01 * i`), then ends with `length` if the budget allows no more, or waits until aborted.

mod completions;
mod control;
mod errors;
mod gate;
mod observability;

use std::sync::Arc;
use std::time::Duration;

use loragate_core::testing::{ScriptedEngine, coordinator_with_adapters, eventually};
use loragate_core::{AdapterStatus, Coordinator, CoordinatorConfig};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;
use crate::test_codec::ByteCodec;

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

/// Like [`serve_engine`], with the front adjusted by `adjust` (e.g. extra routes).
async fn serve_front(
    engine: ScriptedEngine,
    config: CoordinatorConfig,
    adapters: &[&str],
    adjust: impl FnOnce(HttpFront) -> HttpFront,
) -> Harness {
    let coordinator = coordinator_with_adapters(engine, config, adapters).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = oneshot::channel::<()>();
    let (drain, drained) = oneshot::channel::<()>();
    let front =
        adjust(HttpFront::new(coordinator.clone(), SERVED_NAME, Arc::new(ByteCodec)).with_body_limit(BODY_LIMIT));
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

    /// GETs `path`; returns the status and the JSON answer.
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self.client.get(self.url(path)).send().await.expect("send");
        (response.status(), response.json().await.expect("a JSON answer"))
    }

    /// POSTs a completion request in the background.
    fn spawn_completion(&self, body: Value, request_id: &str) -> tokio::task::JoinHandle<(StatusCode, Value)> {
        let request = self.client.post(self.url("/v1/completions")).header("X-Request-Id", request_id).json(&body);
        tokio::spawn(async move {
            let response = request.send().await.expect("send");
            (response.status(), response.json().await.expect("a JSON answer"))
        })
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
