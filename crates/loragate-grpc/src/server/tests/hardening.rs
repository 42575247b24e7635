//! The gRPC front under hostile or careless callers (issue 13): held requests keep only their parsed form, a
//! message that never completes fails in time, bad bytes are INVALID_ARGUMENT, keys decide who may do what,
//! overload is RESOURCE_EXHAUSTED naming the limit, and the base model's name cannot become an adapter's.

use std::sync::atomic::Ordering;

use bytes::{Buf, BufMut, Bytes};
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use loragate_core::testing::DropTrackedBytes;
use loragate_core::{Key, Keyring, Limits, TenantKeys};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};
use tower::{Layer, ServiceExt};

use super::*;
use crate::{SamplerService, SubmissionGateLayer};

/// A `Sample` call as it reaches the gate, with `body` as its body.
fn sample_call(body: tonic::body::Body) -> http::Request<tonic::body::Body> {
    http::Request::builder()
        .method("POST")
        .uri("/loragate.v1.Sampler/Sample")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .expect("a request")
}

fn framed(message: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    frame.extend_from_slice(message);
    frame
}

/// The gRPC status of a response (trailers-only responses carry it in the headers).
async fn grpc_status(response: http::Response<tonic::body::Body>) -> (Code, String) {
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("the response body");
    let headers = match collected.trailers() {
        Some(trailers) if trailers.contains_key("grpc-status") => trailers.clone(),
        _ => parts.headers,
    };
    let status = Status::from_header_map(&headers).expect("a grpc-status");
    (status.code(), status.message().to_owned())
}

#[tokio::test]
async fn a_held_sample_keeps_its_parsed_form_not_its_body() {
    let coordinator =
        coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), CoordinatorConfig::default(), &["meow"]).await;
    coordinator.abort(&loragate_core::AdapterName::parse("meow").expect("name")).await.expect("pause");
    let gated = SubmissionGateLayer::new(coordinator.clone())
        .layer(pb::sampler_server::SamplerServer::new(SamplerService::new(coordinator.clone())));

    // A small request padded with a 1 MiB unknown field (field 99), which the parsed form does not keep.
    let mut message = prost::Message::encode_to_vec(&sample_request("meow", 2));
    message.extend_from_slice(&[0x9a, 0x06]); // field 99, length-delimited
    prost::encoding::encode_varint(1 << 20, &mut message);
    message.extend(std::iter::repeat_n(b'x', 1 << 20));
    let (tracked, dropped) = DropTrackedBytes::new(framed(&message));
    let body = Bytes::from_owner(tracked);
    let call = tokio::spawn(gated.oneshot(sample_call(tonic::body::Body::new(Full::new(body)))));

    let meow = coordinator.adapter(&loragate_core::AdapterKey::parse("meow").expect("key")).expect("loaded");
    eventually("the request is held", || async { meow.status().await.expect("status").held == 1 }).await;
    assert!(dropped.load(Ordering::Acquire), "a held request keeps its body's bytes");

    coordinator.resume(&loragate_core::AdapterName::parse("meow").expect("name"), None).await.expect("resume");
    let response = call.await.expect("task").expect("infallible");
    assert_eq!(grpc_status(response).await.0, Code::Ok);
}

#[tokio::test(start_paused = true)]
async fn a_message_that_never_completes_fails_by_the_gate_deadline_and_is_counted() {
    let config = CoordinatorConfig { max_gate_hold: Duration::from_secs(5), ..CoordinatorConfig::default() };
    let coordinator = coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), config, &["meow"]).await;
    let gated = SubmissionGateLayer::new(coordinator.clone())
        .layer(pb::sampler_server::SamplerServer::new(SamplerService::new(coordinator.clone())));
    // The frame header promises 10 bytes; one arrives, then nothing, ever.
    let first = Ok::<_, Status>(http_body::Frame::data(Bytes::from_static(&[0, 0, 0, 0, 10, 0x0a])));
    let trickle = futures::stream::once(async move { first }).chain(futures::stream::pending());
    let started = Instant::now();
    let response = gated.oneshot(sample_call(tonic::body::Body::new(StreamBody::new(trickle)))).await;
    let (code, message) = grpc_status(response.expect("infallible")).await;
    assert_eq!(code, Code::DeadlineExceeded, "{message}");
    assert!(started.elapsed() >= Duration::from_secs(5) && started.elapsed() < Duration::from_secs(6));
    assert_eq!(coordinator.metrics().body_read_timeouts("grpc"), 1);
}

/// Sends raw bytes as a message.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        *self
    }

    fn decoder(&mut self) -> Self::Decoder {
        *self
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

#[tokio::test]
async fn undecodable_messages_are_invalid_argument_on_every_service() {
    let harness = serve(&["meow"]).await;
    let mut grpc = tonic::client::Grpc::new(harness.channel.clone());
    // A truncated length-delimited field 1: not protobuf.
    let garbage = vec![0x0a, 0x09, b'x'];
    for path in [
        "/loragate.v1.Sampler/Sample",
        "/loragate.v1.Sampler/SampleStream",
        "/loragate.v1.LoraControl/AbortLoraRequests",
        "/loragate.v1.LoraControl/LoadLoraAdapter",
    ] {
        grpc.ready().await.expect("ready");
        let path = http::uri::PathAndQuery::from_static(path);
        let status = if path.as_str().ends_with("SampleStream") {
            grpc.server_streaming(Request::new(garbage.clone()), path.clone(), RawCodec).await.map(|_| ())
        } else {
            grpc.unary(Request::new(garbage.clone()), path.clone(), RawCodec).await.map(|_| ())
        }
        .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{path}: {status:?}");
    }
    let status = status_of(&harness.control, "meow").await;
    assert!(!status.paused, "a garbled abort did nothing");
}

fn with_key<T>(message: T, key: &str) -> Request<T> {
    let mut request = Request::new(message);
    let value: MetadataValue<_> = format!("Bearer {key}").parse().expect("ascii");
    request.metadata_mut().insert("authorization", value);
    request
}

#[tokio::test]
async fn keys_decide_who_may_sample_and_control_which_adapter() {
    let tenants = TenantKeys::parse(r#"{"k-team-a": {"adapters": ["team-a/*"], "control": true}}"#).expect("valid");
    let keyring =
        Keyring::new(Some(Key::parse("k-api").expect("key")), Some(Key::parse("k-admin").expect("key")), tenants)
            .expect("keys");
    let config = CoordinatorConfig { auth: keyring, ..CoordinatorConfig::default() };
    let (harness, _coordinator) = serve_with(config, &["team-a/policy", "team-b/policy"]).await;
    let (mut sampler, mut control) = (harness.sampler.clone(), harness.control.clone());

    // No key, or a wrong one: UNAUTHENTICATED, before the request is looked at.
    let status = sampler.sample(sample_request("team-a/policy", 2)).await.expect_err("no key");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let status = sampler.sample(with_key(sample_request("team-a/policy", 2), "k-wrong")).await.expect_err("bad key");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let list = control.list_lora_adapters(pb::ListLoraAdaptersRequest {}).await.expect_err("no key");
    assert_eq!(list.code(), Code::Unauthenticated);

    // The API key samples anything and controls nothing.
    sampler.sample(with_key(sample_request("team-b/policy", 2), "k-api")).await.expect("the API key samples");
    let status = control.abort_lora_requests(with_key(pause("team-a/policy"), "k-api")).await.expect_err("no control");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // A tenant samples and controls its own adapters only, and sees only them.
    sampler.sample(with_key(sample_request("team-a/policy", 2), "k-team-a")).await.expect("its own adapter");
    sampler.sample(with_key(sample_request("", 2), "k-team-a")).await.expect("the shared base model");
    let status = sampler.sample(with_key(sample_request("team-b/policy", 2), "k-team-a")).await.expect_err("other");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("team-b/policy"), "{status:?}");
    control.abort_lora_requests(with_key(pause("team-a/policy"), "k-team-a")).await.expect("pause its own");
    control.resume_lora_requests(with_key(resume("team-a/policy"), "k-team-a")).await.expect("resume its own");
    let status = control.abort_lora_requests(with_key(pause("team-b/policy"), "k-team-a")).await.expect_err("other");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let unload = pb::UnloadLoraAdapterRequest { lora_name: "team-b/policy".into() };
    let status = control.unload_lora_adapter(with_key(unload.clone(), "k-team-a")).await.expect_err("other");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let listed = control.list_lora_adapters(with_key(pb::ListLoraAdaptersRequest {}, "k-team-a")).await.expect("list");
    let names: Vec<String> = listed.into_inner().adapters.into_iter().map(|adapter| adapter.lora_name).collect();
    assert_eq!(names, ["team-a/policy"]);

    // The admin key does everything; health needs no key.
    control.unload_lora_adapter(with_key(unload, "k-admin")).await.expect("the admin unloads");
    let mut health = tonic_health::pb::health_client::HealthClient::new(harness.channel.clone());
    let check = tonic_health::pb::HealthCheckRequest { service: "loragate.v1.Sampler".into() };
    health.check(check).await.expect("health is open");
}

#[tokio::test]
async fn overload_is_resource_exhausted_naming_the_limit() {
    let config = CoordinatorConfig {
        limits: Limits { max_in_flight: 1, max_held: 1, ..Limits::default() },
        ..CoordinatorConfig::default()
    };
    let (harness, coordinator) = serve_with(config, &["meow", "woof"]).await;
    let mut sampler = harness.sampler.clone();
    let running = tokio::spawn(async move { sampler.sample(sample_request("meow", 1000)).await });
    eventually("one request is in flight", || async { coordinator.load().in_flight == 1 }).await;
    let status = harness.sampler.clone().sample(sample_request("woof", 2)).await.expect_err("over the cap");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("--max-in-flight"), "{status:?}");

    harness.control.clone().abort_lora_requests(pause("woof")).await.expect("pause woof");
    let mut sampler = harness.sampler.clone();
    let held = tokio::spawn(async move { sampler.sample(sample_request("woof", 2)).await });
    eventually("one request is held", || async { coordinator.load().held == 1 }).await;
    let status = harness.sampler.clone().sample(sample_request("woof", 2)).await.expect_err("over the cap");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("--max-held"), "{status:?}");

    harness.control.clone().abort_lora_requests(pause("meow")).await.expect("hand back meow's request");
    running.await.expect("task").expect("handed back");
    harness.control.clone().resume_lora_requests(resume("woof")).await.expect("resume woof");
    held.await.expect("task").expect("admitted once there is room");
    assert_eq!(coordinator.load(), loragate_core::LoadSnapshot::default());
}

#[tokio::test]
async fn the_base_models_served_name_cannot_be_loaded_as_an_adapter() {
    let config = CoordinatorConfig { reserved_names: vec!["loragate-demo".into()], ..CoordinatorConfig::default() };
    let (harness, _coordinator) = serve_with(config, &["meow"]).await;
    let load = pb::LoadLoraAdapterRequest { lora_name: "loragate-demo".into(), path: "meow".into() };
    let status = harness.control.clone().load_lora_adapter(load).await.expect_err("reserved");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().starts_with("lora_name"), "{status:?}");
}

#[tokio::test]
async fn idle_connections_are_closed_but_a_held_call_keeps_its_connection() {
    use tokio::io::AsyncReadExt;

    let coordinator =
        coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), CoordinatorConfig::default(), &["meow"]).await;
    let limits = loragate_net::ConnectionLimits::new(16, Duration::from_millis(200), Duration::from_millis(400));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (_stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(crate::serve_grpc_with(
        listener,
        coordinator.clone(),
        limits.clone(),
        None,
        std::future::pending(),
        async {
            let _ = stopped.await;
        },
    ));

    // A connection that never sends the HTTP/2 preface is closed by the header-read timeout.
    let mut silent = tokio::net::TcpStream::connect(address).await.expect("connect");
    let mut ignored = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), silent.read_to_end(&mut ignored)).await;
    assert!(closed.is_ok(), "a silent connection is closed");

    // A sample held at a paused gate for several idle timeouts keeps its connection and is answered on resume.
    let meow = loragate_core::AdapterName::parse("meow").expect("name");
    coordinator.abort(&meow).await.expect("pause");
    let channel = Channel::from_shared(format!("http://{address}")).expect("uri").connect().await.expect("connect");
    let mut sampler = SamplerClient::new(channel);
    let held = tokio::spawn(async move { sampler.sample(sample_request("meow", 2)).await });
    eventually("the sample is held", || async { coordinator.load().held == 1 }).await;
    // Time passing is what is tested here (three idle timeouts), not a synchronisation.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!held.is_finished(), "still held");
    coordinator.resume(&meow, None).await.expect("resume");
    let response = held.await.expect("task").expect("answered on the same connection");
    assert_eq!(response.into_inner().sequences[0].finish_reason(), FinishReason::Length);
    eventually("the idle connection is closed afterwards", || async { limits.open_connections() == 0 }).await;
}
