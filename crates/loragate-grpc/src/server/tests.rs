//! The gRPC front over a scripted engine, on a real server at `127.0.0.1:0` with the generated clients.

use std::time::Duration;

use loragate_core::testing::{ScriptedEngine, coordinator_with_adapters, eventually};
use loragate_core::{Coordinator, CoordinatorConfig};
use loragate_proto::v1::lora_control_client::LoraControlClient;
use loragate_proto::v1::sampler_client::SamplerClient;
use loragate_proto::v1::{self as pb, FinishReason};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;

use super::*;

mod hardening;
mod matrix;
mod resets;

/// Tokens each scripted request emits before it waits to be aborted.
const HOLD_AFTER: u32 = 3;

struct Harness {
    control: LoraControlClient<Channel>,
    sampler: SamplerClient<Channel>,
    channel: Channel,
    _stop: oneshot::Sender<()>,
}

async fn serve(adapters: &[&str]) -> Harness {
    serve_with(CoordinatorConfig::default(), adapters).await.0
}

/// A server over `config`, and its coordinator.
async fn serve_with(config: CoordinatorConfig, adapters: &[&str]) -> (Harness, Coordinator) {
    let coordinator = coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), config, adapters).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(serve_grpc(listener, coordinator.clone(), std::future::pending(), async move {
        let _ = stopped.await;
    }));
    let channel = Channel::from_shared(format!("http://{address}")).expect("uri").connect().await.expect("connect");
    let harness = Harness {
        control: LoraControlClient::new(channel.clone()),
        sampler: SamplerClient::new(channel.clone()),
        channel,
        _stop: stop,
    };
    (harness, coordinator)
}

fn sample_request(lora: &str, max_tokens: u32) -> pb::SampleRequest {
    pb::SampleRequest {
        lora_name: lora.into(),
        prompt_token_ids: vec![1, 2, 3],
        sampling_params: Some(pb::SamplingParams { max_tokens: Some(max_tokens), ..Default::default() }),
        ..Default::default()
    }
}

async fn status_of(control: &LoraControlClient<Channel>, lora: &str) -> pb::LoraAdapterStatus {
    let listed = control.clone().list_lora_adapters(pb::ListLoraAdaptersRequest {}).await.expect("list").into_inner();
    listed.adapters.into_iter().find(|adapter| adapter.lora_name == lora).expect("listed")
}

fn pause(lora: &str) -> pb::AbortLoraRequestsRequest {
    pb::AbortLoraRequestsRequest { lora_name: lora.into(), ..Default::default() }
}

fn resume(lora: &str) -> pb::ResumeLoraRequestsRequest {
    pb::ResumeLoraRequestsRequest { lora_name: lora.into(), ..Default::default() }
}

#[tokio::test]
async fn sample_and_sample_stream_return_tokens_with_their_provenance() {
    let mut harness = serve(&["meow"]).await;
    let response = harness.sampler.sample(sample_request("meow", 2)).await.expect("sample").into_inner();
    let sequence = &response.sequences[0];
    assert_eq!(sequence.token_ids, vec![0, 1]);
    assert_eq!(sequence.finish_reason(), FinishReason::Length);
    assert_eq!(sequence.segments, vec![pb::VersionSegment { lora_version: 1, kv_version: 1, start: 0, end: 2 }]);
    assert!(!response.request_id.is_empty(), "the server makes an id when the caller sends none");

    let mut chunks = harness.sampler.sample_stream(sample_request("meow", 2)).await.expect("stream").into_inner();
    let mut tokens = Vec::new();
    let mut last = None;
    while let Some(chunk) = chunks.message().await.expect("chunk") {
        tokens.extend(chunk.token_ids.iter().copied());
        last = Some(chunk);
    }
    let last = last.expect("at least one chunk");
    assert_eq!(tokens, vec![0, 1]);
    assert_eq!(last.finish_reason(), FinishReason::Length);
    assert_eq!(last.segments, vec![pb::VersionSegment { lora_version: 1, kv_version: 1, start: 0, end: 2 }]);
}

#[tokio::test]
async fn a_fresh_request_is_held_at_the_gate_and_admitted_on_resume() {
    let mut harness = serve(&["meow"]).await;
    harness.control.abort_lora_requests(pause("meow")).await.expect("pause");
    let mut sampler = harness.sampler.clone();
    let held = tokio::spawn(async move { sampler.sample(sample_request("meow", 2)).await });
    eventually("the request is held", || async { status_of(&harness.control, "meow").await.held == 1 }).await;
    assert!(!held.is_finished());
    let resumed = harness.control.resume_lora_requests(resume("meow")).await.expect("resume").into_inner();
    assert!(resumed.was_paused);
    let response = held.await.expect("task").expect("admitted after resume").into_inner();
    assert_eq!(response.sequences[0].finish_reason(), FinishReason::Length);
}

#[tokio::test]
async fn a_hold_past_the_clients_deadline_is_unavailable_naming_the_adapter() {
    let mut harness = serve(&["meow"]).await;
    harness.control.abort_lora_requests(pause("meow")).await.expect("pause");
    let mut request = tonic::Request::new(sample_request("meow", 2));
    request.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let status = harness.sampler.sample(request).await.expect_err("the hold expires");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("meow"), "{status:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(status_of(&harness.control, "meow").await.held, 0);
    assert!(status_of(&harness.control, "meow").await.paused);
}

#[tokio::test]
async fn a_client_that_cancels_while_held_leaves_nothing_behind() {
    let mut harness = serve(&["meow"]).await;
    harness.control.abort_lora_requests(pause("meow")).await.expect("pause");
    let mut sampler = harness.sampler.clone();
    let held = tokio::spawn(async move { sampler.sample(sample_request("meow", 2)).await });
    eventually("held", || async { status_of(&harness.control, "meow").await.held == 1 }).await;
    held.abort();
    eventually("the held request is gone", || async {
        let status = status_of(&harness.control, "meow").await;
        (status.held, status.in_flight) == (0, 0)
    })
    .await;
    assert!(status_of(&harness.control, "meow").await.paused, "a cancelled caller never reopens the adapter");
    harness.control.resume_lora_requests(resume("meow")).await.expect("resume");
}

#[tokio::test]
async fn health_and_reflection_answer_while_an_adapter_is_paused() {
    let mut harness = serve(&["meow"]).await;
    harness.control.abort_lora_requests(pause("meow")).await.expect("pause");
    let mut health = tonic_health::pb::health_client::HealthClient::new(harness.channel.clone());
    for service in ["loragate.v1.Sampler", "loragate.v1.LoraControl"] {
        let check = tonic_health::pb::HealthCheckRequest { service: service.into() };
        let answer = health.check(check).await.expect("health").into_inner();
        assert_eq!(answer.status(), tonic_health::pb::health_check_response::ServingStatus::Serving);
    }
    let mut reflection =
        tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(harness.channel.clone());
    let list = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers =
        reflection.server_reflection_info(tokio_stream::once(list)).await.expect("reflection").into_inner();
    let answer = answers.message().await.expect("answer").expect("one answer");
    let listed = format!("{answer:?}");
    assert!(listed.contains("loragate.v1.Sampler") && listed.contains("loragate.v1.LoraControl"), "{listed}");
    assert!(status_of(&harness.control, "meow").await.paused);
}

#[tokio::test]
async fn without_workers_the_fleet_service_answers_failed_precondition_saying_why() {
    let harness = serve(&[]).await;
    let mut fleet = loragate_proto::v1::fleet_client::FleetClient::new(harness.channel.clone());
    let listed = fleet.list_workers(pb::ListWorkersRequest {}).await.expect_err("no fleet");
    let added = fleet.add_worker(pb::AddWorkerRequest { address: "grpc://127.0.0.1:9001".into() }).await;
    let removed = fleet.remove_worker(pb::RemoveWorkerRequest { address: "grpc://h:1".into(), drain: false }).await;
    for status in [listed, added.expect_err("no fleet"), removed.expect_err("no fleet")] {
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert!(status.message().contains("--worker"), "it says why: {status:?}");
    }
    let mut health = tonic_health::pb::health_client::HealthClient::new(harness.channel.clone());
    let check = tonic_health::pb::HealthCheckRequest { service: "loragate.v1.Fleet".into() };
    let answer = health.check(check).await.expect("health").into_inner();
    assert_eq!(answer.status(), tonic_health::pb::health_check_response::ServingStatus::NotServing);
}

#[tokio::test]
async fn control_errors_carry_the_contracts_codes_and_the_server_keeps_serving() {
    let mut harness = serve(&["meow"]).await;
    let cases: Vec<(&str, tonic::Status)> = vec![
        ("abort without a name", harness.control.abort_lora_requests(pause("")).await.expect_err("bad")),
        ("abort of an unknown adapter", harness.control.abort_lora_requests(pause("ghost")).await.expect_err("bad")),
        ("resume without a name", harness.control.resume_lora_requests(resume("")).await.expect_err("bad")),
        (
            "negative wait",
            harness
                .control
                .wait_lora_unpaused(pb::WaitLoraUnpausedRequest { lora_name: "meow".into(), timeout_s: -1.0 })
                .await
                .expect_err("bad"),
        ),
        (
            "non-finite wait",
            harness
                .control
                .wait_lora_unpaused(pb::WaitLoraUnpausedRequest { lora_name: "meow".into(), timeout_s: f64::NAN })
                .await
                .expect_err("bad"),
        ),
        (
            "load without an adapter root",
            harness
                .control
                .load_lora_adapter(pb::LoadLoraAdapterRequest { lora_name: "x".into(), path: "/tmp".into() })
                .await
                .expect_err("bad"),
        ),
        (
            "unload of an unknown adapter",
            harness
                .control
                .unload_lora_adapter(pb::UnloadLoraAdapterRequest { lora_name: "ghost".into() })
                .await
                .expect_err("bad"),
        ),
        ("sample of an unknown adapter", harness.sampler.sample(sample_request("ghost", 2)).await.expect_err("bad")),
        ("max_tokens 0", harness.sampler.sample(sample_request("meow", 0)).await.expect_err("bad")),
    ];
    let expected = [
        (Code::InvalidArgument, "lora_name"),
        (Code::NotFound, "ghost"),
        (Code::InvalidArgument, "lora_name"),
        (Code::InvalidArgument, "timeout_s"),
        (Code::InvalidArgument, "timeout_s"),
        (Code::InvalidArgument, "path"),
        (Code::NotFound, "ghost"),
        (Code::NotFound, "ghost"),
        (Code::InvalidArgument, "sampling_params.max_tokens"),
    ];
    for ((case, status), (code, mentions)) in cases.into_iter().zip(expected) {
        assert_eq!(status.code(), code, "{case}: {status:?}");
        assert!(status.message().contains(mentions), "{case}: {status:?}");
    }
    let status = status_of(&harness.control, "meow").await;
    assert!(!status.paused && status.in_flight == 0, "bad input changed nothing: {status:?}");
    let response = harness.sampler.sample(sample_request("meow", 2)).await.expect("still serving").into_inner();
    assert_eq!(response.sequences[0].finish_reason(), FinishReason::Length);
}

#[tokio::test]
async fn the_kv_policy_is_parsed_and_the_applied_one_echoed() {
    let mut harness = serve(&["meow"]).await;
    let keep = |kv_policy: i32| pb::AbortLoraRequestsRequest {
        lora_name: "meow".into(),
        mode: pb::PauseMode::Keep.into(),
        kv_policy,
        ..Default::default()
    };
    let answer = harness.control.abort_lora_requests(keep(pb::KvPolicy::Reuse.into())).await.expect("paused");
    // The scripted engine cannot park: REUSE is applied as RECOMPUTE, and the answer says so.
    assert_eq!(answer.into_inner().kv_policy(), pb::KvPolicy::Recompute);
    let answer = harness.control.abort_lora_requests(keep(0)).await.expect("paused again");
    assert_eq!(answer.into_inner().kv_policy(), pb::KvPolicy::Recompute, "unspecified is RECOMPUTE");
    let refused = harness.control.abort_lora_requests(keep(7)).await.expect_err("no such policy");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("kv_policy"), "{refused:?}");
    assert!(status_of(&harness.control, "meow").await.paused, "the refused call changed nothing");
}

#[tokio::test]
async fn health_says_not_serving_while_the_state_store_cannot_record_and_serving_once_it_can() {
    use tonic_health::pb::health_check_response::ServingStatus;

    let store = std::sync::Arc::new(loragate_core::testing::FailingStore::default());
    let config = CoordinatorConfig { state: store.clone(), ..CoordinatorConfig::default() };
    let (harness, _coordinator) = serve_with(config, &["meow"]).await;
    let health = tonic_health::pb::health_client::HealthClient::new(harness.channel.clone());
    let status = |service: &'static str| {
        let mut health = health.clone();
        async move {
            let check = tonic_health::pb::HealthCheckRequest { service: service.into() };
            health.check(check).await.expect("health").into_inner().status()
        }
    };
    assert_eq!(status("").await, ServingStatus::Serving);
    store.set_failing(true);
    eventually("health reports the control plane down", || async {
        status("").await == ServingStatus::NotServing
            && status("loragate.v1.LoraControl").await == ServingStatus::NotServing
    })
    .await;
    assert_eq!(status("loragate.v1.Sampler").await, ServingStatus::Serving, "sampling goes on");
    store.set_failing(false);
    eventually("health reports serving again", || async {
        status("").await == ServingStatus::Serving && status("loragate.v1.LoraControl").await == ServingStatus::Serving
    })
    .await;
}
