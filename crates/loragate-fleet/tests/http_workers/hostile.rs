//! A hostile HTTP worker (test code only): it joins like vLLM's or SGLang's server (`/health`, `/v1/models`; no
//! token API on vLLM, so sampling goes over `/v1/completions`), then answers every streamed sampling request with
//! one misbehaviour: tokens past the budget, no response head, a line trickled without its end, an endless line,
//! a token outside the vocabulary, or a redirect elsewhere. It counts the bytes it managed to send and whether the
//! client dropped its stream, so a test sees that the fleet stopped reading.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};

use crate::fakes::FakeServer;

/// What the hostile worker does with a sampling request.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Misbehaviour {
    /// Streams tokens forever, whatever the budget.
    Overrun,
    /// Never answers: no response head.
    NoHead,
    /// Two tokens, then the start of a chunk and a byte now and then, never the line's end.
    Trickle,
    /// Two tokens, then one line that never ends, a MiB at a time.
    EndlessLine,
    /// A token id far outside any vocabulary.
    BadToken,
    /// A 307 redirect to the server on this port.
    RedirectTo(u16),
}

/// The protocol the hostile worker pretends to speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Speaks {
    Vllm,
    Sglang,
}

/// What the test reads back.
#[derive(Default)]
pub(crate) struct Seen {
    /// Sampling requests received.
    pub(crate) requests: AtomicUsize,
    /// Body bytes handed to the connection.
    pub(crate) bytes_sent: AtomicUsize,
    /// A body was dropped (an endless one: the client left).
    pub(crate) dropped: AtomicBool,
}

/// A running hostile worker.
pub(crate) struct Hostile {
    server: FakeServer,
    speaks: Speaks,
    pub(crate) seen: Arc<Seen>,
}

impl Hostile {
    pub(crate) fn start(speaks: Speaks, misbehaviour: Misbehaviour) -> Self {
        let seen = Arc::new(Seen::default());
        let route = match speaks {
            Speaks::Vllm => "/v1/completions",
            Speaks::Sglang => "/generate",
        };
        let sampled = seen.clone();
        let router = Router::new()
            .route("/health", get(|| async { StatusCode::OK }))
            .route("/v1/models", get(|| async { Json(json!({"data": [{"id": "hostile", "max_model_len": 4096}]})) }))
            .route(route, post(move |Json(body): Json<Value>| answer(speaks, misbehaviour, sampled.clone(), body)))
            .route("/abort_request", post(|| async { StatusCode::OK }));
        Self { server: FakeServer::start(router, 0), speaks, seen }
    }

    pub(crate) fn url(&self) -> String {
        let scheme = match self.speaks {
            Speaks::Vllm => "vllm+http",
            Speaks::Sglang => "sglang+http",
        };
        format!("{scheme}://127.0.0.1:{}", self.server.port)
    }
}

/// A server that only counts what reaches it (where a redirect points).
pub(crate) struct Elsewhere {
    server: FakeServer,
    pub(crate) requests: Arc<AtomicUsize>,
}

impl Elsewhere {
    pub(crate) fn start() -> Self {
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let router = Router::new().fallback(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { StatusCode::OK }
        });
        Self { server: FakeServer::start(router, 0), requests }
    }

    pub(crate) fn port(&self) -> u16 {
        self.server.port
    }
}

async fn answer(speaks: Speaks, misbehaviour: Misbehaviour, seen: Arc<Seen>, body: Value) -> Response {
    if body["stream"] != true {
        return StatusCode::BAD_REQUEST.into_response();
    }
    seen.requests.fetch_add(1, Ordering::SeqCst);
    let tokens = |count: u32| futures::stream::iter((1..=count).map(move |n| chunk(speaks, n, 10 + n)));
    let stream: BoxStream<'static, String> = match misbehaviour {
        Misbehaviour::NoHead => return std::future::pending().await,
        Misbehaviour::RedirectTo(port) => {
            let location = format!("http://127.0.0.1:{port}/generate");
            return (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, location)]).into_response();
        }
        Misbehaviour::Overrun => futures::stream::iter(1..)
            .then(move |n| async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                chunk(speaks, n, 10 + n % 50)
            })
            .boxed(),
        Misbehaviour::Trickle => tokens(2)
            .chain(futures::stream::once(async { "data: {\"meta_info\"".to_owned() }))
            .chain(futures::stream::repeat(()).then(|()| async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                " ".to_owned()
            }))
            .boxed(),
        Misbehaviour::EndlessLine => tokens(2)
            .chain(futures::stream::once(async { "data: ".to_owned() }))
            .chain(futures::stream::repeat_with(|| "x".repeat(1 << 20)))
            .boxed(),
        Misbehaviour::BadToken => {
            tokens(2).chain(futures::stream::once(async move { chunk(speaks, 3, 999_999) })).boxed()
        }
    };
    let watched = Watched(seen.clone());
    let body = stream.map(move |text| {
        let _watching = &watched;
        seen.bytes_sent.fetch_add(text.len(), Ordering::SeqCst);
        Ok::<_, Infallible>(text)
    });
    ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(body)).into_response()
}

/// Marks the body dropped (an endless one only ends that way: the client left).
struct Watched(Arc<Seen>);

impl Drop for Watched {
    fn drop(&mut self) {
        self.0.dropped.store(true, Ordering::SeqCst);
    }
}

/// The `n`-th token chunk (`token`) as the protocol streams it, never finished.
fn chunk(speaks: Speaks, n: u32, token: u32) -> String {
    let chunk = match speaks {
        Speaks::Vllm => json!({"id": "cmpl-hostile", "object": "text_completion", "choices": [{
            "index": 0, "text": "", "token_ids": [token],
            "logprobs": {"tokens": [format!("token_id:{token}")], "token_logprobs": [-0.5],
                         "top_logprobs": [{format!("token_id:{token}"): -0.5}], "text_offset": [0]},
            "finish_reason": null}]}),
        Speaks::Sglang => json!({"text": "", "output_ids": [token], "meta_info": {
            "completion_tokens": n, "output_token_logprobs": [[-0.5, token, null]], "finish_reason": null}}),
    };
    format!("data: {chunk}\n\n")
}
