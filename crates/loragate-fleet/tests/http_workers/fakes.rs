//! What the fakes of vLLM's and SGLang's HTTP servers share (test code only, written from their public API): a
//! server on its own thread and runtime on 127.0.0.1 (killing it drops every connection, as a killed process would),
//! the state a test inspects and steers, and the token stream every fake sequence runs.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::stream::{BoxStream, StreamExt};
use parking_lot::Mutex;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// What a fake records and how it behaves. Shared by the fake's handlers and the test.
pub(crate) struct FakeState {
    /// The adapters it holds: name → path.
    pub(crate) loaded: Mutex<BTreeMap<String, String>>,
    /// Every sampling, load and unload body it received, with its route.
    pub(crate) bodies: Mutex<Vec<(&'static str, Value)>>,
    /// Running sequences by the id that aborts them.
    pub(crate) running: Mutex<HashMap<String, CancellationToken>>,
    /// Ids it was asked to abort by a call.
    pub(crate) aborted_by_call: Mutex<Vec<String>>,
    /// Sequences whose client went away before they finished.
    pub(crate) disconnects: AtomicUsize,
    /// Its health check answers 200 (else 503).
    pub(crate) healthy: AtomicBool,
    /// Health checks answered.
    pub(crate) health_checks: AtomicUsize,
    /// A load of a path containing this fails as a server that cannot read it would.
    pub(crate) refuse_paths_containing: Mutex<Option<String>>,
    /// Each sequence produces this many tokens, then waits to be aborted (if its budget allows more).
    pub(crate) hold_after: u32,
}

impl FakeState {
    /// A healthy fake whose sequences hold after `hold_after` tokens.
    pub(crate) fn new(hold_after: u32) -> Arc<Self> {
        Arc::new(Self {
            loaded: Mutex::default(),
            bodies: Mutex::default(),
            running: Mutex::default(),
            aborted_by_call: Mutex::default(),
            disconnects: AtomicUsize::new(0),
            healthy: AtomicBool::new(true),
            health_checks: AtomicUsize::new(0),
            refuse_paths_containing: Mutex::default(),
            hold_after,
        })
    }

    /// Records a body.
    pub(crate) fn record(&self, route: &'static str, body: &Value) {
        self.bodies.lock().push((route, body.clone()));
    }

    /// The bodies received on `route`.
    pub(crate) fn bodies_on(&self, route: &str) -> Vec<Value> {
        self.bodies.lock().iter().filter(|(on, _)| *on == route).map(|(_, body)| body.clone()).collect()
    }

    /// The health answer.
    pub(crate) fn health(&self) -> StatusCode {
        self.health_checks.fetch_add(1, Ordering::Relaxed);
        if self.healthy.load(Ordering::Relaxed) { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
    }

    /// Whether a load of `path` is refused.
    pub(crate) fn refuses(&self, path: &str) -> bool {
        self.refuse_paths_containing.lock().as_deref().is_some_and(|refused| path.contains(refused))
    }

    /// Cancels the sequence `id` (a call's abort); unknown ids abort nothing.
    pub(crate) fn abort(&self, id: &str) {
        self.aborted_by_call.lock().push(id.to_owned());
        if let Some(cancel) = self.running.lock().get(id) {
            cancel.cancel();
        }
    }
}

/// `router` behind vLLM's and SGLang's `--api-key KEY`: a request without `Authorization: Bearer KEY` is 401.
pub(crate) fn with_api_key(router: Router, key: &'static str) -> Router {
    router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| async move {
            let presented = request.headers().get(header::AUTHORIZATION).and_then(|value| value.to_str().ok());
            if presented == Some(format!("Bearer {key}").as_str()) {
                next.run(request).await
            } else {
                (StatusCode::UNAUTHORIZED, axum::Json(serde_json::json!({"error": "Unauthorized"}))).into_response()
            }
        },
    ))
}

/// A fake on 127.0.0.1, on its own thread and runtime.
pub(crate) struct FakeServer {
    /// Its port.
    pub(crate) port: u16,
    kill: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeServer {
    /// Serves `router` on `port` (0 for any).
    pub(crate) fn start(router: Router, port: u16) -> Self {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("address").port();
        let kill = CancellationToken::new();
        let killed = kill.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                tokio::select! {
                    served = axum::serve(listener, router) => served.expect("the fake serves"),
                    () = killed.cancelled() => {}
                }
            });
            // Dropping the runtime drops every connection: clients see the server vanish mid-stream.
            drop(runtime);
        });
        Self { port, kill, thread: Some(thread) }
    }

    /// Kills the server: every connection it had closes at once.
    pub(crate) fn kill(&mut self) {
        self.kill.cancel();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("fake thread");
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One step of a fake sequence.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    /// A token (ids 10, 11, 12, ...; logprob -0.5).
    Token(u32),
    /// Nothing new (an SSE comment while the sequence holds: writing it is how the server notices a client that
    /// went away, as vLLM's server notices by polling the connection).
    KeepAlive,
    /// The end: "length" or "abort".
    Finish(&'static str),
}

/// Removes a sequence from the running table when it ends, counting a client that went away first.
struct Running {
    state: Arc<FakeState>,
    id: String,
    finished: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.state.running.lock().remove(&self.id);
        if !self.finished {
            self.state.disconnects.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The steps of a sequence registered as `id`, with budget `max_tokens`: a token every millisecond, holding after
/// the fake's `hold_after` tokens until aborted.
pub(crate) fn steps(state: &Arc<FakeState>, id: String, max_tokens: u32) -> BoxStream<'static, Step> {
    let cancel = CancellationToken::new();
    state.running.lock().insert(id.clone(), cancel.clone());
    let hold_after = state.hold_after;
    let running = Running { state: state.clone(), id, finished: false };
    futures::stream::unfold(Some((0u32, running)), move |step| {
        let cancel = cancel.clone();
        async move {
            let (produced, running) = step?;
            let finish = |mut running: Running, reason| {
                running.finished = true;
                drop(running);
                Some((Step::Finish(reason), None))
            };
            if produced >= max_tokens {
                return finish(running, "length");
            }
            if produced >= hold_after && !cancel.is_cancelled() {
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_millis(10)) => {
                        return Some((Step::KeepAlive, Some((produced, running))));
                    }
                }
            }
            if cancel.is_cancelled() {
                return finish(running, "abort");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            Some((Step::Token(10 + produced), Some((produced + 1, running))))
        }
    })
    .boxed()
}

/// A server-sent-events answer: each JSON chunk as `data:` (`None` as a comment), then `data: [DONE]`.
pub(crate) fn sse(chunks: BoxStream<'static, Option<Value>>) -> Response {
    let events = chunks
        .map(|chunk| chunk.map_or_else(|| ": keep-alive\n\n".to_owned(), |chunk| format!("data: {chunk}\n\n")))
        .chain(futures::stream::once(async { "data: [DONE]\n\n".to_owned() }))
        .map(Ok::<_, Infallible>);
    ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(events)).into_response()
}

/// A JSON error answer in OpenAI's shape.
pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({"error": {"message": message, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

/// The prompt of a body's `key` as token ids.
pub(crate) fn prompt(body: &Value, key: &str) -> Vec<u32> {
    body[key]
        .as_array()
        .map(|ids| ids.iter().filter_map(|id| id.as_u64().map(|id| id as u32)).collect())
        .unwrap_or_default()
}
