//! One access-log line per request, for every front: method, path (for gRPC the RPC, `/package.Service/Method`),
//! HTTP status, gRPC status (from the response head for errors, which tonic sends trailers-only, else from the
//! trailers), the adapter sampled and its prompt and generated tokens (from the core's
//! [`RequestFacts`], which the request's samples fill), the time until the response head and the time until its
//! body ended. The line is written when the body ends, or when it is dropped unfinished (the client went away:
//! `complete=false`). Lines go to the tracing target [`ACCESS_LOG_TARGET`] at INFO; the binary turns that target
//! on only with `--access-log`. The fronts add the layer only when that target is on
//! ([`AccessLogLayer::when_enabled`]), so a server without `--access-log` has no such layer at all: this layer boxes
//! each response future and wraps each body, which a control call answered in microseconds would feel.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use http_body::{Body, Frame, SizeHint};
use loragate_core::RequestFacts;

/// The tracing target of access-log lines.
pub const ACCESS_LOG_TARGET: &str = "loragate_access";

/// Wraps a service in [`AccessLog`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AccessLogLayer;

impl AccessLogLayer {
    /// The layer if access-log lines are written ([`ACCESS_LOG_TARGET`] is on at INFO for the current subscriber,
    /// which the binary decides once at start with `--access-log`), else `None`: leave the layer out then.
    pub fn when_enabled() -> Option<Self> {
        tracing::enabled!(target: ACCESS_LOG_TARGET, tracing::Level::INFO).then_some(Self)
    }
}

impl<S> tower::Layer<S> for AccessLogLayer {
    type Service = AccessLog<S>;

    fn layer(&self, inner: S) -> AccessLog<S> {
        AccessLog { inner }
    }
}

/// Logs each request it passes on, once its response body has ended.
#[derive(Clone, Debug)]
pub struct AccessLog<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for AccessLog<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: Body,
{
    type Response = http::Response<LoggedBody<R>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !tracing::enabled!(target: ACCESS_LOG_TARGET, tracing::Level::INFO) {
            let response = self.inner.call(request);
            return Box::pin(async move { Ok(response.await?.map(|body| LoggedBody { inner: body, line: None })) });
        }
        let (method, path) = (request.method().clone(), request.uri().path().to_owned());
        let started = Instant::now();
        let facts = RequestFacts::default();
        let response = facts.clone().scope(self.inner.call(request));
        Box::pin(async move {
            match response.await {
                Ok(answer) => {
                    let grpc_status = answer.headers().get("grpc-status").and_then(|value| value.to_str().ok());
                    let line = Line {
                        method,
                        path,
                        status: answer.status().as_u16(),
                        grpc_status: grpc_status.map(str::to_owned),
                        head_ms: started.elapsed().as_secs_f64() * 1e3,
                        started,
                        facts,
                    };
                    // An empty body may never be polled: its line is written now.
                    if answer.body().is_end_stream() {
                        line.write(true);
                        return Ok(answer.map(|body| LoggedBody { inner: body, line: None }));
                    }
                    Ok(answer.map(|body| LoggedBody { inner: body, line: Some(line) }))
                }
                Err(err) => {
                    let latency_ms = started.elapsed().as_secs_f64() * 1e3;
                    tracing::info!(target: ACCESS_LOG_TARGET, %method, path, latency_ms, "request failed");
                    Err(err)
                }
            }
        })
    }
}

/// What a request's line says, written when its body ends.
#[derive(Debug)]
struct Line {
    method: http::Method,
    path: String,
    status: u16,
    grpc_status: Option<String>,
    /// Milliseconds until the response head.
    head_ms: f64,
    started: Instant,
    facts: RequestFacts,
}

impl Line {
    fn write(self, complete: bool) {
        let facts = self.facts.facts();
        tracing::info!(
            target: ACCESS_LOG_TARGET,
            method = %self.method,
            path = self.path,
            status = self.status,
            grpc_status = self.grpc_status.as_deref().unwrap_or(""),
            // Absent for a request that sampled nothing; `""` for the base model.
            adapter = facts.adapter.as_deref(),
            prompt_tokens = facts.prompt_tokens,
            generated_tokens = facts.generated_tokens,
            latency_ms = self.head_ms,
            duration_ms = self.started.elapsed().as_secs_f64() * 1e3,
            complete,
            "request"
        );
    }
}

/// A response body that writes its request's access-log line when it ends or is dropped.
#[derive(Debug)]
pub struct LoggedBody<B> {
    inner: B,
    /// `None` once written, or when access logging is off.
    line: Option<Line>,
}

impl<B: Body + Unpin> Body for LoggedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(trailers), Some(line)) = (frame.trailers_ref(), self.line.as_mut())
                    && let Some(status) = trailers.get("grpc-status").and_then(|value| value.to_str().ok())
                {
                    line.grpc_status = Some(status.to_owned());
                }
                // A body that knows it has ended (a sized one, after its last frame) may never be polled again.
                if self.inner.is_end_stream()
                    && let Some(line) = self.line.take()
                {
                    line.write(true);
                }
            }
            Poll::Ready(None) => {
                if let Some(line) = self.line.take() {
                    line.write(true);
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for LoggedBody<B> {
    fn drop(&mut self) {
        if let Some(line) = self.line.take() {
            // Dropped before its end: the client went away, or the server stopped sending.
            line.write(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::{Layer, ServiceExt};

    use super::*;

    /// Held by every test that reaches this module's tracing callsites. `tracing` caches each callsite's interest
    /// process-wide when the callsite is first reached; while at most one dispatcher is registered it asks only the
    /// reaching thread's subscriber. A test reaching [`AccessLog::call`] with no subscriber can therefore store
    /// `never` just after another test's `set_default` re-evaluated every callsite, and that test's request then
    /// writes no line. Taking turns makes each new subscriber's re-evaluation come after every earlier first reach.
    static CALLSITES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    #[tokio::test]
    async fn passes_requests_and_answers_through_unchanged() {
        use http_body_util::BodyExt;

        let _turn = CALLSITES.lock().await;

        let inner = tower::service_fn(|request: http::Request<()>| async move {
            let status = if request.uri().path() == "/missing" { 404 } else { 200 };
            Ok::<_, Infallible>(
                http::Response::builder().status(status).body(format!("at {}", request.uri())).expect("response"),
            )
        });
        let service = AccessLogLayer.layer(inner);
        let found = service.clone().oneshot(http::Request::get("/v1/models").body(()).expect("request")).await;
        let found = found.expect("answer");
        assert_eq!(found.status(), 200);
        let body = found.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(body, "at /v1/models");
        let missing = service.oneshot(http::Request::get("/missing").body(()).expect("request")).await;
        assert_eq!(missing.expect("answer").status(), 404);
    }

    /// Collects what a test subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("lock").clone()).expect("utf-8")
        }
    }

    /// A subscriber writing to `captured`, with the access-log target at `level` (`OFF`: no access log).
    fn subscriber(
        captured: &Captured,
        level: impl Into<tracing_subscriber::filter::LevelFilter>,
    ) -> impl tracing::Subscriber + Send + Sync {
        use tracing_subscriber::layer::SubscriberExt;

        let sink = captured.clone();
        let targets = tracing_subscriber::filter::Targets::new().with_target(ACCESS_LOG_TARGET, level);
        let format = tracing_subscriber::fmt::layer().with_writer(move || sink.clone()).with_ansi(false);
        tracing_subscriber::registry().with(format).with(targets)
    }

    #[test]
    fn the_layer_exists_only_where_its_lines_are_written() {
        let _turn = CALLSITES.blocking_lock();
        let captured = Captured::default();
        let off = subscriber(&captured, tracing_subscriber::filter::LevelFilter::OFF);
        assert!(tracing::subscriber::with_default(off, AccessLogLayer::when_enabled).is_none(), "no --access-log");
        let on = subscriber(&captured, tracing::Level::INFO);
        assert!(tracing::subscriber::with_default(on, AccessLogLayer::when_enabled).is_some(), "--access-log");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_through_the_layer_writes_one_line_when_its_body_ends() {
        use http_body_util::BodyExt;

        let _turn = CALLSITES.lock().await;
        let captured = Captured::default();
        let _logging = tracing::subscriber::set_default(subscriber(&captured, tracing::Level::INFO));
        let layer = AccessLogLayer::when_enabled().expect("the access log is on for this thread");
        let inner = tower::service_fn(|_request: http::Request<()>| async move {
            Ok::<_, Infallible>(
                http::Response::builder()
                    .status(201)
                    .body(http_body_util::Full::new(bytes::Bytes::from("made")))
                    .expect("response"),
            )
        });
        let answer = layer.layer(inner).oneshot(http::Request::post("/v1/things").body(()).expect("request")).await;
        let body = answer.expect("answer").into_body();
        assert!(!captured.text().contains("/v1/things"), "nothing is written before the body ends");
        assert_eq!(body.collect().await.expect("body").to_bytes(), "made");
        let text = captured.text();
        assert_eq!(text.lines().count(), 1, "{text}");
        for expected in ["method=POST", "path=\"/v1/things\"", "status=201", "complete=true"] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
    }
}
