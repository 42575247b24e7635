//! The fleet as the fronts see it beyond the [`Engine`](loragate_core::Engine): the `Fleet` gRPC service's
//! [`FleetControl`] and the HTTP front's [`MetricsSource`].

use loragate_grpc::{FleetControl, FleetControlError, FleetSnapshot, WorkerSnapshot};
use loragate_http::MetricsSource;
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
            })
            .collect();
        FleetSnapshot { epoch: roster.epoch, workers }
    }

    async fn add_worker(&self, address: &str) -> Result<(), FleetControlError> {
        let address = WorkerAddress::parse(address)?;
        Ok(self.membership().add(address).await?)
    }

    async fn remove_worker(&self, address: &str, drain: bool) -> Result<(), FleetControlError> {
        Ok(self.membership().remove(address.to_owned(), drain).await?)
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
