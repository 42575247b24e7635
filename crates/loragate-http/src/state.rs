//! [`AppState`]: everything the handlers share for one server instance (the front, its metrics and registry, and
//! whether the server is draining). Handlers import this module, never the one that builds the router.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::front::HttpFront;
use crate::observability::HttpMetrics;

/// Everything the handlers share, for one server instance.
#[derive(Clone)]
pub(crate) struct AppState(Arc<Shared>);

struct Shared {
    front: HttpFront,
    metrics: HttpMetrics,
    registry: Registry,
    draining: CancellationToken,
}

impl AppState {
    pub(crate) fn new(front: HttpFront) -> Self {
        let mut registry = Registry::default();
        let loragate = registry.sub_registry_with_prefix("loragate");
        front.coordinator.metrics().register(loragate);
        for source in &front.metrics_sources {
            source.register(loragate);
        }
        let metrics = HttpMetrics::default();
        metrics.register(loragate.sub_registry_with_prefix("http"));
        // vLLM's names, with vLLM's `model_name` label: the base model's served name.
        let model_name = ("model_name".into(), front.served_model_name.to_string().into());
        front.coordinator.metrics().register_vllm(registry.sub_registry_with_label(model_name.clone()));
        for source in &front.metrics_sources {
            source.register_vllm(registry.sub_registry_with_label(model_name.clone()));
        }
        Self(Arc::new(Shared { front, metrics, registry, draining: CancellationToken::new() }))
    }

    pub(crate) fn front(&self) -> &HttpFront {
        &self.0.front
    }

    pub(crate) fn body_limit(&self) -> usize {
        self.0.front.body_limit
    }

    pub(crate) fn metrics(&self) -> &HttpMetrics {
        &self.0.metrics
    }

    pub(crate) fn registry(&self) -> &Registry {
        &self.0.registry
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.0.draining.is_cancelled()
    }

    /// Says that the server is about to stop (`/health` answers 503 from now on).
    pub(crate) fn mark_draining(&self) {
        self.0.draining.cancel();
    }
}
