//! Hostile HTTP workers cannot hold or flood the coordinator: each misbehaviour of [`crate::hostile`] ends the
//! sequence within its bounds (its budget, the first-byte and inter-chunk timeouts, the event cap, the vocabulary),
//! never follows a redirect, stops reading the worker's stream, and counts a failure of the worker.

use std::sync::atomic::Ordering;
use std::time::Duration;

use loragate_core::testing::eventually;
use loragate_core::{Coordinator, FinishReason, FleetControl, SampleOutput};
use loragate_fleet::{FleetConfig, FleetEngine};

use super::{fleet_with, raw, sample};
use crate::hostile::{Elsewhere, Hostile, Misbehaviour, Speaks};

/// Short timeouts (only hostile workers are in these fleets), and a failure record that is not cleared during a
/// test (a thousand healthy checks in a row would clear it).
fn config() -> FleetConfig {
    FleetConfig {
        first_byte_timeout: Duration::from_secs(1),
        inter_chunk_timeout: Duration::from_secs(1),
        failure_threshold: 1000,
        ..super::config()
    }
}

/// A fleet of `worker` alone.
async fn fleet_of(worker: &Hostile) -> (std::sync::Arc<FleetEngine>, Coordinator) {
    fleet_with(&[worker.url()], config()).await
}

/// A sample of the base model with budget `max_tokens`, to its end.
async fn sampled(coordinator: &Coordinator, max_tokens: u32) -> Result<SampleOutput, String> {
    sample(coordinator, raw("", max_tokens)).await.collect_output().await.map_err(|err| err.to_string())
}

/// Waits until the fleet counted a failure of its only worker.
async fn counted_failing(fleet: &FleetEngine) {
    eventually("the worker counted a failure", || async {
        fleet.snapshot().workers.first().is_some_and(|worker| worker.consecutive_failures >= 1)
    })
    .await;
}

/// Waits until the worker saw its stream dropped.
async fn stream_dropped(worker: &Hostile) {
    eventually("the fleet dropped the worker's stream", || async { worker.seen.dropped.load(Ordering::SeqCst) }).await;
}

#[tokio::test]
async fn a_worker_streaming_past_the_budget_is_cut_at_it_and_counted_failing() {
    for speaks in [Speaks::Vllm, Speaks::Sglang] {
        let worker = Hostile::start(speaks, Misbehaviour::Overrun);
        let (fleet, coordinator) = fleet_of(&worker).await;
        let output = sampled(&coordinator, 8).await.expect("a whole sample");
        let sequence = &output.sequences[0];
        assert_eq!((sequence.finish_reason, sequence.token_ids.len()), (FinishReason::Length, 8), "{speaks:?}");
        assert_eq!(sequence.token_ids, (11..=18).collect::<Vec<u32>>(), "{speaks:?}: the budget's tokens, in order");
        stream_dropped(&worker).await;
        counted_failing(&fleet).await;
    }
}

#[tokio::test]
async fn a_worker_that_never_answers_or_trickles_a_line_hands_the_sequence_back_aborted_with_its_tokens() {
    for (speaks, misbehaviour, tokens) in [
        (Speaks::Vllm, Misbehaviour::NoHead, 0),
        (Speaks::Sglang, Misbehaviour::NoHead, 0),
        (Speaks::Vllm, Misbehaviour::Trickle, 2),
        (Speaks::Sglang, Misbehaviour::Trickle, 2),
    ] {
        let worker = Hostile::start(speaks, misbehaviour);
        let (fleet, coordinator) = fleet_of(&worker).await;
        let output = sampled(&coordinator, 100).await.expect("handed back, not failed");
        let sequence = &output.sequences[0];
        assert_eq!(
            (sequence.finish_reason, sequence.token_ids.len()),
            (FinishReason::Abort, tokens),
            "{speaks:?} {misbehaviour:?}: aborted (retryable) with every token received"
        );
        counted_failing(&fleet).await;
        if tokens > 0 {
            stream_dropped(&worker).await;
        }
    }
}

#[tokio::test]
async fn an_endless_line_or_a_token_outside_the_vocabulary_is_a_protocol_error() {
    for speaks in [Speaks::Vllm, Speaks::Sglang] {
        let worker = Hostile::start(speaks, Misbehaviour::EndlessLine);
        let (fleet, coordinator) = fleet_of(&worker).await;
        let err = sampled(&coordinator, 100).await.expect_err("a protocol error");
        assert!(err.contains("broke its protocol") && err.contains("4 MiB"), "{speaks:?}: {err}");
        stream_dropped(&worker).await;
        counted_failing(&fleet).await;
        let sent = worker.seen.bytes_sent.load(Ordering::SeqCst);
        assert!(sent < 64 << 20, "{speaks:?}: the line was not read on ({sent} bytes sent)");

        let worker = Hostile::start(speaks, Misbehaviour::BadToken);
        let (fleet, coordinator) = fleet_of(&worker).await;
        let err = sampled(&coordinator, 100).await.expect_err("a protocol error");
        assert!(err.contains("999999") && err.contains("outside the vocabulary"), "{speaks:?}: {err}");
        counted_failing(&fleet).await;
    }
}

#[tokio::test]
async fn a_redirect_is_never_followed() {
    let elsewhere = Elsewhere::start();
    for speaks in [Speaks::Vllm, Speaks::Sglang] {
        let worker = Hostile::start(speaks, Misbehaviour::RedirectTo(elsewhere.port()));
        let (_fleet, coordinator) = fleet_of(&worker).await;
        let output = sampled(&coordinator, 8).await.expect("handed back");
        assert_eq!(output.sequences[0].finish_reason, FinishReason::Abort, "{speaks:?}: no worker could run it");
        assert_eq!(worker.seen.requests.load(Ordering::SeqCst), 1, "{speaks:?}");
    }
    assert_eq!(elsewhere.requests.load(Ordering::SeqCst), 0, "nothing reached the redirect's target");
}
