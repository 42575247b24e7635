//! The probe of `loragate worker`, as regression tests: requests arriving while generation is paused are
//! bounded by the held cap and the gate deadline, connections that send only the HTTP/2 preface are closed by the
//! header-read timeout, loads under new names are bounded by `--max-loras`, and with keys nobody without the
//! admin key can stop the worker, load adapters or abort requests.

use std::time::Duration;

use futures::future::join_all;
use loragate_core::{Key, Keyring, TenantKeys};
use loragate_net::ConnectionLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Request;
use tonic::metadata::MetadataValue;

use super::*;

/// The calls of the probe: 2,000 `GenerateStream`s, 500 `LoadLora`s.
const PAUSED_CALLS: usize = 2_000;
const NEW_NAMES: usize = 500;

#[tokio::test]
async fn calls_arriving_while_paused_are_bounded_by_the_held_cap_and_the_gate_deadline() {
    let worker = TestWorker::start_with(3, |setup| Setup {
        coordinator: CoordinatorConfig {
            max_gate_hold: Duration::from_secs(1),
            limits: Limits { max_held: 32, ..Limits::default() },
            ..setup.coordinator
        },
        ..setup
    })
    .await;
    let pause = pb::PauseGenerationRequest { mode: pb::PauseMode::Abort.into(), clear_cache: None };
    worker.control().pause_generation(pause).await.expect("pause");

    // Over several connections, as many clients would.
    let channels: Vec<Channel> = (0..4).map(|_| channel_to(worker.address)).collect();
    let calls = (0..PAUSED_CALLS).map(|i| {
        let mut client = InferenceClient::new(channels[i % channels.len()].clone());
        async move { client.generate_stream(request(&format!("paused-{i}"), "", 2)).await.map(drop) }
    });
    // The bound is the property under test: every call ends (before the fix, all were still waiting 45 s later).
    let ended = tokio::time::timeout(Duration::from_secs(120), join_all(calls)).await.expect("every call ended");
    let (mut refused, mut expired) = (0, 0);
    for outcome in ended {
        let status = outcome.expect_err("generation is paused: nothing is admitted");
        match status.code() {
            Code::ResourceExhausted => {
                assert!(status.message().contains("--max-held"), "{status:?}");
                refused += 1;
            }
            Code::Unavailable => {
                assert!(status.message().contains("stayed paused"), "{status:?}");
                expired += 1;
            }
            _ => panic!("a held call ends refused or at the gate deadline: {status:?}"),
        }
    }
    assert_eq!(refused + expired, PAUSED_CALLS);
    assert!(refused > 0 && expired > 0, "some were refused at the cap ({refused}), some held until the deadline");

    worker.control().resume_generation(pb::ResumeGenerationRequest {}).await.expect("resume");
    let received = read_to_end(worker.stream(request("after", "", 2)).await.expect("serving")).await;
    assert_eq!(received.reason(), FinishReason::Length, "nothing was left behind");
}

#[tokio::test]
async fn connections_that_send_only_the_http2_preface_are_closed_by_the_header_timeout() {
    let connections = ConnectionLimits::new(64, Duration::from_millis(300), Duration::from_secs(60));
    let limits = connections.clone();
    let worker =
        TestWorker::start_with(3, |setup| Setup { front: WorkerConfig { connections, ..setup.front }, ..setup }).await;
    let address = worker.address;
    // More than the cap: those past it wait in the backlog, are accepted as others close, and are closed in turn.
    let silent = (0..200).map(|_| async move {
        let mut socket = tokio::net::TcpStream::connect(address).await.expect("connect");
        socket.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.expect("preface");
        let mut ignored = Vec::new();
        // The server's SETTINGS, then the end of the connection (or a reset).
        let _ = socket.read_to_end(&mut ignored).await;
    });
    tokio::time::timeout(Duration::from_secs(60), join_all(silent)).await.expect("every silent connection closed");
    eventually("no connection is left open", || async { limits.open_connections() == 0 }).await;
    let received = read_to_end(worker.stream(request("after", "", 2)).await.expect("serving")).await;
    assert_eq!(received.reason(), FinishReason::Length);
}

#[tokio::test]
async fn loads_under_new_names_are_bounded_by_max_loras_and_an_unload_frees_a_place() {
    let worker =
        TestWorker::start_with(3, |setup| Setup { front: WorkerConfig { max_loras: Some(8), ..setup.front }, ..setup })
            .await;
    let loads = (0..NEW_NAMES).map(|i| {
        let mut control = worker.control();
        async move {
            let load = pb::LoadLoraRequest { lora_name: format!("new-{i}@1"), source_path: "meow".into() };
            control.load_lora(load).await.map(drop)
        }
    });
    let mut loaded = 0;
    for outcome in join_all(loads).await {
        match outcome {
            Ok(()) => loaded += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(status.message().contains("--max-loras"), "{status:?}");
            }
        }
    }
    assert_eq!(loaded, 8, "exactly --max-loras loads succeed, however they race");
    let listed = worker.control().list_loras(pb::ListLorasRequest {}).await.expect("list").into_inner().adapters;
    assert_eq!(listed.len(), 8);

    let one = listed[0].lora_name.clone();
    let refused = worker.load("late@1", "meow").await.expect_err("full");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    worker.control().unload_lora(pb::UnloadLoraRequest { lora_name: one.clone() }).await.expect("unload");
    let received = worker.stream(request("on-unloaded", &one, 2)).await.expect_err("unloaded");
    assert_eq!(received.code(), Code::NotFound, "{received:?}");
    worker.load("late@1", "meow").await.expect("the unload freed a place");
    let received = read_to_end(worker.stream(request("on-late", "late@1", 2)).await.expect("stream")).await;
    assert_eq!(received.reason(), FinishReason::Length);
}

/// `message` with `key` as its bearer token, or without a key.
fn keyed<T>(message: T, key: Option<&str>) -> Request<T> {
    match key {
        Some(key) => with_key(message, key),
        None => Request::new(message),
    }
}

fn with_key<T>(message: T, key: &str) -> Request<T> {
    let mut request = Request::new(message);
    let value: MetadataValue<_> = format!("Bearer {key}").parse().expect("ascii");
    request.metadata_mut().insert("authorization", value);
    request
}

#[tokio::test]
async fn with_keys_only_the_admin_key_controls_and_the_api_key_samples() {
    let keys = Keyring::new(
        Some(Key::parse("k-api").expect("key")),
        Some(Key::parse("k-admin").expect("key")),
        TenantKeys::default(),
    )
    .expect("keys");
    let worker = TestWorker::start_with(3, |setup| Setup {
        coordinator: CoordinatorConfig { auth: keys, ..setup.coordinator },
        front: WorkerConfig { shutdown_rpc: true, ..setup.front },
    })
    .await;
    let mut control = worker.control();
    let load = || pb::LoadLoraRequest { lora_name: "meow@1".into(), source_path: "meow".into() };
    let abort = || pb::AbortRequest { request_ids: vec!["victim".into()] };

    // A running request that an unauthenticated Abort must not reach.
    let mut inference = worker.inference();
    let mut victim =
        inference.generate_stream(with_key(request("victim", "", 100), "k-api")).await.expect("sample").into_inner();
    let mut received = Received::default();
    read_until_tokens(&mut victim, &mut received, 3).await;

    for key in [None, Some("k-wrong"), Some("k-api")] {
        let expected = if key == Some("k-api") { Code::PermissionDenied } else { Code::Unauthenticated };
        let refusals = [
            control.shutdown(keyed(pb::ShutdownRequest {}, key)).await.map(drop),
            control.load_lora(keyed(load(), key)).await.map(drop),
            control.abort(keyed(abort(), key)).await.map(drop),
            control.unload_lora(keyed(pb::UnloadLoraRequest { lora_name: "meow@1".into() }, key)).await.map(drop),
            control.pause_generation(keyed(pb::PauseGenerationRequest::default(), key)).await.map(drop),
            control.list_loras(keyed(pb::ListLorasRequest {}, key)).await.map(drop),
        ];
        for refusal in refusals {
            assert_eq!(refusal.expect_err("refused").code(), expected, "key {key:?}");
        }
    }
    let unauthenticated = worker.stream(request("anonymous", "", 2)).await.expect_err("no key");
    assert_eq!(unauthenticated.code(), Code::Unauthenticated, "{unauthenticated:?}");
    assert!(!worker.shutdown.is_cancelled(), "nobody without the admin key stopped it");

    // The request is still running, untouched; the admin key controls, and samples too.
    let loaded = control.load_lora(with_key(load(), "k-admin")).await.expect("the admin loads").into_inner();
    assert_eq!(loaded.adapter.map(|adapter| adapter.lora_name).as_deref(), Some("meow@1"));
    let as_admin = inference.generate_stream(with_key(request("admin", "meow@1", 2), "k-admin")).await;
    let as_admin = read_to_end(as_admin.expect("the admin samples").into_inner()).await;
    assert_eq!(as_admin.reason(), FinishReason::Length);
    control.abort(with_key(abort(), "k-admin")).await.expect("the admin aborts");
    while let Some(message) = victim.message().await.expect("no error") {
        accept(&mut received, message);
    }
    assert_eq!((received.reason(), received.num_tokens), (FinishReason::Aborted, 3), "aborted only by the admin");

    // Health needs no key; Shutdown with the admin key stops the worker.
    let mut health = tonic_health::pb::health_client::HealthClient::new(worker.channel.clone());
    health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.expect("health is open");
    control.shutdown(with_key(pb::ShutdownRequest {}, "k-admin")).await.expect("the admin stops it");
    assert!(worker.shutdown.is_cancelled());
}
