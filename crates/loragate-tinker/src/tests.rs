//! The front over a scripted engine, on a real server at `127.0.0.1:0`, driven the way the SDK drives it: the future
//! lifecycle (pending, paused, finished, failed, delivered again, expired), resubmissions, limits and refusals.
//!
//! The scripted engine emits `HOLD_AFTER` tokens per sequence at once (token `i` is byte `i`), then ends with
//! `length` if the budget allows no more, or waits until aborted.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use loragate_core::testing::{ScriptedEngine, coordinator_with_adapters, eventually};
use loragate_core::{AdapterName, Coordinator, CoordinatorConfig, PauseMode, PauseRequest, RequestId};
use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::proto::tinker_public::{SampleResponse, StopReason};
use crate::{RetentionLimits, TinkerConfig, TinkerFront};
use loragate_text::testing::ByteCodec;

mod restart;

/// Tokens each scripted request emits before it waits to be aborted.
const HOLD_AFTER: u32 = 3;
/// What the tests' servers call the base model.
const SERVED_NAME: &str = "demo";

struct Harness {
    base: String,
    client: reqwest::Client,
    coordinator: Coordinator,
    front: TinkerFront,
}

/// A server with `meow` and `woof` loaded, polls held for 50 ms, and `config` adjusted.
async fn serve(configure: impl FnOnce(&mut TinkerConfig)) -> Harness {
    let coordinator =
        coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), CoordinatorConfig::default(), &["meow", "woof"])
            .await;
    serve_on(coordinator, configure).await
}

/// A server over `coordinator`, polls held for 50 ms, and `config` adjusted.
async fn serve_on(coordinator: Coordinator, configure: impl FnOnce(&mut TinkerConfig)) -> Harness {
    let mut config = TinkerConfig { poll_hold: Duration::from_millis(50), body_limit: 16 * 1024, ..Default::default() };
    configure(&mut config);
    let front = TinkerFront::start(coordinator.clone(), SERVED_NAME, Arc::new(ByteCodec), config).await.expect("start");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let routes = front.routes();
    tokio::spawn(async move { axum::serve(listener, routes).await });
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    Harness { base: format!("http://{address}"), client, coordinator, front }
}

impl Harness {
    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self.client.post(format!("{}{path}", self.base)).json(&body).send().await.expect("POST");
        let status = response.status();
        (status, response.json().await.expect("a JSON body"))
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self.client.get(format!("{}{path}", self.base)).send().await.expect("GET");
        let status = response.status();
        (status, response.json().await.expect("a JSON body"))
    }

    /// A sampling session for `model_path` (an adapter) or the base model.
    async fn sampling_session(&self, model_path: Option<&str>) -> String {
        let body = match model_path {
            Some(path) => json!({"session_id": "s", "sampling_session_seq_id": 0, "model_path": path}),
            None => json!({"session_id": "s", "sampling_session_seq_id": 0, "base_model": SERVED_NAME}),
        };
        let (status, answer) = self.post("/api/v1/create_sampling_session", body).await;
        assert_eq!(status, 200, "{answer}");
        answer["sampling_session_id"].as_str().expect("id").to_owned()
    }

    /// `asample` with the SDK's defaults and `overrides`; answers the status and body.
    async fn asample(&self, session: &str, seq_id: i64, overrides: Value) -> (StatusCode, Value) {
        let mut body = json!({
            "sampling_session_id": session, "seq_id": seq_id, "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [72, 105]}]},
            "sampling_params": {"max_tokens": HOLD_AFTER, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
            "prompt_logprobs": false, "topk_prompt_logprobs": 0, "topk_sample_logprobs": 0,
            "prompt_alt_tokens_k": 0, "record_stability_info": false, "type": "sample"
        });
        for (key, value) in overrides.as_object().expect("object") {
            body[key] = value.clone();
        }
        self.post("/api/v1/asample", body).await
    }

    /// `asample` that must be accepted; answers the request id.
    async fn submit(&self, session: &str, seq_id: i64, overrides: Value) -> String {
        let (status, answer) = self.asample(session, seq_id, overrides).await;
        assert_eq!(status, 200, "{answer}");
        answer["request_id"].as_str().expect("request_id").to_owned()
    }

    /// One `retrieve_future` poll.
    async fn poll(&self, request_id: &str) -> Poll {
        let response = self
            .client
            .post(format!("{}/api/v1/retrieve_future", self.base))
            .json(&json!({"request_id": request_id, "allow_metadata_only": true}))
            .send()
            .await
            .expect("retrieve_future");
        let status = response.status();
        let content_type = response.headers().get("content-type").map(|v| v.to_str().expect("ascii").to_owned());
        let bytes = response.bytes().await.expect("body");
        match content_type.as_deref() {
            Some("application/x-protobuf") => {
                assert_eq!(status, 200);
                Poll::Finished(Box::new(SampleResponse::decode(bytes).expect("a SampleResponse")))
            }
            _ => Poll::Json(status, serde_json::from_slice(&bytes).expect("a JSON body")),
        }
    }

    /// Polls as the SDK does until the answer is not `try_again`.
    async fn retrieve(&self, request_id: &str) -> Poll {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let poll = self.poll(request_id).await;
            match &poll {
                Poll::Json(StatusCode::OK, body) if body["type"] == "try_again" => {}
                _ => return poll,
            }
            assert!(Instant::now() < deadline, "{request_id} stayed pending");
        }
    }
}

#[derive(Debug)]
enum Poll {
    Finished(Box<SampleResponse>),
    Json(StatusCode, Value),
}

impl Poll {
    fn finished(self) -> SampleResponse {
        match self {
            Self::Finished(response) => *response,
            Self::Json(status, body) => panic!("expected a finished sample, got {status} {body}"),
        }
    }

    fn json(self) -> (StatusCode, Value) {
        match self {
            Self::Json(status, body) => (status, body),
            Self::Finished(response) => panic!("expected JSON, got {response:?}"),
        }
    }
}

fn int32s(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn meow() -> AdapterName {
    AdapterName::parse("meow").expect("name")
}

#[tokio::test]
async fn the_sdks_flow_samples_an_adapter_and_answers_protobuf_once_and_again() {
    let h = serve(|_| {}).await;
    let (status, config) = h.post("/api/v1/client/config", json!({"sdk_version": "0.38.0"})).await;
    assert_eq!(
        (status, &config["pjwt_auth_enabled"], &config["sample_use_retrieve_futures"]),
        (StatusCode::OK, &json!(false), &json!(false))
    );
    let (status, session) = h.post("/api/v1/create_session", json!({"tags": [], "sdk_version": "0.38.0"})).await;
    assert_eq!(status, 200);
    assert!(session["session_id"].is_string() && session.get("warning_message").is_none(), "{session}");
    let (_, old_sdk) = h.post("/api/v1/create_session", json!({"sdk_version": "0.24.1"})).await;
    assert!(old_sdk["warning_message"].as_str().expect("a warning").contains("0.24.1"), "{old_sdk}");

    let session = h.sampling_session(Some("tinker://loragate/meow")).await;
    let (status, sampler) = h.get(&format!("/api/v1/samplers/{session}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&sampler["base_model"], &sampler["model_path"]),
        (&json!(SERVED_NAME), &json!("tinker://loragate/meow"))
    );

    let (status, submitted) = h.asample(&session, 0, json!({"num_samples": 2, "prompt_logprobs": true})).await;
    assert_eq!(status, 200, "{submitted}");
    let request_id = submitted["request_id"].as_str().expect("request_id");
    let expected_ids: Vec<String> = (0..2).map(|i| format!("{request_id}:{i}")).collect();
    assert_eq!(submitted["sample_sequence_ids"], json!(expected_ids));

    let response = h.retrieve(request_id).await.finished();
    assert_eq!(response.sequences.len(), 2);
    for sequence in &response.sequences {
        assert_eq!(int32s(&sequence.tokens), [0, 1, 2]);
        assert_eq!(sequence.stop_reason(), StopReason::Length);
        assert_eq!(sequence.logprobs.as_ref().map(Vec::len), Some(4 * 3), "one float32 per token");
    }
    assert!(response.prompt_logprobs.is_some(), "asked for");
    let again = h.poll(request_id).await.finished();
    assert_eq!(again, response, "a lost response can be retrieved again");
}

#[tokio::test]
async fn the_base_model_samples_by_its_served_name_and_stop_strings_end_sequences_at_their_token() {
    let h = serve(|_| {}).await;
    let session = h.sampling_session(None).await;
    let (_, sampler) = h.get(&format!("/api/v1/samplers/{session}")).await;
    assert_eq!(sampler["model_path"], Value::Null);
    let stop_at_byte_one = json!({"max_tokens": HOLD_AFTER, "stop": ["\u{1}"]});
    let request_id = h.submit(&session, 0, json!({"sampling_params": stop_at_byte_one})).await;
    let response = h.retrieve(&request_id).await.finished();
    assert_eq!(int32s(&response.sequences[0].tokens), [0, 1], "the token that completed the stop string is last");
    assert_eq!(response.sequences[0].stop_reason(), StopReason::Stop);
    assert_eq!(response.prompt_logprobs, None, "not asked for");
}

#[tokio::test]
async fn a_paused_adapters_future_stays_pending_with_the_paused_queue_state_and_finishes_after_resume() {
    let h = serve(|_| {}).await;
    h.coordinator.abort(&meow()).await.expect("pause meow");
    let session = h.sampling_session(Some("tinker://loragate/meow")).await;
    let request_id = h.submit(&session, 0, json!({})).await;
    let meow_handle = h.coordinator.lora(&meow()).expect("loaded");
    eventually("the sample is held at meow's gate", || async { meow_handle.status().await.expect("status").held == 1 })
        .await;

    let (status, waiting) = h.poll(&request_id).await.json();
    assert_eq!(status, 200);
    assert_eq!((&waiting["type"], &waiting["queue_state"]), (&json!("try_again"), &json!("paused_capacity")));
    assert!(waiting["queue_state_reason"].as_str().expect("reason").contains("adapter 'meow' is paused"));

    let woof_session = h.sampling_session(Some("tinker://loragate/woof")).await;
    let woof = h.submit(&woof_session, 0, json!({})).await;
    h.retrieve(&woof).await.finished();

    h.coordinator.resume(&meow(), None).await.expect("resume");
    let response = h.retrieve(&request_id).await.finished();
    assert_eq!(int32s(&response.sequences[0].tokens), [0, 1, 2]);
}

#[tokio::test]
async fn a_running_future_answers_try_again_active_after_the_hold() {
    let h = serve(|_| {}).await;
    let session = h.sampling_session(Some("tinker://loragate/meow")).await;
    let request_id = h.submit(&session, 0, json!({"sampling_params": {"max_tokens": 50}})).await;
    let (status, waiting) = h.poll(&request_id).await.json();
    assert_eq!((status, &waiting["queue_state"]), (StatusCode::OK, &json!("active")), "{waiting}");
    assert_eq!(waiting["request_id"], json!(request_id));
}

#[tokio::test]
async fn a_future_fails_once_its_adapter_stayed_paused_past_the_cap_or_was_unloaded() {
    let h = serve(|config| config.max_pause_wait = Duration::from_millis(100)).await;
    h.coordinator.abort(&meow()).await.expect("pause meow");
    let session = h.sampling_session(Some("tinker://loragate/meow")).await;
    let request_id = h.submit(&session, 0, json!({})).await;
    let (status, failed) = h.retrieve(&request_id).await.json();
    assert_eq!(status, 200);
    assert_eq!(failed["category"], "server");
    assert!(
        failed["error"].as_str().expect("error").starts_with("adapter 'meow' stayed paused for 100 ms"),
        "{failed}"
    );

    let h = serve(|_| {}).await;
    h.coordinator.abort(&meow()).await.expect("pause meow");
    let session = h.sampling_session(Some("tinker://loragate/meow")).await;
    let request_id = h.submit(&session, 0, json!({})).await;
    h.coordinator.unload_adapter(&meow()).await.expect("unload");
    let (_, failed) = h.retrieve(&request_id).await.json();
    assert_eq!(
        failed,
        json!({"error": "adapter 'meow' was unloaded while this sample was pending", "category": "user"})
    );
    let (status, gone) = h.asample(&session, 1, json!({})).await;
    assert_eq!(status, 404, "the sampling session follows its adapter by name: {gone}");
}

#[tokio::test]
async fn a_sample_stopped_by_a_keep_or_abort_pause_stays_pending_and_is_continued_by_the_core() {
    for mode in [PauseMode::Keep, PauseMode::Abort] {
        let h = serve(|_| {}).await;
        let session = h.sampling_session(Some("tinker://loragate/meow")).await;
        // The scripted engine emits 3 tokens, then waits: the pause stops it with 3 of its 6 tokens.
        let request_id = h.submit(&session, 0, json!({"sampling_params": {"max_tokens": 2 * HOLD_AFTER}})).await;
        let meow_handle = h.coordinator.lora(&meow()).expect("loaded");
        eventually("the sample runs", || async { meow_handle.status().await.expect("status").in_flight == 1 }).await;
        let report = h.coordinator.pause(&meow(), PauseRequest::new(mode), None).await.expect("pause");
        assert_eq!(report.aborted, [], "{mode:?}: the SDK never gets an abort");
        assert_eq!(report.kept.iter().map(ToString::to_string).collect::<Vec<_>>(), std::slice::from_ref(&request_id));
        let (_, waiting) = h.poll(&request_id).await.json();
        assert_eq!(waiting["queue_state"], "paused_capacity", "{mode:?}: {waiting}");

        h.coordinator.resume(&meow(), None).await.expect("resume");
        let response = h.retrieve(&request_id).await.finished();
        let sequence = &response.sequences[0];
        assert_eq!(int32s(&sequence.tokens), [0, 1, 2, 0, 1, 2], "{mode:?}: continued with the remaining budget");
        assert_eq!(sequence.stop_reason(), StopReason::Length);
    }
}

#[tokio::test]
async fn a_stopped_sample_fails_when_its_adapter_stays_paused_past_the_cap_or_its_id_is_aborted() {
    let h = serve(|config| config.max_pause_wait = Duration::from_millis(100)).await;
    let session = h.sampling_session(Some("tinker://loragate/meow")).await;
    let request_id = h.submit(&session, 0, json!({"sampling_params": {"max_tokens": 50}})).await;
    let meow_handle = h.coordinator.lora(&meow()).expect("loaded");
    eventually("the sample runs", || async { meow_handle.status().await.expect("status").in_flight == 1 }).await;
    h.coordinator.pause(&meow(), PauseRequest::new(PauseMode::Keep), None).await.expect("pause");
    let (_, failed) = h.retrieve(&request_id).await.json();
    assert!(
        failed["error"].as_str().expect("error").starts_with("adapter 'meow' stayed paused for 100 ms"),
        "{failed}"
    );
    h.coordinator.resume(&meow(), None).await.expect("resume");

    let request_id = h.submit(&session, 1, json!({"sampling_params": {"max_tokens": 50}})).await;
    eventually("the sample runs", || async { meow_handle.status().await.expect("status").in_flight == 1 }).await;
    let id = RequestId::parse_or_generate(&request_id).expect("id");
    assert_eq!(h.coordinator.abort_requests(&[id]).await.aborted.len(), 1);
    let (_, failed) = h.retrieve(&request_id).await.json();
    assert_eq!(failed["category"], "server");
    assert!(failed["error"].as_str().expect("error").contains("its request id was aborted"), "{failed}");
}

#[tokio::test]
async fn resubmissions_answer_the_same_future_and_the_pending_cap_answers_429() {
    let h = serve(|config| config.retention = RetentionLimits { max_pending: 1, ..RetentionLimits::default() }).await;
    let session = h.sampling_session(Some("tinker://loragate/meow")).await;
    let long = json!({"sampling_params": {"max_tokens": 50}});
    let first = h.submit(&session, 7, long.clone()).await;
    assert_eq!(h.submit(&session, 7, long.clone()).await, first, "the same (session, seq_id) is the same future");
    let response = h
        .client
        .post(format!("{}/api/v1/asample", h.base))
        .json(&json!({
            "sampling_session_id": session, "seq_id": 8, "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [72]}]}, "sampling_params": {"max_tokens": 1}
        }))
        .send()
        .await
        .expect("asample");
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.expect("json");
    assert!(body["detail"].as_str().expect("detail").contains("--tinker-max-pending"), "{body}");
    assert_eq!(h.front.state().store().counts().await.expect("counts"), (1, 0));

    h.coordinator.abort_requests(&[RequestId::parse_or_generate(&first).expect("id")]).await;
    h.retrieve(&first).await.json();
    let second = h.submit(&session, 8, json!({})).await;
    h.retrieve(&second).await.finished();
    assert_eq!(h.front.state().store().counts().await.expect("counts"), (0, 2), "both results are retained");
}

#[tokio::test]
async fn request_ids_of_an_earlier_process_get_410_and_unknown_ones_404() {
    let h = serve(|_| {}).await;
    let session = h.sampling_session(None).await;
    let ours = h.submit(&session, 0, json!({})).await;
    let (epoch, n) = ours.strip_prefix("tk-").and_then(|rest| rest.split_once('-')).expect("tk-<epoch>-<n>");
    let other_epoch = format!("{:08x}", u32::from_str_radix(epoch, 16).expect("hex") ^ 1);
    let (status, gone) = h.poll(&format!("tk-{other_epoch}-{n}")).await.json();
    assert_eq!(status, 410, "the SDK resubmits the sample: {gone}");
    assert!(gone["detail"].as_str().expect("detail").contains("restarted"));
    for unknown in [format!("tk-{epoch}-999999"), "whatever".to_owned()] {
        let (status, body) = h.poll(&unknown).await.json();
        assert_eq!(status, 404, "{body}");
        assert!(body["detail"].as_str().expect("detail").contains(&unknown));
    }
}

#[tokio::test]
async fn sessions_beat_until_finished_and_bookkeeping_routes_answer_what_the_sdk_validates() {
    let h = serve(|_| {}).await;
    let beat = json!({"session_id": "session-x", "type": "session_heartbeat"});
    assert_eq!(h.post("/api/v1/session_heartbeat", beat.clone()).await.0, 200, "unknown sessions (a restart) beat");
    let (status, _) = h.post("/api/v1/sessions/session-x/finish", json!({"reason": {"type": "success"}})).await;
    assert_eq!(status, 200);
    let (status, body) = h.post("/api/v1/session_heartbeat", beat).await;
    assert_eq!(status, 410, "{body}");

    assert_eq!(h.post("/api/v1/telemetry", json!({"events": []})).await.1, json!({"status": "accepted"}));
    assert_eq!(h.get("/api/v1/healthz").await.1, json!({"status": "ok"}));
    let (_, capabilities) = h.get("/api/v1/get_server_capabilities").await;
    assert_eq!(capabilities["supported_models"][0]["model_name"], SERVED_NAME);
    assert_eq!(capabilities["supported_models"][0]["max_context_length"], 4096);
    let (_, dynamic) = h.post("/api/v1/client/dynamic_config", json!({"sdk_version": "0.38.0"})).await;
    assert_eq!(dynamic["sample_cancel_enabled"], false);
}

#[tokio::test]
async fn bad_requests_and_other_tinker_features_get_4xx_with_a_detail_naming_the_cause() {
    let h = serve(|_| {}).await;
    let (status, body) = h.post("/api/v1/create_model", json!({"base_model": SERVED_NAME})).await;
    assert_eq!(status, 404);
    assert!(body["detail"].as_str().expect("detail").contains("not supported"), "{body}");
    let response =
        h.client.post(format!("{}/api/v1/save_weights", h.base)).json(&json!({})).send().await.expect("post");
    assert_eq!(response.headers()["x-should-retry"], "false");

    let (status, body) = h.get("/api/v1/asample").await;
    assert_eq!(status, 405, "{body}");
    let (status, body) =
        h.post("/api/v1/create_sampling_session", json!({"model_path": "tinker://loragate/ghost"})).await;
    assert_eq!(
        (status, body["detail"].as_str().expect("detail")),
        (StatusCode::NOT_FOUND, "adapter 'ghost' (model_path 'tinker://loragate/ghost') is not loaded on this server")
    );
    let (status, body) = h.asample("ss-garbage", 0, json!({})).await;
    assert_eq!(status, 404, "{body}");
    let session = h.sampling_session(None).await;
    let (status, body) = h.asample(&session, 0, json!({"num_samples": 0})).await;
    assert_eq!(status, 400);
    assert!(body["detail"].as_str().expect("detail").starts_with("num_samples: "), "{body}");
    let (status, body) = h.asample(&session, 0, json!({"sampling_params": {"max_tokens": 5000}})).await;
    assert_eq!(status, 400);
    assert!(body["detail"].as_str().expect("detail").starts_with("sampling_params.max_tokens: "), "{body}");
    let (status, body) = h.asample(&session, 0, json!({"sampling_params": {"seed": "x"}})).await;
    assert_eq!(status, 400);
    assert!(body["detail"].as_str().expect("detail").starts_with("sampling_params.seed: "), "{body}");

    let huge = json!({"events": ["x".repeat(20 * 1024)]});
    let (status, body) = h.post("/api/v1/telemetry", huge).await;
    assert_eq!(status, 413, "{body}");
    let response = h.client.post(format!("{}/api/v1/asample", h.base)).body("{not json").send().await.expect("post");
    assert_eq!(response.status(), 400);
    assert!(response.content_length().unwrap_or(0) > 0, "every 4xx has a body");
    assert_eq!(h.front.state().store().counts().await.expect("counts"), (0, 0), "nothing was recorded");
}

#[tokio::test]
async fn a_tenant_key_samples_its_own_adapters_and_reads_only_its_own_futures() {
    use loragate_core::{Keyring, TenantKeys};

    let tenants =
        r#"{"k-meow": {"adapters": ["meow"], "control": false}, "k-woof": {"adapters": ["woof"], "control": false}}"#;
    let auth = Keyring::new(None, None, TenantKeys::parse(tenants).expect("tenants")).expect("keys");
    let config = CoordinatorConfig { auth, ..CoordinatorConfig::default() };
    let coordinator = coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), config, &["meow", "woof"]).await;
    let tinker = TinkerConfig { poll_hold: Duration::from_millis(50), ..Default::default() };
    let front = TinkerFront::start(coordinator.clone(), SERVED_NAME, Arc::new(ByteCodec), tinker).await.expect("start");
    // The routes alone: mounted on the HTTP front's listener they authenticate themselves the same way (the HTTP
    // front's tests check that its guard leaves other fronts' routes to their own authentication).
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let routes = front.routes();
    tokio::spawn(async move { axum::serve(listener, routes).await });
    // The SDK sends its key as `X-API-Key`, with the `tml-` prefix it insists on.
    let as_key = |key: &str| {
        let headers = [(reqwest::header::HeaderName::from_static("x-api-key"), key.parse().expect("header value"))];
        let client = reqwest::Client::builder()
            .no_proxy()
            .default_headers(headers.into_iter().collect())
            .build()
            .expect("client");
        Harness { base: base.clone(), client, coordinator: coordinator.clone(), front: front.clone() }
    };
    let (meow, woof) = (as_key("tml-k-meow"), as_key("k-woof"));

    let session = meow.sampling_session(Some("tinker://loragate/meow")).await;
    let id = meow.submit(&session, 0, json!({})).await;
    match woof.poll(&id).await {
        Poll::Json(status, body) => assert_eq!(status, StatusCode::NOT_FOUND, "another tenant's future: {body}"),
        Poll::Finished(_) => panic!("a tenant read another tenant's sample"),
    }
    let (status, _) = woof.asample(&session, 1, json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "nor sample its adapter");
    assert!(matches!(meow.retrieve(&id).await, Poll::Finished(_)), "the owner reads its sample");

    // Both may sample the base model, and each reads only its own base-model futures.
    let base_session = meow.sampling_session(None).await;
    let base_id = meow.submit(&base_session, 0, json!({})).await;
    match woof.poll(&base_id).await {
        Poll::Json(status, body) => assert_eq!(status, StatusCode::NOT_FOUND, "another tenant's future: {body}"),
        Poll::Finished(_) => panic!("a tenant read another tenant's base-model sample"),
    }
    assert!(matches!(meow.retrieve(&base_id).await, Poll::Finished(_)), "the owner reads its base-model sample");

    // Without a key: 401 in the Tinker API's own shape (the front authenticates its routes itself).
    let anonymous = reqwest::Client::builder().no_proxy().build().expect("client");
    let response = anonymous.get(format!("{base}/api/v1/healthz")).send().await.expect("GET");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body: Value = response.json().await.expect("a JSON body");
    assert!(body["detail"].as_str().is_some_and(|detail| detail.contains("key")), "{body}");
}

#[tokio::test]
async fn a_body_that_never_completes_is_cut_off_at_the_gate_deadline() {
    let coordinator = coordinator_with_adapters(
        ScriptedEngine::new(HOLD_AFTER),
        CoordinatorConfig { max_gate_hold: Duration::from_millis(200), ..CoordinatorConfig::default() },
        &["meow"],
    )
    .await;
    let front = TinkerFront::start(coordinator.clone(), SERVED_NAME, Arc::new(ByteCodec), TinkerConfig::default())
        .await
        .expect("start");
    let trickle = futures::stream::once(async { Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"{\"seq_id\"")) })
        .chain(futures::stream::pending());
    let request = http::Request::post("/api/v1/asample")
        .header("content-type", "application/json")
        .body(axum::body::Body::from_stream(trickle))
        .expect("request");
    let started = Instant::now();
    let response = tower::ServiceExt::oneshot(front.routes(), request).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(started.elapsed() >= Duration::from_millis(150), "{:?}", started.elapsed());
    assert_eq!(coordinator.metrics().body_read_timeouts("http"), 1);
}
