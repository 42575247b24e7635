//! The swap helper against a scripted server: it always reopens the adapter.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::Status;

use super::*;
use crate::scripted_server::{Script, lock, serve};

fn script() -> Script {
    Script::answering(vec![])
}

async fn eventually_called(script: &Script, call: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lock(&script.control_calls).iter().any(|c| c == call) {
        assert!(Instant::now() < deadline, "{call} never happened: {:?}", lock(&script.control_calls));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_swap_aborts_loads_and_reopens_in_that_order() {
    let script = Arc::new(script());
    let trainer = TrainerClient::new(serve(script.clone()).await);
    let report = trainer.swap_adapter("meow", "meow-step-2").await.expect("swapped");
    assert_eq!(report, SwapReport { version: 7, aborted_count: 2, aborted_request_ids: vec!["a".into(), "b".into()] });
    assert_eq!(*lock(&script.control_calls), vec!["abort meow", "load meow meow-step-2", "resume meow"]);
}

#[tokio::test]
async fn a_failed_load_still_reopens_the_adapter_and_reports_the_failure() {
    let script = Arc::new(script());
    *lock(&script.load_error) = Some(Status::failed_precondition("q_proj has the wrong shape"));
    let trainer = TrainerClient::new(serve(script.clone()).await);
    match trainer.swap_adapter("meow", "broken").await {
        Err(ClientError::Rejected(status)) => assert_eq!(status.code(), tonic::Code::FailedPrecondition),
        other => panic!("expected the load's failure, got {other:?}"),
    }
    assert_eq!(lock(&script.control_calls).last().map(String::as_str), Some("resume meow"));
}

#[tokio::test]
async fn a_failed_abort_still_reopens_the_adapter() {
    let script = Arc::new(script());
    *lock(&script.abort_error) = Some(Status::unavailable("connection reset mid-call"));
    let trainer = TrainerClient::new(serve(script.clone()).await);
    assert!(trainer.swap_adapter("meow", "p").await.is_err());
    eventually_called(&script, "resume meow").await;
    assert!(!lock(&script.control_calls).iter().any(|c| c.starts_with("load")), "no load after a failed abort");
}

#[tokio::test]
async fn a_swap_dropped_half_way_still_reopens_the_adapter() {
    let blocker = Arc::new(Notify::new());
    let script = Arc::new(Script { load_blocker: Some(blocker.clone()), ..script() });
    let trainer = TrainerClient::new(serve(script.clone()).await);
    let swap = tokio::spawn(async move { trainer.swap_adapter("meow", "p").await });
    eventually_called(&script, "load meow p").await;
    swap.abort();
    eventually_called(&script, "resume meow").await;
    blocker.notify_waiters();
}
