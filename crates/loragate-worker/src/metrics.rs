//! `GET /metrics` on the worker's HTTP listener (`--http-addr`): the coordinator's own metrics as `loragate serve`
//! serves them — the core's `loragate_` series and vLLM's request metrics under vLLM's names
//! (`vllm:num_requests_running`, …) with vLLM's `model_name` label — read from the one store the coordinator keeps
//! ([`CoreMetrics`](loragate_core::CoreMetrics)); nothing is counted twice. The per-adapter state gauges are refreshed
//! from a snapshot on every scrape, as `serve` does. Open, like `serve`'s `/metrics` and the gRPC health service:
//! no key, and nothing in it is secret. Any other path is 404.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use loragate_core::Coordinator;
use loragate_net::GuardedListener;
use prometheus_client::registry::Registry;

/// The content type of `/metrics` (the same as `serve`'s).
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a scrape reads: the coordinator (for the state gauges' snapshot) and the registry its metrics are in.
struct Scraped {
    coordinator: Coordinator,
    registry: Registry,
}

/// Serves `GET /metrics` for `coordinator` (whose base model is `served_model_name`, vLLM's `model_name` label) on
/// `listener` until `stop` completes; connections in progress then finish their request.
pub(crate) async fn serve_metrics(
    listener: GuardedListener,
    coordinator: Coordinator,
    served_model_name: &str,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut registry = Registry::default();
    coordinator.metrics().register(registry.sub_registry_with_prefix("loragate"));
    let model_name = ("model_name".into(), served_model_name.to_owned().into());
    coordinator.metrics().register_vllm(registry.sub_registry_with_label(model_name));
    let app = Router::new().route("/metrics", get(scrape)).with_state(Arc::new(Scraped { coordinator, registry }));
    axum::serve(listener, app).with_graceful_shutdown(stop).await
}

/// `GET /metrics`: OpenMetrics text.
async fn scrape(State(scraped): State<Arc<Scraped>>) -> Response {
    let coordinator = &scraped.coordinator;
    coordinator.metrics().set_adapter_gauges(&coordinator.statuses().await);
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &scraped.registry) {
        Ok(()) => ([(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], text).into_response(),
        Err(err) => {
            tracing::error!(%err, "encoding the metrics failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
