//! Shared helpers of the benchmarks.

use loragate_core::testing::{ScriptedEngine, coordinator_with_adapters};
use loragate_core::{AdapterName, Coordinator, CoordinatorConfig};

/// A coordinator over a model-less scripted engine, with one loaded adapter, `bench`: the coordinator benchmarks
/// measure the gate and the registry, not a model.
pub async fn coordinator_with_one_adapter() -> (Coordinator, AdapterName) {
    let coordinator = coordinator_with_adapters(ScriptedEngine::new(1), CoordinatorConfig::default(), &["bench"]).await;
    (coordinator, AdapterName::parse("bench").expect("valid name"))
}
