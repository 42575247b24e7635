//! `GET /health`, `GET /metrics`, and the middleware that counts and times every request.
//!
//! Metrics are OpenMetrics text from one registry per server (nothing global): the coordinator's
//! [`CoreMetrics`](loragate_core::CoreMetrics) under the `loragate_` prefix and, with vLLM's names and its
//! `model_name` label, vLLM's request metrics (`vllm:num_requests_running`, …), whose per-adapter state gauges are
//! refreshed from a snapshot on every scrape, and this front's `loragate_http_requests_total` and
//! `loragate_http_request_duration_seconds`, labelled by `endpoint` (the route template, never the raw path) and
//! `status`. Durations run until the response head is ready; for a stream that is when its first byte can go.

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};
use http::StatusCode;
use http::header::CONTENT_TYPE;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use serde_json::json;
use tokio::time::Instant;

use crate::error::HttpError;
use crate::state::AppState;

/// The content type of `/metrics`.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of the request metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// The route template (`/v1/completions`).
    endpoint: String,
    /// The response status code.
    status: u16,
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

/// The middleware that records every routed request (apply it with `Router::route_layer`, so that only matched
/// routes, with their templates, are recorded).
pub(crate) async fn track_requests(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let endpoint = request.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str).to_owned();
    let response = next.run(request).await;
    let labels = RequestLabels { endpoint, status: response.status().as_u16() };
    state.metrics().requests.get_or_create(&labels).inc();
    state.metrics().duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    response
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

/// `GET /health`: 200 while serving; 503 once the server is draining or the coordinator is shutting down.
pub(crate) async fn health(State(state): State<AppState>) -> Response {
    if state.is_draining() || state.front().coordinator().is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "draining"}))).into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}
