//! Futures across a restart: a coordinator and its front shut down, and a new pair started on the same state store
//! (as `loragate serve` does on the same `--state-dir`). A sample pending at the restart resolves afterwards under its
//! request id, with its full budget; a finished result is served again; a resubmission of the same `seq_id` still
//! finds its future; an earlier process's id that was never recorded gets 410; a sample that had produced tokens
//! continues from those it recorded. (`crates/loragate/tests/restart.rs`
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
async fn a_sample_continued_after_a_restart_keeps_the_tokens_it_had_recorded_and_samples_only_the_rest() {
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
    let coordinator = coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), config_on(&store), &["meow"]);
    let h = serve_on(coordinator.await, |_| {}).await;
    let session = h.sampling_session(Some("tinker://loragate/meow")).await;
    // Each sequence produces HOLD_AFTER tokens, then waits for more: its progress is recorded on time all the same.
    let params = json!({"max_tokens": 2 * HOLD_AFTER, "temperature": 1.0, "seed": 40});
    let body = json!({"num_samples": 2, "prompt_logprobs": true, "sampling_params": params});
    let pending = h.submit(&session, 0, body).await;
    eventually("the sample's tokens are recorded", || async {
        let records = store.recorded().await.expect("read").front_records;
        records.iter().any(|record| record.key == pending && record.value.contains("\"produced\""))
    })
    .await;
    h.coordinator.shutdown(Duration::ZERO).await;
    drop(h);

    type Seen = (Vec<u32>, u32, u32, Option<u64>, bool, String);
    let continued: Arc<std::sync::Mutex<Vec<Seen>>> = Arc::default();
    let seen = continued.clone();
    let engine = ScriptedEngine::new(HOLD_AFTER).with_generate_hook(Box::new(move |request, _| {
        let params = request.params();
        let what = (
            request.prompt().to_vec(),
            request.num_samples(),
            params.max_tokens(),
            params.seed(),
            request.include_prompt_logprobs(),
            request.id().to_string(),
        );
        seen.lock().expect("lock").push(what);
    }));
    let coordinator = Coordinator::start(Arc::new(engine), config_on(&store)).await.expect("restarts");
    let h = serve_on(coordinator, |_| {}).await;
    let response = h.retrieve(&pending).await.finished();
    assert_eq!(response.sequences.len(), 2);
    for sequence in &response.sequences {
        assert_eq!(int32s(&sequence.tokens), [0, 1, 2, 0, 1, 2], "the recorded tokens, then the continuation's");
        assert_eq!(sequence.stop_reason(), StopReason::Length);
    }
    let prompt_logprobs = response.prompt_logprobs.expect("asked for");
    assert_eq!(prompt_logprobs.len(), 4 * 2, "the original prompt's, as recorded");

    let mut requests = continued.lock().expect("lock").clone();
    requests.sort_by_key(|seen| seen.3);
    let expected = |seed: u64| (vec![72, 105, 0, 1, 2], 1, HOLD_AFTER, Some(seed), false, pending.clone());
    assert_eq!(requests, [expected(40), expected(41)], "one request per sequence: prompt + its tokens, the rest");
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
