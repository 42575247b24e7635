//! The gRPC front against a real server with the demo model and the generated client (issue 4).

use std::time::Duration;

use loragate_core::testing::eventually_within as eventually;
use loragate_proto::v1::{self as pb, FinishReason};
use loragate_tests::{DemoServer, PATIENCE, sample_request, text};
use tonic::Code;
use tonic::codec::Streaming;

fn pause(lora: &str) -> pb::AbortLoraRequestsRequest {
    pb::AbortLoraRequestsRequest { lora_name: lora.into(), ..Default::default() }
}

fn resume(lora: &str) -> pb::ResumeLoraRequestsRequest {
    pb::ResumeLoraRequestsRequest { lora_name: lora.into(), ..Default::default() }
}

/// A request that keeps generating until aborted (the demo adapters never emit EOS; `ignore_eos` makes sure).
fn long_request(lora: &str, request_id: &str) -> pb::SampleRequest {
    let mut request = sample_request(lora, 3000);
    request.request_id = request_id.into();
    if let Some(params) = request.sampling_params.as_mut() {
        params.ignore_eos = true;
    }
    request
}

/// What a stream has delivered so far.
#[derive(Default)]
struct Received {
    token_ids: Vec<u32>,
    finish: Option<FinishReason>,
    segments: Vec<pb::VersionSegment>,
}

/// Reads chunks until at least `at_least` tokens arrived or the sequence finished.
async fn read(stream: &mut Streaming<pb::SampleStreamResponse>, received: &mut Received, at_least: usize) {
    while received.finish.is_none() && received.token_ids.len() < at_least {
        let chunk = tokio::time::timeout(PATIENCE, stream.message())
            .await
            .expect("a chunk in time")
            .expect("a healthy stream")
            .expect("the stream ended before its last chunk");
        received.token_ids.extend(&chunk.token_ids);
        if chunk.finish_reason() != FinishReason::Unspecified {
            received.finish = Some(chunk.finish_reason());
            received.segments = chunk.segments;
        }
    }
}

async fn read_to_end(stream: &mut Streaming<pb::SampleStreamResponse>, received: &mut Received) {
    read(stream, received, usize::MAX).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_meow_aborts_only_meow_and_holds_only_meow() {
    let demo = DemoServer::start().await;
    let mut meow_streams = Vec::new();
    for i in 0..2 {
        let mut stream =
            demo.sampler().sample_stream(long_request("meow", &format!("meow-{i}"))).await.expect("stream");
        let mut received = Received::default();
        read(stream.get_mut(), &mut received, 5).await;
        meow_streams.push((stream.into_inner(), received));
    }
    let mut woof =
        demo.sampler().sample_stream(long_request("woof", "woof-running")).await.expect("stream").into_inner();
    let mut woof_received = Received::default();
    read(&mut woof, &mut woof_received, 5).await;

    let report = demo.control().abort_lora_requests(pause("meow")).await.expect("abort").into_inner();
    let mut aborted = report.aborted_request_ids.clone();
    aborted.sort();
    assert_eq!(aborted, vec!["meow-0", "meow-1"]);
    assert_eq!(report.aborted_count, 2);
    for (mut stream, mut received) in meow_streams {
        read_to_end(&mut stream, &mut received).await;
        assert_eq!(received.finish, Some(FinishReason::Abort));
        assert!(received.token_ids.len() >= 5, "the partial tokens come back");
        assert!(text(&received.token_ids).contains("meow"), "{:?}", text(&received.token_ids));
        let covered: u32 = received.segments.iter().map(|s| s.end - s.start).sum();
        assert_eq!(covered as usize, received.token_ids.len(), "segments cover every token");
    }

    // While meow is paused: a fresh meow request is held, woof keeps generating and new woof samples finish.
    let mut held_sampler = demo.sampler();
    let held = tokio::spawn(async move { held_sampler.sample(loragate_tests::sample_request("meow", 24)).await });
    eventually("the fresh meow request is held", PATIENCE, || async { demo.status("meow").await.held == 1 }).await;
    let before = woof_received.token_ids.len();
    read(&mut woof, &mut woof_received, before + 10).await;
    assert_eq!(woof_received.finish, None, "woof was not aborted");
    let fresh = demo.sampler().sample(sample_request("woof", 24)).await.expect("woof sample").into_inner();
    assert_eq!(fresh.sequences[0].finish_reason(), FinishReason::Length);
    assert!(text(&fresh.sequences[0].token_ids).contains("woof"));
    let woof_status = demo.status("woof").await;
    assert!(!woof_status.paused && woof_status.held == 0 && woof_status.in_flight == 1, "{woof_status:?}");
    assert!(!held.is_finished(), "meow stays held while paused");

    // A client that goes away leaves nothing in flight.
    drop(woof);
    eventually("the dropped woof stream leaves the registry", PATIENCE, || async {
        demo.status("woof").await.in_flight == 0
    })
    .await;

    let resumed = demo.control().resume_lora_requests(resume("meow")).await.expect("resume").into_inner();
    assert!(resumed.was_paused);
    let released = held.await.expect("task").expect("admitted after resume").into_inner();
    assert_eq!(released.sequences[0].finish_reason(), FinishReason::Length);
    assert!(text(&released.sequences[0].token_ids).contains("meow"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_lora_unpaused_times_out_while_paused_and_is_released_by_resume() {
    let demo = DemoServer::start().await;
    let wait = |timeout_s| pb::WaitLoraUnpausedRequest { lora_name: "meow".into(), timeout_s };
    assert!(!demo.control().wait_lora_unpaused(wait(3600.0)).await.expect("open").into_inner().paused);

    demo.control().abort_lora_requests(pause("meow")).await.expect("pause");
    let started = std::time::Instant::now();
    assert!(demo.control().wait_lora_unpaused(wait(0.2)).await.expect("times out").into_inner().paused);
    assert!(started.elapsed() >= Duration::from_millis(200));

    let mut control = demo.control();
    let waiter = tokio::spawn(async move { control.wait_lora_unpaused(wait(3600.0)).await });
    eventually("the waiter is counted", PATIENCE, || async { demo.status("meow").await.waiting == 1 }).await;
    demo.control().resume_lora_requests(resume("meow")).await.expect("resume");
    assert!(!waiter.await.expect("task").expect("released").into_inner().paused);
    assert_eq!(demo.status("meow").await.waiting, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_while_paused_bumps_the_version_and_later_tokens_carry_it() {
    let demo = DemoServer::start().await;
    demo.control().abort_lora_requests(pause("meow")).await.expect("pause");
    // Swap the weights served as "meow" for the woof adapter's.
    let load = pb::LoadLoraAdapterRequest { lora_name: "meow".into(), path: "woof".into() };
    let loaded = demo.control().load_lora_adapter(load).await.expect("load").into_inner();
    assert_eq!(loaded.version, 2);
    let status = demo.status("meow").await;
    assert!(status.paused && status.version == 2, "loading does not reopen the adapter: {status:?}");

    demo.control().resume_lora_requests(resume("meow")).await.expect("resume");
    let sampled = demo.sampler().sample(sample_request("meow", 24)).await.expect("sample").into_inner();
    let sequence = &sampled.sequences[0];
    assert_eq!(sequence.segments, vec![pb::VersionSegment { lora_version: 2, kv_version: 2, start: 0, end: 24 }]);
    assert!(text(&sequence.token_ids).contains("woof"), "the new weights serve: {:?}", text(&sequence.token_ids));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_past_the_clients_deadline_is_unavailable_naming_the_adapter() {
    let demo = DemoServer::start().await;
    demo.control().abort_lora_requests(pause("meow")).await.expect("pause");
    let mut request = tonic::Request::new(sample_request("meow", 8));
    request.set_timeout(Duration::from_millis(500));
    let status = demo.sampler().sample(request).await.expect_err("held past its deadline");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("'meow'"), "{status:?}");
    let meow = demo.status("meow").await;
    assert!(meow.paused && meow.held == 0 && meow.in_flight == 0, "{meow:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_their_status_codes_and_the_server_keeps_serving() {
    let demo = DemoServer::start().await;
    // An adapter whose files are well-formed but whose target module does not exist in the model.
    let bogus = demo.adapter_root.join("bogus-modules");
    loragate_tests::copy_dir(&demo.adapter_root.join("meow"), &bogus);
    let config = std::fs::read_to_string(bogus.join("adapter_config.json")).expect("config");
    let config = config.replace("\"q_proj\"", "\"not_a_module\"");
    std::fs::write(bogus.join("adapter_config.json"), config).expect("rewrite config");

    let with_params = |edit: fn(&mut pb::SamplingParams)| {
        let mut request = sample_request("meow", 8);
        edit(request.sampling_params.as_mut().expect("params"));
        request
    };
    let mut control = demo.control();
    let mut sampler = demo.sampler();
    let load =
        |lora_name: &str, path: &str| pb::LoadLoraAdapterRequest { lora_name: lora_name.into(), path: path.into() };
    let cases: Vec<(&str, Result<(), tonic::Status>, Code, &str)> = vec![
        ("abort, no name", control.abort_lora_requests(pause("")).await.map(drop), Code::InvalidArgument, "lora_name"),
        ("abort, unknown", control.abort_lora_requests(pause("ghost")).await.map(drop), Code::NotFound, "ghost"),
        ("resume, unknown", control.resume_lora_requests(resume("ghost")).await.map(drop), Code::NotFound, "ghost"),
        (
            "wait, negative",
            control
                .wait_lora_unpaused(pb::WaitLoraUnpausedRequest { lora_name: "meow".into(), timeout_s: -1.0 })
                .await
                .map(drop),
            Code::InvalidArgument,
            "timeout_s",
        ),
        (
            "wait, infinite",
            control
                .wait_lora_unpaused(pb::WaitLoraUnpausedRequest { lora_name: "meow".into(), timeout_s: f64::INFINITY })
                .await
                .map(drop),
            Code::InvalidArgument,
            "timeout_s",
        ),
        (
            "load, escape",
            control.load_lora_adapter(load("x", "../../etc")).await.map(drop),
            Code::InvalidArgument,
            "path",
        ),
        (
            "load, missing",
            control.load_lora_adapter(load("x", "nowhere")).await.map(drop),
            Code::InvalidArgument,
            "path",
        ),
        ("load, no files", control.load_lora_adapter(load("x", ".")).await.map(drop), Code::InvalidArgument, "adapter"),
        (
            "load, incompatible",
            control.load_lora_adapter(load("meow", "bogus-modules")).await.map(drop),
            Code::FailedPrecondition,
            "not_a_module",
        ),
        ("sample, unknown", sampler.sample(sample_request("ghost", 8)).await.map(drop), Code::NotFound, "ghost"),
        (
            "sample, max_tokens 0",
            sampler.sample(with_params(|p| p.max_tokens = Some(0))).await.map(drop),
            Code::InvalidArgument,
            "max_tokens",
        ),
        (
            "sample, over the context",
            sampler.sample(with_params(|p| p.max_tokens = Some(5000))).await.map(drop),
            Code::InvalidArgument,
            "max_tokens",
        ),
        (
            "sample, token outside the vocabulary",
            sampler
                .sample(pb::SampleRequest { prompt_token_ids: vec![72, 99_999], ..sample_request("meow", 8) })
                .await
                .map(drop),
            Code::InvalidArgument,
            "prompt_token_ids",
        ),
        (
            "sample, empty prompt",
            sampler.sample(pb::SampleRequest { prompt_token_ids: vec![], ..sample_request("meow", 8) }).await.map(drop),
            Code::InvalidArgument,
            "prompt_token_ids",
        ),
        (
            "sample, negative temperature",
            sampler.sample(with_params(|p| p.temperature = -1.0)).await.map(drop),
            Code::InvalidArgument,
            "temperature",
        ),
        (
            "sample, top_p above 1",
            sampler.sample(with_params(|p| p.top_p = Some(1.5))).await.map(drop),
            Code::InvalidArgument,
            "top_p",
        ),
        (
            "sample, too many samples",
            sampler.sample(pb::SampleRequest { num_samples: 10_000, ..sample_request("meow", 8) }).await.map(drop),
            Code::InvalidArgument,
            "num_samples",
        ),
    ];
    for (case, outcome, code, mentions) in cases {
        let status = outcome.expect_err(case);
        assert_eq!(status.code(), code, "{case}: {status:?}");
        assert!(status.message().contains(mentions), "{case}: {status:?}");
    }

    // Nothing leaked, nothing was paused, the old weights still serve.
    let listed = demo.control().list_lora_adapters(pb::ListLoraAdaptersRequest {}).await.expect("list").into_inner();
    let names: Vec<_> = listed.adapters.iter().map(|a| a.lora_name.as_str()).collect();
    assert_eq!(names, vec!["meow", "woof"], "no adapter was created by a failed call");
    for adapter in &listed.adapters {
        assert!(!adapter.paused && adapter.in_flight == 0 && adapter.held == 0, "{adapter:?}");
        assert_eq!(adapter.version, 1);
    }
    let sampled = demo.sampler().sample(sample_request("meow", 16)).await.expect("still serving").into_inner();
    assert!(text(&sampled.sequences[0].token_ids).contains("meow"));
}
