//! The unload/reload race of issue 13 against the real engine, through the coordinator: loads, unloads and samples
//! of one name run concurrently, and whenever they have settled the coordinator's listing and the engine's weights
//! agree and a listed adapter samples.

use std::sync::Arc;

use loragate_core::{Coordinator, CoordinatorConfig, CoreError};

use super::*;

/// Rounds of (sample, unload, load) run concurrently. Each takes a few milliseconds on the tiny model.
const ROUNDS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unloads_racing_reloads_leave_every_listed_adapter_sampleable() {
    let engine = Arc::new(engine());
    let coordinator = Coordinator::start(engine.clone(), CoordinatorConfig::default()).await.expect("coordinator");
    let dir = TempDir::new("race");
    write_good_adapter(dir.path(), 1);
    let source = AdapterSource::trusted(dir.path());
    let x = name("x");
    coordinator.load_adapter(&x, source.clone()).await.expect("first load");

    let sample = |coordinator: Coordinator| async move {
        let request = request(&tiny_config(vec![]), greedy("x", &[1, 2], 3));
        let stream = coordinator.sample(request, coordinator.gate_deadline(None)).await?;
        stream.collect_output().await
    };
    for round in 0..ROUNDS {
        let sampling = tokio::spawn(sample(coordinator.clone()));
        let unloading = {
            let (coordinator, x) = (coordinator.clone(), x.clone());
            tokio::spawn(async move { coordinator.unload_adapter(&x).await })
        };
        let loading = {
            let (coordinator, x, source) = (coordinator.clone(), x.clone(), source.clone());
            tokio::spawn(async move { coordinator.load_adapter(&x, source).await })
        };
        // Each may lose its race (an unknown adapter); none may fail otherwise.
        let sampled = sampling.await.expect("sample task");
        assert!(matches!(sampled, Ok(_) | Err(CoreError::UnknownAdapter(_))), "round {round}: {sampled:?}");
        let unloaded = unloading.await.expect("unload task");
        assert!(matches!(unloaded, Ok(()) | Err(CoreError::UnknownAdapter(_))), "round {round}: {unloaded:?}");
        let loaded = loading.await.expect("load task");
        assert!(matches!(loaded, Ok(_) | Err(CoreError::UnknownAdapter(_))), "round {round}: {loaded:?}");

        let listed: Vec<_> = coordinator.list_adapters().await.into_iter().map(|s| (s.key, s.version)).collect();
        let installed: Vec<_> = engine.adapters().into_iter().map(|(n, v)| (AdapterKey::Lora(n), v)).collect();
        assert_eq!(listed, installed, "round {round}: the listing and the engine's weights agree");
        if !listed.is_empty() {
            let output = sample(coordinator.clone()).await;
            assert!(output.is_ok(), "round {round}: listed x does not sample: {output:?}");
        } else {
            coordinator.load_adapter(&x, source.clone()).await.expect("reload for the next round");
        }
    }
}
