//! `GET /health`, `GET /metrics`, and the middleware that counts and times every request ([`TrackRequestsLayer`]).
//!
//! Metrics are OpenMetrics text from one registry per server (nothing global): the coordinator's
//! [`CoreMetrics`](loragate_core::CoreMetrics) under the `loragate_` prefix and, with vLLM's names and its
//! `model_name` label, vLLM's request metrics (`vllm:num_requests_running`, …), whose per-adapter state gauges are
//! refreshed from a snapshot on every scrape, and this front's `loragate_http_requests_total` and
//! `loragate_http_request_duration_seconds`, labelled by `endpoint` (the route template, never the raw path) and
//! `status`. Durations run until the response head is ready; for a stream that is when its first byte can go.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::extract::{MatchedPath, Request, State};
use axum::response::{IntoResponse, Json, Response};
use http::StatusCode;
use http::header::CONTENT_TYPE;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use serde_json::json;
use tokio::time::Instant;
use tower::{Layer, Service};

use crate::error::HttpError;
use crate::state::AppState;

/// The content type of `/metrics`.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of the request metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// The route template (`/v1/completions`).
    endpoint: Endpoint,
    /// The response status code.
    status: u16,
}

/// The `endpoint` label: the route template the router matched (shared with the router: no copy per request).
#[derive(Clone, Debug)]
enum Endpoint {
    Matched(MatchedPath),
    Unmatched,
}

impl Endpoint {
    fn as_str(&self) -> &str {
        match self {
            Self::Matched(path) => path.as_str(),
            Self::Unmatched => "unmatched",
        }
    }
}

impl PartialEq for Endpoint {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Endpoint {}

impl Hash for Endpoint {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl EncodeLabelValue for Endpoint {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

type HistogramFamily = Family<RequestLabels, Histogram, fn() -> Histogram>;

/// Durations from 1 ms to about 9 minutes (held requests can wait long).
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

/// This front's own metrics.
#[derive(Clone)]
pub(crate) struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: HistogramFamily,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: HistogramFamily::new_with_constructor(seconds_histogram as fn() -> Histogram),
        }
    }
}

impl HttpMetrics {
    /// Registers the metrics in `registry` (give it the `loragate_http` prefix).
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register("requests", "HTTP requests answered, by endpoint and status", self.requests.clone());
        registry.register_with_unit(
            "request_duration",
            "From a request's arrival to its response head (held requests include their hold)",
            Unit::Seconds,
            self.duration.clone(),
        );
    }
}

impl HttpMetrics {
    /// Counts and times one answered request.
    fn record(&self, labels: &RequestLabels, started: Instant) {
        self.requests.get_or_create(labels).inc();
        self.duration.get_or_create(labels).observe(started.elapsed().as_secs_f64());
    }
}

/// The middleware that records every routed request (apply it with `Router::route_layer`, so that only matched
/// routes, with their templates, are recorded). A plain tower layer: nothing boxed or copied per request.
#[derive(Clone)]
pub(crate) struct TrackRequestsLayer {
    state: AppState,
}

impl TrackRequestsLayer {
    pub(crate) fn new(state: AppState) -> Self {
        Self { state }
    }
}

impl<S> Layer<S> for TrackRequestsLayer {
    type Service = TrackRequests<S>;

    fn layer(&self, inner: S) -> TrackRequests<S> {
        TrackRequests { inner, state: self.state.clone() }
    }
}

/// A route behind [`TrackRequestsLayer`].
#[derive(Clone)]
pub(crate) struct TrackRequests<S> {
    inner: S,
    state: AppState,
}

impl<S> Service<Request> for TrackRequests<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = TrackedResponse<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let started = Instant::now();
        let endpoint =
            request.extensions().get::<MatchedPath>().cloned().map_or(Endpoint::Unmatched, Endpoint::Matched);
        TrackedResponse {
            inner: self.inner.call(request),
            endpoint: Some(endpoint),
            started,
            state: self.state.clone(),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`TrackRequests`]: records the request once its response head is ready.
    pub(crate) struct TrackedResponse<F> {
        #[pin]
        inner: F,
        endpoint: Option<Endpoint>,
        started: Instant,
        state: AppState,
    }
}

impl<F> Future for TrackedResponse<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        if let Some(endpoint) = this.endpoint.take() {
            let labels = RequestLabels { endpoint, status: response.status().as_u16() };
            this.state.metrics().record(&labels, *this.started);
        }
        Poll::Ready(Ok(response))
    }
}

/// `GET /metrics`.
pub(crate) async fn metrics(State(state): State<AppState>) -> Result<Response, HttpError> {
    let coordinator = state.front().coordinator();
    coordinator.metrics().set_adapter_gauges(&coordinator.statuses().await);
    for source in state.front().metrics_sources() {
        source.refresh();
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, state.registry())?;
    Ok(([(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], text).into_response())
}

/// `GET /health`: 200 while serving; 503 once the server is draining or the coordinator is shutting down, and 503
/// `{"status": "unhealthy", "reason"}` while the state store cannot record (it heals on its own once it can).
pub(crate) async fn health(State(state): State<AppState>) -> Response {
    serving_status(&state, "ok")
}

/// `GET /ready`: whether to send this server work (a Kubernetes readiness probe): 200 `{"status": "ready"}` while
/// serving; 503 `{"status": "draining"}` once the server is stopping, 503 `{"status": "unhealthy", "reason"}` while
/// the state store cannot record. While the server starts, the listener answers 503 `{"status": "starting"}` (see
/// [`crate::StartingResponder`]).
pub(crate) async fn ready(State(state): State<AppState>) -> Response {
    serving_status(&state, "ready")
}

/// 503 `draining` or `unhealthy` (with its reason) as `/health` and `/ready` say it, else 200 `{"status": serving}`.
fn serving_status(state: &AppState, serving: &str) -> Response {
    let coordinator = state.front().coordinator();
    if state.is_draining() || coordinator.is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "draining"}))).into_response()
    } else if let Err(err) = coordinator.state_health() {
        // The control plane cannot record a change: not healthy, whatever the data plane does.
        let body = json!({"status": "unhealthy", "reason": err.to_string()});
        (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    } else {
        Json(json!({"status": serving})).into_response()
    }
}
