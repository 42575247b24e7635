//! The trainer's control calls against a scripted server: each sends what its options say.

use std::sync::Arc;
use std::time::Duration;

use loragate_proto::v1 as pb;

use super::*;
use crate::channel::BearerKey;
use crate::scripted_server::{Script, lock, serve, serve_with};

async fn trainer(script: &Arc<Script>) -> TrainerClient {
    TrainerClient::new(serve(script.clone()).await)
}

#[tokio::test]
async fn a_pause_sends_its_mode_owner_lease_and_kv_policy_and_a_resume_its_pause_id() {
    let script = Arc::new(Script::answering(vec![]));
    let trainer = trainer(&script).await;
    let options = PauseOptions {
        mode: PauseMode::Keep,
        owner: "trainer-0".into(),
        lease: Some(Duration::from_millis(2500)),
        kv_policy: KvPolicy::Reuse,
    };
    let paused = trainer.pause("meow", options).await.expect("paused");
    assert_eq!(paused.pause_id, "pause-1");
    trainer.pause("meow", PauseOptions::default()).await.expect("paused again");
    let resumed = trainer.resume("meow", Some(&paused.pause_id)).await.expect("resumed");
    assert!(resumed.was_paused);
    trainer.resume("meow", None).await.expect("resumed every pause");

    let pauses = lock(&script.pauses).clone();
    assert_eq!(pauses[0].mode(), PauseMode::Keep);
    assert_eq!(pauses[0].owner, "trainer-0");
    assert_eq!(pauses[0].lease_s, 2.5);
    assert_eq!(pauses[0].kv_policy(), KvPolicy::Reuse);
    assert_eq!(
        (pauses[1].mode(), pauses[1].owner.as_str(), pauses[1].lease_s, pauses[1].kv_policy()),
        (PauseMode::Abort, "", 0.0, KvPolicy::Recompute),
        "the default pause aborts, anonymously, without a lease"
    );
    let resumes: Vec<_> = lock(&script.resumes).iter().map(|r| r.pause_id.clone()).collect();
    assert_eq!(resumes, vec!["pause-1".to_owned(), String::new()]);
}

#[tokio::test]
async fn wait_unpaused_is_true_once_open_and_false_when_the_timeout_passes_first() {
    let script = Arc::new(Script::answering(vec![]));
    lock(&script.waits).extend([true, false]);
    let trainer = trainer(&script).await;
    assert!(!trainer.wait_unpaused("meow", Duration::from_millis(10)).await.expect("answered"));
    assert!(trainer.wait_unpaused("meow", Duration::from_secs(30)).await.expect("answered"));
    let timeouts: Vec<_> = lock(&script.wait_calls).iter().map(|w| w.timeout_s).collect();
    assert_eq!(timeouts, vec![0.01, 30.0]);
}

#[tokio::test]
async fn the_atomic_swap_sends_its_mode_and_kv_policy() {
    let script = Arc::new(Script::answering(vec![]));
    let trainer = trainer(&script).await;
    let swapped = trainer.swap_adapter_atomic("meow", "woof", SwapOptions::default()).await.expect("swapped");
    assert_eq!((swapped.version, swapped.kept_count), (8, 1));
    let abort = SwapOptions { mode: PauseMode::Abort, kv_policy: KvPolicy::Reuse };
    trainer.swap_adapter_atomic("meow", "woof", abort).await.expect("swapped");
    let swaps = lock(&script.swaps).clone();
    assert_eq!((swaps[0].lora_name.as_str(), swaps[0].path.as_str()), ("meow", "woof"));
    assert_eq!((swaps[0].mode(), swaps[0].kv_policy()), (PauseMode::Keep, KvPolicy::Recompute), "keep by default");
    assert_eq!((swaps[1].mode(), swaps[1].kv_policy()), (PauseMode::Abort, KvPolicy::Reuse));
}

#[tokio::test]
async fn staleness_is_set_and_cleared_and_adapters_are_listed() {
    let script = Arc::new(Script::answering(vec![]));
    lock(&script.adapters).push(pb::LoraAdapterStatus { lora_name: "meow".into(), version: 3, ..Default::default() });
    let trainer = trainer(&script).await;
    let set = trainer.set_staleness("meow", 2, 8).await.expect("set").expect("a policy in force");
    assert_eq!((set.max_staleness, set.batch_size, set.capacity), (2, 8, 24));
    assert_eq!(trainer.set_staleness("meow", 0, 0).await.expect("cleared"), None);
    let sent: Vec<_> = lock(&script.staleness).iter().map(|s| (s.max_staleness, s.batch_size)).collect();
    assert_eq!(sent, vec![(2, 8), (0, 0)]);
    let listed = trainer.list_adapters().await.expect("listed");
    assert_eq!(listed.iter().map(|a| (a.lora_name.as_str(), a.version)).collect::<Vec<_>>(), vec![("meow", 3)]);
}

#[tokio::test]
async fn calls_present_the_key_and_are_refused_without_it() {
    let script = Arc::new(Script::answering(vec![]));
    let channel = serve_with(script.clone(), Some("admin-key")).await;
    let keyed = TrainerClient::with_key(channel.clone(), BearerKey::new("admin-key", "admin_key").expect("key"));
    keyed.list_adapters().await.expect("the key is presented");
    match TrainerClient::new(channel).list_adapters().await {
        Err(ClientError::Rejected(status)) => assert_eq!(status.code(), tonic::Code::Unauthenticated),
        other => panic!("expected UNAUTHENTICATED, got {other:?}"),
    }
}

#[tokio::test]
async fn server_refusals_come_back_as_rejections_with_their_status() {
    let script = Arc::new(Script::answering(vec![]));
    *lock(&script.abort_error) = Some(tonic::Status::not_found("adapter `nope` is not loaded"));
    match trainer(&script).await.pause("nope", PauseOptions::default()).await {
        Err(ClientError::Rejected(status)) => {
            assert_eq!(status.code(), tonic::Code::NotFound);
            assert!(status.message().contains("nope"));
        }
        other => panic!("expected NOT_FOUND, got {other:?}"),
    }
}
