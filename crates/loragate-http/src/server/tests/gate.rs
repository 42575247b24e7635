//! The submission gate on `/v1/completions` (the core's, inside `Coordinator::sample`): holds while paused, releases
//! on resume, expires with 503, leaves nothing behind when the client goes away, and gates nothing else.

use serde_json::json;

use super::*;

fn short_request() -> Value {
    json!({"model": "meow", "prompt": "x", "max_tokens": 2})
}

#[tokio::test]
async fn a_fresh_completion_is_held_while_paused_and_admitted_on_resume() {
    let harness = serve(&["meow"]).await;
    harness.pause("meow").await;
    let held = harness.spawn_completion(short_request(), "held-1");
    eventually("the request is held", || async { harness.status_of("meow").await.held == 1 }).await;
    assert!(!held.is_finished(), "a held request has no answer yet");
    assert_eq!(harness.status_of("meow").await.in_flight, 0, "held means not admitted");
    harness.resume("meow").await;
    let (status, body) = held.await.expect("task");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["id"], "cmpl-held-1");
    assert_eq!(harness.status_of("meow").await.held, 0);
}

#[tokio::test]
async fn a_request_is_parsed_before_it_is_held_so_a_bad_one_is_refused_at_once() {
    let harness = serve(&["meow"]).await;
    harness.pause("meow").await;
    // Readable `model`, invalid `max_tokens`: refused at once, never held.
    let (status, body) =
        harness.post("/v1/completions", json!({"model": "meow", "prompt": "x", "max_tokens": 0})).await;
    assert_eq!((status, &body["error"]["param"]), (StatusCode::BAD_REQUEST, &json!("max_tokens")));
    assert_eq!(harness.status_of("meow").await.held, 0);
    harness.resume("meow").await;
}

#[tokio::test]
async fn a_hold_past_the_servers_limit_is_503_naming_the_adapter() {
    let config = CoordinatorConfig { max_gate_hold: Duration::from_millis(300), ..CoordinatorConfig::default() };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["meow"]).await;
    harness.pause("meow").await;
    let started = Instant::now();
    let (status, body) = harness.post("/v1/completions", short_request()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(started.elapsed() >= Duration::from_millis(250), "it was held first");
    let error = &body["error"];
    assert!(error["message"].as_str().is_some_and(|message| message.contains("meow")), "{body}");
    assert_eq!((&error["type"], &error["code"]), (&json!("service_unavailable_error"), &json!("gate_hold_expired")));
    let status = harness.status_of("meow").await;
    assert_eq!((status.held, status.in_flight, status.paused), (0, 0, true), "nothing left, still paused");
}

#[tokio::test]
async fn a_client_that_disconnects_while_held_leaves_nothing_behind() {
    let harness = serve(&["meow"]).await;
    harness.pause("meow").await;
    let held = harness.spawn_completion(short_request(), "gone-1");
    eventually("the request is held", || async { harness.status_of("meow").await.held == 1 }).await;
    held.abort();
    eventually("the held request is gone", || async {
        let status = harness.status_of("meow").await;
        (status.held, status.in_flight) == (0, 0)
    })
    .await;
    assert!(harness.status_of("meow").await.paused, "a departed client never reopens the adapter");
    harness.resume("meow").await;
    assert_eq!(harness.status_of("meow").await.in_flight, 0, "the departed request was never admitted");
}

#[tokio::test]
async fn only_completions_are_gated() {
    let harness = serve(&["meow", "woof"]).await;
    harness.pause("meow").await;
    let (status, models) = harness.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(models["data"][1]["paused"], true, "{models}");
    assert_eq!(harness.get("/health").await.0, StatusCode::OK);
    let metrics = harness.client.get(harness.url("/metrics")).send().await.expect("metrics");
    assert_eq!(metrics.status(), StatusCode::OK);
    let (status, wait) =
        harness.post("/skyrl/v1/wait_lora_unpaused", json!({"lora_name": "meow", "timeout_s": 0.05})).await;
    assert_eq!((status, wait), (StatusCode::OK, json!({"paused": true})));
    for other in ["woof", SERVED_NAME] {
        let (status, body) =
            harness.post("/v1/completions", json!({"model": other, "prompt": "x", "max_tokens": 1})).await;
        assert_eq!(status, StatusCode::OK, "{other} is not held by meow's pause: {body}");
    }
    // An unreadable body is refused, never held.
    let response = harness
        .client
        .post(harness.url("/v1/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(harness.status_of("meow").await.held, 0);
    harness.resume("meow").await;
}
