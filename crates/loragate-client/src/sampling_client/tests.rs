//! The retry algorithm against a scripted server.

use std::sync::Arc;
use std::time::Duration;

use loragate_proto::v1 as pb;
use loragate_proto::v1::FinishReason::{Abort, Length, Stop};
use tonic::Status;

use super::*;
use crate::scripted_server::{Script, lock, response, sequence, serve};

fn params(max_tokens: u32) -> SamplingParams {
    SamplingParams { max_tokens: Some(max_tokens), temperature: 0.7, seed: Some(7), ..Default::default() }
}

fn fast_policy() -> RetryPolicy {
    RetryPolicy {
        deadline: Duration::from_secs(10),
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        wait_poll: Duration::from_millis(20),
        ..RetryPolicy::default()
    }
}

async fn client(script: &Arc<Script>, lora: &str) -> SamplingClient {
    SamplingClient::new(serve(script.clone()).await, lora).with_policy(fast_policy())
}

#[tokio::test]
async fn an_abort_then_a_stop_merge_into_one_sequence_with_the_exact_remaining_budget() {
    let script = Arc::new(Script::answering(vec![
        Ok(response(&[10, 11, 12, 13, 14], Abort, 1)),
        Ok(response(&[15, 16, 17, 257], Stop, 1)),
    ]));
    let sampled = client(&script, "meow").await.sample(vec![1, 2, 3], params(16), 1).await.expect("finished");

    let sequence = &sampled.sequences[0];
    assert_eq!(sequence.token_ids, vec![10, 11, 12, 13, 14, 15, 16, 17, 257]);
    assert_eq!(sequence.logprobs.len(), 9);
    assert_eq!(sequence.finish_reason(), Stop);
    assert_eq!(sequence.segments, vec![pb::VersionSegment { lora_version: 1, kv_version: 1, start: 0, end: 9 }]);

    let requests = lock(&script.samples).clone();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].prompt_token_ids, vec![1, 2, 3, 10, 11, 12, 13, 14], "prompt + accumulated tokens");
    let resubmitted = requests[1].sampling_params.clone().expect("params");
    assert_eq!(resubmitted.max_tokens, Some(11), "16 - 5 accumulated");
    assert_eq!(resubmitted.temperature, 0.7);
    assert_eq!(requests[1].lora_name, "meow");
    assert_eq!(lock(&script.wait_calls).len(), 1, "waited for the adapter to reopen before resubmitting");
}

#[tokio::test]
async fn a_used_up_budget_finishes_with_length_without_another_request() {
    let script = Arc::new(Script::answering(vec![Ok(response(&[10, 11, 12, 13, 14], Abort, 1))]));
    let sampled = client(&script, "meow").await.sample(vec![1], params(5), 1).await.expect("finished");
    assert_eq!(sampled.sequences[0].finish_reason(), Length);
    assert_eq!(sampled.sequences[0].token_ids.len(), 5);
    assert_eq!(lock(&script.samples).len(), 1);
    assert!(lock(&script.wait_calls).is_empty());
}

#[tokio::test]
async fn prompt_logprobs_come_from_the_first_attempt_and_cover_the_original_prompt() {
    let mut first = response(&[10], Abort, 1);
    first.prompt_logprobs = vec![f32::NAN, -1.0, -2.0];
    let mut second = response(&[11], Stop, 2);
    second.prompt_logprobs = vec![f32::NAN, -9.0, -9.0, -9.0];
    let script = Arc::new(Script::answering(vec![Ok(first), Ok(second)]));
    let request = pb::SampleRequest {
        lora_name: "meow".into(),
        prompt_token_ids: vec![1, 2, 3],
        sampling_params: Some(params(8)),
        include_prompt_logprobs: true,
        ..Default::default()
    };
    let sampled = client(&script, "meow").await.sample_request(request).await.expect("finished");
    assert_eq!(sampled.prompt_logprobs.len(), 3);
    assert!(sampled.prompt_logprobs[0].is_nan());
    assert_eq!(&sampled.prompt_logprobs[1..], &[-1.0, -2.0]);
    assert!(!lock(&script.samples)[1].include_prompt_logprobs, "continuations do not recompute prompt logprobs");
}

#[tokio::test]
async fn tokens_keep_the_version_that_produced_them_across_a_swap() {
    let script =
        Arc::new(Script::answering(vec![Ok(response(&[10, 11, 12], Abort, 1)), Ok(response(&[20, 21], Length, 2))]));
    let sampled = client(&script, "meow").await.sample(vec![1], params(5), 1).await.expect("finished");
    let segments: Vec<_> = sampled.sequences[0].segments.iter().map(|s| (s.lora_version, s.start, s.end)).collect();
    assert_eq!(segments, vec![(1, 0, 3), (2, 3, 5)]);
}

#[tokio::test]
async fn transport_errors_back_off_and_keep_what_was_accumulated() {
    let script = Arc::new(Script::answering(vec![
        Ok(response(&[10, 11], Abort, 1)),
        Err(Status::unavailable("connection reset")),
        Err(Status::unavailable("connection refused")),
        Ok(response(&[12], Stop, 1)),
    ]));
    let sampled = client(&script, "meow").await.sample(vec![1], params(8), 1).await.expect("finished");
    assert_eq!(sampled.sequences[0].token_ids, vec![10, 11, 12]);
    let requests = lock(&script.samples).clone();
    assert_eq!(requests.len(), 4);
    for retry in &requests[1..] {
        assert_eq!(retry.prompt_token_ids, vec![1, 10, 11], "the accumulators survive transport errors");
        assert_eq!(retry.sampling_params.as_ref().and_then(|p| p.max_tokens), Some(6));
    }
}

#[tokio::test]
async fn aborts_that_make_no_progress_are_capped_and_reported() {
    let script = Arc::new(Script::new(Box::new(|_| Ok(response(&[], Abort, 1)))));
    let policy = RetryPolicy { max_attempts_without_progress: 3, ..fast_policy() };
    let sampler = SamplingClient::new(serve(script.clone()).await, "meow").with_policy(policy);
    match sampler.sample(vec![1], params(8), 1).await {
        Err(ClientError::NoProgress { attempts, partial }) => {
            assert_eq!(attempts, 3);
            assert_eq!(partial.sequences[0].finish_reason(), Abort);
        }
        other => panic!("expected NoProgress, got {other:?}"),
    }
    assert_eq!(lock(&script.samples).len(), 3);
}

#[tokio::test]
async fn each_aborted_sequence_of_a_multi_sample_request_continues_on_its_own() {
    let script = Arc::new(Script::new(Box::new(|request| {
        if request.num_samples == 3 {
            return Ok(pb::SampleResponse {
                request_id: "r".into(),
                sequences: vec![sequence(&[50, 51], Stop, 1), sequence(&[60], Abort, 1), sequence(&[70, 71], Abort, 1)],
                prompt_logprobs: vec![],
            });
        }
        // A continuation: answer one token that says which prompt it continued.
        let last = *request.prompt_token_ids.last().expect("prompt");
        Ok(response(&[last + 1], Length, 2))
    })));
    let sampled = client(&script, "meow").await.sample(vec![1], params(4), 3).await.expect("finished");
    let tokens: Vec<_> = sampled.sequences.iter().map(|s| s.token_ids.clone()).collect();
    assert_eq!(tokens, vec![vec![50, 51], vec![60, 61], vec![70, 71, 72]], "finished sequences are not redone");
    let reasons: Vec<_> = sampled.sequences.iter().map(|s| s.finish_reason()).collect();
    assert_eq!(reasons, vec![Stop, Length, Length]);

    let mut continuations: Vec<_> = lock(&script.samples).iter().filter(|r| r.num_samples == 1).cloned().collect();
    continuations.sort_by_key(|r| r.prompt_token_ids.clone());
    assert_eq!(continuations.len(), 2);
    assert_eq!(continuations[0].prompt_token_ids, vec![1, 60]);
    assert_eq!(continuations[1].prompt_token_ids, vec![1, 70, 71]);
    let seeds: Vec<_> = continuations.iter().map(|r| r.sampling_params.as_ref().and_then(|p| p.seed)).collect();
    assert_eq!(seeds, vec![Some(8), Some(9)], "sequence i continues with seed + i");
    let budgets: Vec<_> = continuations.iter().map(|r| r.sampling_params.as_ref().and_then(|p| p.max_tokens)).collect();
    assert_eq!(budgets, vec![Some(3), Some(2)]);
}

#[tokio::test]
async fn the_base_model_is_continued_without_waiting_on_a_gate() {
    let script = Arc::new(Script::answering(vec![Ok(response(&[10], Abort, 0)), Ok(response(&[11], Stop, 0))]));
    let sampled = client(&script, "").await.sample(vec![1], params(4), 1).await.expect("finished");
    assert_eq!(sampled.sequences[0].token_ids, vec![10, 11]);
    assert!(lock(&script.wait_calls).is_empty(), "the base model cannot be paused by the control RPCs");
}

#[tokio::test]
async fn a_paused_adapter_is_waited_for_before_resubmitting() {
    let script = Arc::new(Script::answering(vec![Ok(response(&[10], Abort, 1)), Ok(response(&[11], Stop, 2))]));
    lock(&script.waits).extend([true, true, false]);
    let sampled = client(&script, "meow").await.sample(vec![1], params(4), 1).await.expect("finished");
    assert_eq!(sampled.sequences[0].token_ids, vec![10, 11]);
    assert_eq!(lock(&script.wait_calls).len(), 3, "long-polled until paused=false");
    assert!(lock(&script.wait_calls).iter().all(|w| w.lora_name == "meow" && w.timeout_s > 0.0));
}

#[tokio::test]
async fn rejections_are_returned_at_once() {
    let script = Arc::new(Script::answering(vec![Err(Status::invalid_argument("sampling_params.max_tokens: 0"))]));
    match client(&script, "meow").await.sample(vec![1], params(4), 1).await {
        Err(ClientError::Rejected(status)) => assert_eq!(status.code(), tonic::Code::InvalidArgument),
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(lock(&script.samples).len(), 1);
}

#[tokio::test]
async fn the_deadline_ends_the_wait_and_returns_the_partial_output() {
    let script = Arc::new(Script::answering(vec![Ok(response(&[10, 11], Abort, 1))]));
    lock(&script.waits).extend(std::iter::repeat_n(true, 1000));
    let policy = RetryPolicy { deadline: Duration::from_millis(300), ..fast_policy() };
    let sampler = SamplingClient::new(serve(script.clone()).await, "meow").with_policy(policy);
    let started = Instant::now();
    match sampler.sample(vec![1], params(8), 1).await {
        Err(ClientError::DeadlineExceeded { partial }) => {
            assert_eq!(partial.sequences[0].token_ids, vec![10, 11]);
            assert_eq!(partial.sequences[0].finish_reason(), Abort);
        }
        other => panic!("expected the deadline, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_missing_finish_reason_is_a_protocol_error_not_an_abort() {
    let script = Arc::new(Script::answering(vec![Ok(response(&[10], pb::FinishReason::Unspecified, 1))]));
    let outcome = client(&script, "meow").await.sample(vec![1], params(4), 1).await;
    assert!(matches!(outcome, Err(ClientError::Protocol(_))), "{outcome:?}");
    assert_eq!(lock(&script.samples).len(), 1);
}

#[tokio::test]
async fn the_minimum_version_and_cache_salt_are_asked_for_on_the_first_request_and_every_continuation() {
    let script = Arc::new(Script::answering(vec![
        Ok(response(&[10, 11], Abort, 4)),
        Ok(response(&[12], Abort, 5)),
        Ok(response(&[13], Stop, 5)),
    ]));
    let sampler = client(&script, "meow").await.with_min_lora_version(4);
    let sampled = sampler.sample(vec![1], params(8), 1).await.expect("finished");
    assert_eq!(sampled.sequences[0].token_ids, vec![10, 11, 12, 13]);
    let requests = lock(&script.samples).clone();
    assert_eq!(requests.len(), 3);
    assert!(requests.iter().all(|r| r.min_lora_version == 4), "{requests:?}");

    let script = Arc::new(Script::answering(vec![Ok(response(&[10], Abort, 7)), Ok(response(&[11], Stop, 7))]));
    let request = pb::SampleRequest {
        lora_name: "meow".into(),
        prompt_token_ids: vec![1],
        sampling_params: Some(params(4)),
        min_lora_version: 7,
        cache_salt: "tenant-a".into(),
        ..Default::default()
    };
    client(&script, "meow").await.sample_request(request).await.expect("finished");
    let requests = lock(&script.samples).clone();
    assert!(requests.iter().all(|r| r.min_lora_version == 7 && r.cache_salt == "tenant-a"), "{requests:?}");
}

#[tokio::test]
async fn a_minimum_version_not_reached_in_time_is_retried_until_the_deadline() {
    // The server holds a request for a version it does not have up to its own limit, then answers UNAVAILABLE
    // (`version_not_reached`): the version may still arrive, so the client tries again until its deadline.
    let script = Arc::new(Script::answering(vec![
        Err(Status::unavailable("version_not_reached: meow is at version 3, the request needs 4")),
        Ok(response(&[10], Stop, 4)),
    ]));
    let sampler = client(&script, "meow").await.with_min_lora_version(4);
    let sampled = sampler.sample(vec![1], params(4), 1).await.expect("served once the version arrived");
    assert_eq!(sampled.sequences[0].segments[0].lora_version, 4);
    assert_eq!(lock(&script.samples).len(), 2);
}

#[tokio::test]
async fn samples_present_the_api_key() {
    let script = Arc::new(Script::answering(vec![Ok(response(&[10], Abort, 1)), Ok(response(&[11], Stop, 1))]));
    let channel = crate::scripted_server::serve_with(script.clone(), Some("api-key")).await;
    let key = crate::channel::BearerKey::new("api-key", "api_key").expect("key");
    let sampler = SamplingClient::with_key(channel.clone(), "meow", key).with_policy(fast_policy());
    let sampled = sampler.sample(vec![1], params(4), 1).await.expect("the sample and the wait present the key");
    assert_eq!(sampled.sequences[0].token_ids, vec![10, 11]);
    assert_eq!(lock(&script.wait_calls).len(), 1);
    let unkeyed = SamplingClient::new(channel, "meow").with_policy(fast_policy());
    match unkeyed.sample(vec![1], params(4), 1).await {
        Err(ClientError::Rejected(status)) => assert_eq!(status.code(), tonic::Code::Unauthenticated),
        other => panic!("expected UNAUTHENTICATED, got {other:?}"),
    }
}
