//! One access-log line per request, for every front: method, path (for gRPC the RPC, `/package.Service/Method`),
//! HTTP status, gRPC status when the answer carries it in its head (errors, which tonic sends trailers-only), and
//! the time until the response head. Lines go to the tracing target [`ACCESS_LOG_TARGET`] at INFO; the binary
//! turns that target on only with `--access-log`, so a server without it pays one cached filter check per request.

use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;

/// The tracing target of access-log lines.
pub const ACCESS_LOG_TARGET: &str = "loragate_access";

/// Wraps a service in [`AccessLog`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AccessLogLayer;

impl<S> tower::Layer<S> for AccessLogLayer {
    type Service = AccessLog<S>;

    fn layer(&self, inner: S) -> AccessLog<S> {
        AccessLog { inner }
    }
}

/// Logs each request it passes on, once its response head is ready (a stream's latency is to its first byte).
#[derive(Clone, Debug)]
pub struct AccessLog<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for AccessLog<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !tracing::enabled!(target: ACCESS_LOG_TARGET, tracing::Level::INFO) {
            return Box::pin(self.inner.call(request));
        }
        let (method, path) = (request.method().clone(), request.uri().path().to_owned());
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            let latency_ms = started.elapsed().as_secs_f64() * 1e3;
            match &response {
                Ok(answer) => {
                    let grpc_status = answer.headers().get("grpc-status").and_then(|value| value.to_str().ok());
                    tracing::info!(
                        target: ACCESS_LOG_TARGET,
                        %method,
                        path,
                        status = answer.status().as_u16(),
                        grpc_status = grpc_status.unwrap_or(""),
                        latency_ms,
                        "request"
                    );
                }
                Err(_) => tracing::info!(target: ACCESS_LOG_TARGET, %method, path, latency_ms, "request failed"),
            }
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::{Layer, ServiceExt};

    use super::*;

    #[tokio::test]
    async fn passes_requests_and_answers_through_unchanged() {
        let inner = tower::service_fn(|request: http::Request<()>| async move {
            let status = if request.uri().path() == "/missing" { 404 } else { 200 };
            Ok::<_, Infallible>(http::Response::builder().status(status).body(()).expect("response"))
        });
        let service = AccessLogLayer.layer(inner);
        let found = service.clone().oneshot(http::Request::get("/v1/models").body(()).expect("request")).await;
        assert_eq!(found.expect("answer").status(), 200);
        let missing = service.oneshot(http::Request::get("/missing").body(()).expect("request")).await;
        assert_eq!(missing.expect("answer").status(), 404);
    }
}
