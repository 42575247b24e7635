//! Shared helpers of the benchmarks: a coordinator over an engine that only holds adapters, so the benchmarks
//! measure the gate and the registry, not a model.

use std::sync::Arc;

use async_trait::async_trait;
use loragate_core::{
    AdapterName, AdapterSource, AdapterVersion, Coordinator, CoordinatorConfig, Engine, EngineError, EngineStream,
    ModelInfo, SampleRequest,
};
use tokio_util::sync::CancellationToken;

/// An engine that accepts adapter loads and refuses to generate: the coordinator benchmarks admit and abort
/// through [`loragate_core::AdapterHandle`] directly.
pub struct LoadOnlyEngine {
    info: ModelInfo,
}

impl Default for LoadOnlyEngine {
    fn default() -> Self {
        Self { info: ModelInfo { vocab_size: 260, context_length: 4096, eos_token_ids: vec![257] } }
    }
}

#[async_trait]
impl Engine for LoadOnlyEngine {
    fn model_info(&self) -> &ModelInfo {
        &self.info
    }

    async fn generate(&self, _request: SampleRequest, _cancel: CancellationToken) -> Result<EngineStream, EngineError> {
        Err(EngineError::Internal("the benchmark engine does not generate".into()))
    }

    async fn load_adapter(&self, _: &AdapterName, _: AdapterVersion, _: &AdapterSource) -> Result<(), EngineError> {
        Ok(())
    }

    async fn unload_adapter(&self, _: &AdapterName) -> Result<(), EngineError> {
        Ok(())
    }
}

/// A coordinator with one loaded adapter, `bench`.
pub async fn coordinator_with_one_adapter() -> (Coordinator, AdapterName) {
    let coordinator = Coordinator::start(Arc::new(LoadOnlyEngine::default()), CoordinatorConfig::default())
        .await
        .expect("the coordinator starts");
    let name = AdapterName::parse("bench").expect("valid name");
    coordinator.load_adapter(&name, AdapterSource::trusted("/bench")).await.expect("the adapter loads");
    (coordinator, name)
}
