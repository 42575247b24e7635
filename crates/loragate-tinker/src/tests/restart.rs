//! Futures across a restart: a coordinator and its front shut down, and a new pair started on the same state store
//! (as `loragate serve` does on the same `--state-dir`). A sample pending at the restart resolves afterwards under its
//! request id, with its full budget; a finished result is served again; a resubmission of the same `seq_id` still
//! finds its future; an earlier process's id that was never recorded gets 410. (`crates/loragate/tests/restart.rs`
//! does the same with `kill -9` of the real binary.)

use loragate_core::MemoryStore;
use loragate_core::state::StateStore;

use super::*;

fn config_on(store: &Arc<dyn StateStore>) -> CoordinatorConfig {
    CoordinatorConfig { state: store.clone(), ..CoordinatorConfig::default() }
}

#[tokio::test]
async fn a_pending_future_resolves_and_a_result_is_served_again_after_a_restart() {
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
    let coordinator = coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), config_on(&store), &["meow", "woof"]);
    let h = serve_on(coordinator.await, |_| {}).await;
    let woof_session = h.sampling_session(Some("tinker://loragate/woof")).await;
    let finished = h.submit(&woof_session, 0, json!({})).await;
    let result = h.retrieve(&finished).await.finished();
    h.coordinator.abort(&meow()).await.expect("pause meow");
    let meow_session = h.sampling_session(Some("tinker://loragate/meow")).await;
    let budget = json!({"num_samples": 2, "sampling_params": {"max_tokens": HOLD_AFTER}});
    let pending = h.submit(&meow_session, 5, budget.clone()).await;
    let meow_handle = h.coordinator.lora(&meow()).expect("loaded");
    eventually("the sample is held at meow's gate", || async { meow_handle.status().await.expect("status").held == 1 })
        .await;
    eventually("woof's result is recorded", || async {
        let records = store.recorded().await.expect("read").front_records;
        records.iter().any(|record| record.key == finished && record.value.contains("\"finished\""))
    })
    .await;
    h.coordinator.shutdown(Duration::ZERO).await;
    drop(h);

    let engine = Arc::new(ScriptedEngine::new(HOLD_AFTER));
    let coordinator = Coordinator::start(engine, config_on(&store)).await.expect("restarts");
    let h = serve_on(coordinator, |_| {}).await;
    let (status, waiting) = h.poll(&pending).await.json();
    assert_eq!((status, &waiting["queue_state"]), (StatusCode::OK, &json!("paused_capacity")), "{waiting}");
    assert_eq!(h.submit(&meow_session, 5, budget).await, pending, "a resubmission finds the restored future");
    assert_eq!(h.poll(&finished).await.finished(), result, "the result is served again");

    h.coordinator.resume(&meow(), None).await.expect("resume meow");
    let response = h.retrieve(&pending).await.finished();
    assert_eq!(response.sequences.len(), 2);
    for sequence in &response.sequences {
        assert_eq!(int32s(&sequence.tokens), [0, 1, 2], "the whole budget");
    }

    let last = if finished.ends_with('0') { '1' } else { '0' };
    let never_recorded = format!("{}{last}", &finished[..finished.len() - 1]);
    let (status, _) = h.poll(&never_recorded).await.json();
    assert_eq!(status, StatusCode::GONE, "an earlier process's id that was not recorded: the SDK resubmits");
}

#[tokio::test]
async fn results_leave_the_store_with_the_table_and_a_settled_future_replaces_its_pending_record() {
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
    let coordinator = coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), config_on(&store), &["meow"]);
    let h = serve_on(coordinator.await, |config| config.retention.max_results = 1).await;
    let session = h.sampling_session(Some("tinker://loragate/meow")).await;
    let records = || async { store.recorded().await.expect("read").front_records };
    let first = h.submit(&session, 0, json!({})).await;
    h.retrieve(&first).await.finished();
    let second = h.submit(&session, 1, json!({})).await;
    h.retrieve(&second).await.finished();
    eventually("only the retained result is recorded", || async {
        let records = records().await;
        records.len() == 1 && records[0].key == second && records[0].value.contains("\"finished\"")
    })
    .await;
}
