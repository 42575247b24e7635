//! The retry client against a real server with the demo model (issue 5): aborted samples come back finished,
//! token-exact, with each token's adapter version; other adapters never notice.
//!
//! Every test first makes sure the work it pauses was really running: the engine stalls it after a few tokens until
//! the pause cancels it ([`DemoServer::stall_next`]), and the abort reports its request ids, so none of them depends
//! on the pause landing in time and none would pass if it came too late to matter.

use loragate_client::{SamplingClient, TrainerClient};
use loragate_core::testing::eventually_within as eventually;
use loragate_proto::v1::{self as pb, FinishReason, SampleResponse, SampledSequence};
use loragate_tests::{DemoServer, PATIENCE, sample_request, text};
use tokio::task::JoinHandle;

/// A budget that cannot be spent before the pause: each paused sample stalls after [`STALL_AFTER`] tokens.
const LONG: u32 = 192;

/// How many tokens per sequence a sample that is paused mid-generation produces before it stalls.
const STALL_AFTER: u32 = 8;

fn params(max_tokens: u32) -> pb::SamplingParams {
    // The demo adapters rarely emit EOS; `ignore_eos` makes every sample run its whole budget, so "finished" means
    // "continued to the end" and the token count is exact.
    pb::SamplingParams { max_tokens: Some(max_tokens), ignore_eos: true, ..Default::default() }
}

fn request(lora_name: &str, request_id: &str, params: pb::SamplingParams, num_samples: u32) -> pb::SampleRequest {
    pb::SampleRequest {
        request_id: request_id.into(),
        sampling_params: Some(params),
        num_samples,
        ..sample_request(lora_name, 0)
    }
}

/// Starts a retrying sample in the background.
fn spawn_sample(demo: &DemoServer, request: pb::SampleRequest) -> JoinHandle<SampleResponse> {
    let client = SamplingClient::new(demo.channel.clone(), request.lora_name.clone());
    tokio::spawn(async move { client.sample_request(request).await.expect("the retry client finishes the sample") })
}

async fn finished(task: JoinHandle<SampleResponse>) -> SampleResponse {
    tokio::time::timeout(PATIENCE, task).await.expect("finished in time").expect("the sampling task")
}

/// Pauses `lora_name` and returns the sorted ids of the requests the pause aborted.
async fn pause(demo: &DemoServer, lora_name: &str) -> Vec<String> {
    let pause = pb::AbortLoraRequestsRequest { lora_name: lora_name.into(), ..Default::default() };
    let report = demo.control().abort_lora_requests(pause).await.expect("pause").into_inner();
    assert!(report.unacknowledged_request_ids.is_empty(), "every abort was acknowledged: {report:?}");
    let mut aborted = report.aborted_request_ids;
    aborted.sort_unstable();
    aborted
}

async fn resume(demo: &DemoServer, lora_name: &str) {
    let resume = pb::ResumeLoraRequestsRequest { lora_name: lora_name.into(), ..Default::default() };
    assert!(demo.control().resume_lora_requests(resume).await.expect("resume").into_inner().was_paused);
}

fn assert_finished_whole(sequence: &SampledSequence, max_tokens: u32) {
    assert_eq!(sequence.finish_reason(), FinishReason::Length, "{sequence:?}");
    assert_eq!(sequence.token_ids.len(), max_tokens as usize, "the budget is spent exactly, never exceeded");
    let covered: u32 = sequence.segments.iter().map(|s| s.end - s.start).sum();
    assert_eq!(covered as usize, sequence.token_ids.len(), "segments cover every token: {:?}", sequence.segments);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_meow_leaves_concurrent_woof_samples_finishing_with_woof() {
    let demo = DemoServer::start().await;
    demo.stall_next("meow", 1, STALL_AFTER);
    let meow = spawn_sample(&demo, request("meow", "meow-0", params(LONG), 1));
    let woof_running = spawn_sample(&demo, request("woof", "woof-0", params(48), 1));
    demo.wait_stalled(1).await;
    assert_eq!(pause(&demo, "meow").await, vec!["meow-0"], "meow was mid-generation when paused");

    let woof_fresh = spawn_sample(&demo, request("woof", "woof-1", params(48), 1));
    for woof in [woof_running, woof_fresh] {
        let sequence = &finished(woof).await.sequences[0];
        assert_finished_whole(sequence, 48);
        assert!(text(&sequence.token_ids).contains("woof"), "{:?}", text(&sequence.token_ids));
    }
    assert!(!meow.is_finished() && demo.status("meow").await.paused, "meow waits for its resume meanwhile");

    resume(&demo, "meow").await;
    let sequence = &finished(meow).await.sequences[0];
    assert_finished_whole(sequence, LONG);
    assert!(text(&sequence.token_ids).contains("meow"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_meow_continues_token_exact_while_woof_finishes() {
    let demo = DemoServer::start().await;
    // The reference: the same greedy sample, never interrupted. The demo's " meow" repeats with a period of five
    // tokens, so a client that restarted from the bare prompt would match it only if all four aborts landed on a
    // multiple of five (1 in 625); one that dropped or repeated a token would never match.
    let reference = finished(spawn_sample(&demo, request("meow", "reference", params(LONG), 1))).await;
    let reference = reference.sequences[0].token_ids.clone();

    demo.stall_next("meow", 4, STALL_AFTER);
    let meows: Vec<_> =
        (0..4).map(|i| spawn_sample(&demo, request("meow", &format!("meow-{i}"), params(LONG), 1))).collect();
    let woofs: Vec<_> =
        (0..4).map(|i| spawn_sample(&demo, request("woof", &format!("woof-{i}"), params(LONG), 1))).collect();
    demo.wait_stalled(4).await;
    let aborted = pause(&demo, "meow").await;
    assert_eq!(aborted, vec!["meow-0", "meow-1", "meow-2", "meow-3"], "all four were in flight when paused");

    for woof in woofs {
        let sequence = &finished(woof).await.sequences[0];
        assert_finished_whole(sequence, LONG);
        assert!(text(&sequence.token_ids).contains("woof"));
    }
    assert!(meows.iter().all(|meow| !meow.is_finished()), "no meow finishes while meow is paused");
    eventually("the four meow clients wait for the resume", PATIENCE, || async {
        demo.status("meow").await.waiting == 4
    })
    .await;

    resume(&demo, "meow").await;
    for meow in meows {
        let sequence = &finished(meow).await.sequences[0];
        assert_finished_whole(sequence, LONG);
        assert!(text(&sequence.token_ids).contains("meow"));
        assert_eq!(sequence.token_ids, reference, "the continuation is token-exact");
        assert!(sequence.segments.iter().all(|s| s.lora_version == 1), "{:?}", sequence.segments);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_swap_mid_sample_gives_meow_then_woof_with_two_segments() {
    let demo = DemoServer::start().await;
    let load = pb::LoadLoraAdapterRequest { lora_name: "target".into(), path: "meow".into() };
    assert_eq!(demo.control().load_lora_adapter(load).await.expect("load").into_inner().version, 1);

    demo.stall_next("target", 1, 3 * STALL_AFTER);
    let sample = spawn_sample(&demo, request("target", "rollout", params(LONG), 1));
    demo.wait_stalled(1).await;
    let swap = TrainerClient::new(demo.channel.clone()).swap_adapter("target", "woof").await.expect("swap");
    assert_eq!((swap.version, swap.aborted_request_ids), (2, vec!["rollout".to_owned()]), "swapped mid-sample");
    assert!(!demo.status("target").await.paused, "the swap reopened the adapter");

    let sequence = &finished(sample).await.sequences[0];
    assert_finished_whole(sequence, LONG);
    let [before, after] = sequence.segments.as_slice() else { panic!("two segments: {:?}", sequence.segments) };
    assert_eq!((before.lora_version, after.lora_version), (1, 2));
    assert_eq!((before.start, before.end, after.start, after.end), (0, 3 * STALL_AFTER, 3 * STALL_AFTER, LONG));
    let (old, new) = sequence.token_ids.split_at(before.end as usize);
    assert!(text(old).contains("meow") && !text(old).contains("woof"), "old weights: {:?}", text(old));
    assert!(text(new).contains("woof"), "new weights: {:?}", text(new));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_sample_while_paused_is_held_and_finishes_after_resume() {
    let demo = DemoServer::start().await;
    assert!(pause(&demo, "meow").await.is_empty());
    let sample = spawn_sample(&demo, request("meow", "fresh", params(32), 1));
    eventually("the fresh sample is held at meow's gate", PATIENCE, || async { demo.status("meow").await.held == 1 })
        .await;
    // "A while": a 300 ms long-poll on the same adapter runs out while the sample stays held.
    let wait = pb::WaitLoraUnpausedRequest { lora_name: "meow".into(), timeout_s: 0.3 };
    assert!(demo.control().wait_lora_unpaused(wait).await.expect("wait").into_inner().paused);
    assert!(!sample.is_finished(), "held, not done");
    assert_eq!(demo.generated_tokens("meow", 1), 0, "nothing was generated while held");

    resume(&demo, "meow").await;
    let sequence = &finished(sample).await.sequences[0];
    assert_finished_whole(sequence, 32);
    assert!(text(&sequence.token_ids).contains("meow"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_samples_of_one_request_all_finish_across_a_pause() {
    let demo = DemoServer::start().await;
    let sampled = pb::SamplingParams { temperature: 1.0, seed: Some(7), ..params(LONG) };
    demo.stall_next("meow", 1, STALL_AFTER);
    let sample = spawn_sample(&demo, request("meow", "group", sampled, 4));
    demo.wait_stalled(4).await;
    assert_eq!(pause(&demo, "meow").await, vec!["group"], "the group was mid-generation when paused");
    resume(&demo, "meow").await;

    let response = finished(sample).await;
    assert_eq!(response.sequences.len(), 4);
    for sequence in &response.sequences {
        assert_finished_whole(sequence, LONG);
        assert!(text(&sequence.token_ids).contains("meow"));
    }
}
