//! Shared helpers of the benchmarks.

use std::sync::Arc;

use loragate_core::testing::ScriptedEngine;
use loragate_core::{AdapterName, AdapterSource, Coordinator, CoordinatorConfig};

/// A coordinator over a model-less scripted engine, with one loaded adapter, `bench`: the coordinator benchmarks
/// measure the gate and the registry, not a model.
pub async fn coordinator_with_one_adapter() -> (Coordinator, AdapterName) {
    let engine = Arc::new(ScriptedEngine::new(1));
    let coordinator = Coordinator::start(engine, CoordinatorConfig::default()).await.expect("the coordinator starts");
    let name = AdapterName::parse("bench").expect("valid name");
    coordinator.load_adapter(&name, AdapterSource::trusted("/bench")).await.expect("the adapter loads");
    (coordinator, name)
}
