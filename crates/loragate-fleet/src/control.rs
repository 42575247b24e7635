//! The fleet as the fronts see it beyond the [`Engine`](loragate_core::Engine): the core's [`FleetControl`] (driven
//! by the `Fleet` gRPC service) and [`MetricsSource`] (per-worker metrics on `/metrics`).

use loragate_core::{FleetControl, FleetControlError, FleetSnapshot, MetricsSource, WorkerSnapshot};
use prometheus_client::registry::Registry;

use crate::address::WorkerAddress;
use crate::engine::FleetEngine;

#[async_trait::async_trait]
impl FleetControl for FleetEngine {
    fn snapshot(&self) -> FleetSnapshot {
        let roster = self.membership().roster();
        let workers = roster
            .workers
            .iter()
            .map(|worker| WorkerSnapshot {
                address: worker.link.address().to_string(),
                state: worker.state,
                in_flight: worker.link.in_flight(),
                adapters: worker.adapters.iter().cloned().collect(),
                last_error: worker.last_error.clone(),
                consecutive_failures: worker.failures.consecutive_failures(),
                next_probe: worker.failures.next_probe(),
            })
            .collect();
        FleetSnapshot { epoch: roster.epoch, workers }
    }

    async fn add_worker(&self, address: &str) -> Result<(), FleetControlError> {
        let address = WorkerAddress::parse(address)?;
        Ok(self.membership().add(address).await?)
    }

    async fn remove_worker(&self, address: &str, drain: bool) -> Result<(), FleetControlError> {
        let address = WorkerAddress::parse(address)?;
        Ok(self.membership().remove(address, drain).await?)
    }
}

impl MetricsSource for FleetEngine {
    fn register(&self, registry: &mut Registry) {
        self.metrics().register(registry.sub_registry_with_prefix("fleet"));
    }

    fn refresh(&self) {
        self.metrics().set_gauges(&self.membership().roster());
    }
}
