//! Engine weights belong to (name, version): an unload or a retired load never removes weights that a later load of
//! the same name installed. The scripted engine's load permits pin each interleaving.

use super::*;

async fn started(engine: &Arc<ScriptedEngine>) -> Coordinator {
    Coordinator::start(engine.clone(), CoordinatorConfig::default()).await.expect("the coordinator starts")
}

#[tokio::test]
async fn an_unload_that_finishes_after_a_reload_leaves_the_reloaded_weights_served() {
    let engine = Arc::new(ScriptedEngine::new(HOLD_AFTER));
    let coordinator = started(&engine).await;
    let meow = name("meow");
    coordinator.load_adapter(&meow, AdapterSource::trusted("/a/meow")).await.expect("v1");

    // A caller that never reads its stream: the unload waits for that request's hand-back before it frees weights.
    let hold_until = coordinator.gate_deadline(None);
    let unread = coordinator.sample(request(&coordinator, "meow", LONG, "unread"), hold_until).await.expect("admitted");
    let unload = {
        let (coordinator, meow) = (coordinator.clone(), meow.clone());
        tokio::spawn(async move { coordinator.unload_adapter(&meow).await })
    };
    eventually("meow is unpublished", || async { coordinator.lora(&meow).is_err() }).await;
    let reloaded = coordinator.load_adapter(&meow, AdapterSource::trusted("/a/meow-2")).await.expect("reload").version;
    assert_eq!(reloaded, AdapterVersion(2));
    assert_eq!(engine.installed(&meow), Some(AdapterVersion(2)));

    drop(unread);
    joined(unload).await.expect("the unload finishes");
    assert_eq!(engine.installed(&meow), Some(AdapterVersion(2)), "the unload of v1 left v2 alone");
    let output = joined(spawn_sample(&coordinator, "meow", SHORT, "after")).await.expect("meow still samples");
    assert_eq!(
        output.sequences[0].segments,
        vec![Segment { version: AdapterVersion(2), kv_version: AdapterVersion(2), start: 0, end: SHORT }]
    );
}

#[tokio::test]
async fn a_load_that_finishes_after_its_adapter_was_unloaded_removes_only_what_it_installed() {
    let slow = Arc::new(Semaphore::new(0));
    let engine = Arc::new(ScriptedEngine::new(HOLD_AFTER).with_load_permits_for("/a/slow", slow.clone()));
    let coordinator = started(&engine).await;
    let meow = name("meow");
    coordinator.load_adapter(&meow, AdapterSource::trusted("/a/meow")).await.expect("v1");

    let late = {
        let (coordinator, meow) = (coordinator.clone(), meow.clone());
        tokio::spawn(async move { coordinator.load_adapter(&meow, AdapterSource::trusted("/a/slow")).await })
    };
    eventually("the slow load (v2) reached the engine", || async { engine.loads_started() == 2 }).await;
    coordinator.unload_adapter(&meow).await.expect("unload");
    assert_eq!(engine.installed(&meow), None);
    let reloaded = coordinator.load_adapter(&meow, AdapterSource::trusted("/a/fresh")).await.expect("reload").version;
    assert_eq!(reloaded, AdapterVersion(3), "the reload counts on from the version the unloaded adapter reserved");

    slow.add_permits(1);
    assert!(matches!(joined(late).await, Err(CoreError::UnknownAdapter(_))), "the late load's adapter is gone");
    assert_eq!(engine.installed(&meow), Some(AdapterVersion(3)), "neither installed over nor removed v3");
    let output = joined(spawn_sample(&coordinator, "meow", SHORT, "after")).await.expect("meow still samples");
    assert_eq!(
        output.sequences[0].segments,
        vec![Segment { version: AdapterVersion(3), kv_version: AdapterVersion(3), start: 0, end: SHORT }]
    );
    assert_eq!(coordinator.list_adapters().await[0].version, AdapterVersion(3));
}

/// The race of issue 20 (item 10): a request admitted before an unload, still on its way to the engine, while a load
/// of the unloaded adapter finishes. The load must not remove the weights under that request: only the unload does,
/// once every admitted request was handed back.
#[tokio::test]
async fn a_load_finishing_after_an_unload_leaves_the_weights_to_requests_admitted_before_it() {
    let slow = Arc::new(Semaphore::new(0));
    let engine = Arc::new(ScriptedEngine::new(HOLD_AFTER).with_load_permits_for("/a/slow", slow.clone()));
    // The unload waits for the hand-back below however slow the machine is.
    let config = CoordinatorConfig { abort_ack_timeout: Duration::from_secs(3600), ..CoordinatorConfig::default() };
    let coordinator = Coordinator::start(engine.clone(), config).await.expect("the coordinator starts");
    let meow = name("meow");
    coordinator.load_adapter(&meow, AdapterSource::trusted("/a/meow")).await.expect("v1");
    let late = {
        let (coordinator, meow) = (coordinator.clone(), meow.clone());
        tokio::spawn(async move { coordinator.load_adapter(&meow, AdapterSource::trusted("/a/slow")).await })
    };
    eventually("the slow load (v2) reached the engine", || async { engine.loads_started() == 2 }).await;

    // Admitted, but not yet in the engine (a loaded machine can stall a task right there).
    let request = request(&coordinator, "meow", LONG, "on-its-way");
    let hold_until = coordinator.gate_deadline(None).hold_until();
    let admission = coordinator.lora(&meow).expect("meow").admit(request.id().clone(), hold_until).await.expect("in");
    let unload = {
        let (coordinator, meow) = (coordinator.clone(), meow.clone());
        tokio::spawn(async move { coordinator.unload_adapter(&meow).await })
    };
    eventually("meow is unpublished", || async { coordinator.lora(&meow).is_err() }).await;
    assert!(admission.cancel_token().is_cancelled(), "the unload cancelled the admitted request");
    slow.add_permits(1);
    assert!(matches!(joined(late).await, Err(CoreError::UnknownAdapter(_))), "the late load's adapter is gone");

    // The admitted request reaches the engine now: its adapter's weights are still there, and it ends aborted.
    let events = engine.generate(request, admission.cancel_token().clone()).await;
    assert!(events.is_ok(), "an admitted request found its weights removed: {:?}", events.err());
    assert!(!unload.is_finished(), "the unload waits for the admitted request's hand-back");
    admission.hand_back(Ending::Aborted);
    joined(unload).await.expect("the unload finishes");
    assert_eq!(engine.installed(&meow), None, "the unload removed every version it sealed, the late load's too");
}
