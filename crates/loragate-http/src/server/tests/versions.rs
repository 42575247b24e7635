//! Versions as a contract on HTTP: `min_lora_version` on every sampling body (held, served, timed out, refused on the
//! base model and for bad values), pins `model: "NAME@V"` (current, retained, future, retired), retained versions in
//! `/v1/models`, the staleness routes, `lora_version` on streamed choices, and `GET /v1/requests/{id}`.

use std::path::PathBuf;

use loragate_core::{
    AdapterName, AdapterSource, AdapterVersion, Key, Keyring, KvPolicy, PauseMode, StalenessPolicy, TenantKeys,
};
use serde_json::json;

use super::*;

/// The sampling endpoints that need no chat template and a body of each asking `model` for at most 2 tokens (the scripted engine then
/// ends them with `length` at once), with `extra` fields merged in.
fn sampling_bodies(model: &str, extra: &Value) -> Vec<(&'static str, Value)> {
    let mut bodies = vec![
        ("/v1/completions", json!({"model": model, "prompt": [1, 2], "max_tokens": 2})),
        ("/inference/v1/generate", json!({"model": model, "token_ids": [1, 2], "sampling_params": {"max_tokens": 2}})),
        ("/generate", json!({"lora_path": model, "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})),
    ];
    for (_, body) in &mut bodies {
        for (key, value) in extra.as_object().expect("an object") {
            body[key] = value.clone();
        }
    }
    bodies
}

async fn load(harness: &Harness, adapter: &str, dir: &str) -> AdapterVersion {
    let name = AdapterName::parse(adapter).expect("name");
    harness.coordinator.load_adapter(&name, AdapterSource::trusted(dir)).await.expect("loads").version
}

/// The versions of a completion choice's segments.
fn segment_versions(choice: &Value) -> Vec<u64> {
    choice["segments"].as_array().expect("segments").iter().map(|s| s["lora_version"].as_u64().expect("v")).collect()
}

#[tokio::test]
async fn a_minimum_version_is_held_until_it_arrives_on_every_endpoint() {
    let harness = serve(&["meow"]).await;
    let bodies = sampling_bodies("meow", &json!({"min_lora_version": 2}));
    let held: Vec<_> = bodies
        .into_iter()
        .enumerate()
        .map(|(index, (path, body))| harness.spawn_post(path, body, &format!("held-{index}")))
        .collect();
    eventually("every request is held for version 2", || async { harness.status_of("meow").await.held == 3 }).await;
    assert!(held.iter().all(|task| !task.is_finished()));
    assert_eq!(load(&harness, "meow", "/a/meow-2").await, AdapterVersion(2));
    for task in held {
        let (status, answer) = task.await.expect("joined");
        assert_eq!(status, StatusCode::OK, "{answer}");
        let segments = answer["choices"][0]["segments"].clone();
        let segments = if segments.is_null() { answer["meta_info"]["segments"].clone() } else { segments };
        assert_eq!(segments[0]["lora_version"], 2, "served by the version that arrived: {answer}");
    }
    // Chat takes it too (with a template).
    let chat = serve_with_chat(&["meow"]).await;
    let body = json!({"model": "meow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "min_lora_version": 1});
    let (status, answer) = chat.post("/v1/chat/completions", body).await;
    assert_eq!((status, segment_versions(&answer["choices"][0])), (StatusCode::OK, vec![1]), "{answer}");
}

#[tokio::test]
async fn a_minimum_version_that_never_comes_is_503_version_not_reached() {
    let config = CoordinatorConfig { max_gate_hold: Duration::from_millis(200), ..CoordinatorConfig::default() };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["meow"]).await;
    for (path, body) in sampling_bodies("meow", &json!({"min_lora_version": 9})) {
        let (status, answer) = harness.post(path, body).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {answer}");
        assert_eq!(answer["error"]["code"], "version_not_reached", "{path}: {answer}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.contains('9') && message.contains('1'), "names both versions: {message}");
    }
    assert_eq!(harness.status_of("meow").await.held, 0, "nothing stays held");
}

#[tokio::test]
async fn bad_minimum_versions_are_refused_naming_the_field() {
    let harness = serve(&["meow"]).await;
    let bad = [json!(-1), json!(1.5), json!("7"), json!(true), json!(18_446_744_073_709_551_616_f64)];
    for value in &bad {
        for (path, body) in sampling_bodies("meow", &json!({"min_lora_version": value})) {
            let (status, answer) = harness.post(path, body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {value}: {answer}");
            assert_eq!(answer["error"]["param"], "min_lora_version", "{path} {value}: {answer}");
        }
    }
    // u64::MAX + 1 written as an integer literal.
    let huge = r#"{"model": "meow", "prompt": [1], "max_tokens": 2, "min_lora_version": 18446744073709551616}"#;
    let response = harness
        .client
        .post(harness.url("/v1/completions"))
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let answer: Value = response.json().await.expect("json");
    assert_eq!(answer["error"]["param"], "min_lora_version", "{answer}");
    // On the base model there are no versions.
    for (path, body) in sampling_bodies(SERVED_NAME, &json!({"min_lora_version": 1})) {
        let (status, answer) = harness.post(path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {answer}");
        assert_eq!(answer["error"]["param"], "min_lora_version", "{path}: {answer}");
    }
    assert_eq!(harness.status_of("meow").await.in_flight, 0, "nothing leaked");
}

#[tokio::test]
async fn pins_serve_the_current_and_retained_versions_hold_a_future_one_and_refuse_a_retired_one() {
    let config = CoordinatorConfig { retain_versions: 2, ..CoordinatorConfig::default() };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["meow"]).await;
    assert_eq!(load(&harness, "meow", "/a/meow-2").await, AdapterVersion(2));
    let completion = |model: &str| json!({"model": model, "prompt": [1, 2], "max_tokens": 2});
    for (model, version) in [("meow@2", 2), ("meow@1", 1), ("meow", 2)] {
        let (status, answer) = harness.post("/v1/completions", completion(model)).await;
        assert_eq!(status, StatusCode::OK, "{model}: {answer}");
        assert_eq!(segment_versions(&answer["choices"][0]), vec![version], "{model}");
        assert_eq!(answer["model"], model, "the response names the model as asked");
    }
    let (_, models) = harness.get("/v1/models").await;
    let ids: Vec<&str> =
        models["data"].as_array().expect("data").iter().map(|m| m["id"].as_str().expect("id")).collect();
    assert_eq!(ids, vec![SERVED_NAME, "meow", "meow@1"], "the retained version is listed beside its adapter");
    assert_eq!(models["data"][2]["version"], 1);
    assert_eq!(models["data"][2]["parent"], SERVED_NAME);

    let future = harness.spawn_completion(completion("meow@3"), "future");
    eventually("the future pin is held", || async { harness.status_of("meow").await.held == 1 }).await;
    assert_eq!(load(&harness, "meow", "/a/meow-3").await, AdapterVersion(3));
    let (status, answer) = future.await.expect("joined");
    assert_eq!((status, segment_versions(&answer["choices"][0])), (StatusCode::OK, vec![3]), "{answer}");

    let (status, answer) = harness.post("/v1/completions", completion("meow@1")).await;
    assert_eq!(status, StatusCode::GONE, "{answer}");
    assert_eq!(answer["error"]["code"], "version_retired");
    assert!(answer["error"]["message"].as_str().expect("message").contains('2'), "lists what is retained: {answer}");
    let chat = json!({"model": "meow@1", "min_lora_version": 2, "prompt": [1], "max_tokens": 2});
    let (status, answer) = harness.post("/v1/completions", chat).await;
    assert_eq!((status, &answer["error"]["param"]), (StatusCode::BAD_REQUEST, &json!("min_lora_version")));
}

impl Harness {
    async fn send_as(
        &self,
        method: reqwest::Method,
        key: Option<&str>,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.client.request(method, self.url(path));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("send");
        (response.status(), response.json().await.expect("a JSON answer"))
    }
}

#[tokio::test]
async fn the_staleness_bound_set_over_http_admits_exactly_its_capacity() {
    let harness = serve(&["meow"]).await;
    let path = "/v1/lora_adapters/meow/staleness";
    let (status, answer) =
        harness.send_as(reqwest::Method::PUT, None, path, Some(json!({"max_staleness": 1, "batch_size": 2}))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["staleness"],
        json!({"max_staleness": 1, "batch_size": 2, "started": 0, "capacity": 4, "held": 0}),
        "(1 + 0 + 1) × 2"
    );
    // Three requests of one sequence and one of n = 2: the last one would make 5 > 4 and is held.
    for index in 0..3 {
        let (status, answer) =
            harness.post("/v1/completions", json!({"model": "meow", "prompt": [1], "max_tokens": 2})).await;
        assert_eq!(status, StatusCode::OK, "request {index}: {answer}");
    }
    let held = harness.spawn_completion(json!({"model": "meow", "prompt": [1], "max_tokens": 2, "n": 2}), "over");
    eventually("the request over the capacity is held", || async {
        harness.status_of("meow").await.staleness.is_some_and(|staleness| staleness.held == 1)
    })
    .await;
    let staleness = harness.status_of("meow").await.staleness.expect("set");
    assert_eq!((staleness.started, staleness.capacity), (3, 4));
    assert_eq!(load(&harness, "meow", "/a/meow-2").await, AdapterVersion(2));
    let (status, answer) = held.await.expect("joined");
    assert_eq!(status, StatusCode::OK, "a new version widens the capacity by batch_size: {answer}");
    let staleness = harness.status_of("meow").await.staleness.expect("set");
    assert_eq!((staleness.started, staleness.capacity, staleness.held), (5, 6, 0));

    let (status, answer) = harness.send_as(reqwest::Method::DELETE, None, path, None).await;
    assert_eq!((status, &answer["staleness"]), (StatusCode::OK, &Value::Null), "{answer}");
    assert!(harness.status_of("meow").await.staleness.is_none());
    let (status, answer) =
        harness.send_as(reqwest::Method::PUT, None, path, Some(json!({"max_staleness": 0, "batch_size": 0}))).await;
    assert_eq!((status, &answer["staleness"]), (StatusCode::OK, &Value::Null), "batch_size 0 turns it off");
}

#[tokio::test]
async fn bad_staleness_bodies_are_refused_naming_the_field() {
    let harness = serve(&["meow"]).await;
    let path = "/v1/lora_adapters/meow/staleness";
    for (body, field) in [
        (json!({"max_staleness": -1, "batch_size": 2}), "max_staleness"),
        (json!({"max_staleness": 1.5, "batch_size": 2}), "max_staleness"),
        (json!({"max_staleness": 1, "batch_size": 4_294_967_296_u64}), "batch_size"),
        (json!({"max_staleness": 1, "batch_size": 2_000_000}), "batch_size"),
        (json!({"max_staleness": 2_000_000, "batch_size": 1}), "max_staleness"),
        (json!({"batch_size": 2}), "max_staleness"),
        (json!({"max_staleness": 1}), "batch_size"),
        (json!({"max_staleness": 1, "batch_size": 2, "batch": 3}), "batch"),
    ] {
        let (status, answer) = harness.send_as(reqwest::Method::PUT, None, path, Some(body.clone())).await;
        assert_eq!((status, &answer["error"]["param"]), (StatusCode::BAD_REQUEST, &json!(field)), "{body}: {answer}");
    }
    assert!(harness.status_of("meow").await.staleness.is_none(), "nothing was set");
    let body = json!({"max_staleness": 1, "batch_size": 2});
    let (status, _) =
        harness.send_as(reqwest::Method::PUT, None, "/v1/lora_adapters/ghost/staleness", Some(body)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn streamed_choices_say_which_version_produced_their_tokens() {
    let harness = serve(&["meow"]).await;
    // 6 tokens: the scripted engine emits 3, then waits; a keep-mode swap stops it and it continues on version 2.
    let body = json!({"model": "meow", "prompt": [1, 2], "max_tokens": 6, "stream": true});
    let request = harness.client.post(harness.url("/v1/completions")).json(&body);
    let streamed = tokio::spawn(async move { request.send().await.expect("send").text().await.expect("body") });
    eventually("the request produced its first tokens", || async { harness.status_of("meow").await.running == 1 })
        .await;
    let name = AdapterName::parse("meow").expect("name");
    let swap = harness
        .coordinator
        .swap_adapter(
            &name,
            AdapterSource::trusted(PathBuf::from("/a/meow-2")),
            PauseMode::Keep,
            KvPolicy::Recompute,
            None,
        )
        .await
        .expect("swaps");
    assert_eq!(swap.installed.version, AdapterVersion(2));
    let chunks = sse_chunks(&streamed.await.expect("joined"));
    let mut tokens_by_version: Vec<(u64, usize)> = Vec::new();
    for chunk in &chunks {
        let choice = &chunk["choices"][0];
        let count = choice["token_ids"].as_array().expect("token_ids").len();
        let version = choice["lora_version"].as_u64().expect("every streamed choice says its version");
        match tokens_by_version.last_mut() {
            _ if count == 0 => {}
            Some((last, tokens)) if *last == version => *tokens += count,
            _ => tokens_by_version.push((version, count)),
        }
    }
    assert_eq!(tokens_by_version, vec![(1, 3), (2, 3)], "{chunks:?}");
    let last = &chunks.last().expect("chunks")["choices"][0];
    assert_eq!(segment_versions(last), vec![1, 2]);
}

fn two_tenants() -> Keyring {
    let tenants =
        TenantKeys::parse(r#"{"k-a": {"adapters": ["meow"], "control": true}, "k-b": {"adapters": ["meow"]}}"#)
            .expect("valid");
    Keyring::new(None, Some(Key::parse("k-admin").expect("key")), tenants).expect("keys")
}

#[tokio::test]
async fn a_finished_request_is_answered_to_its_sender_and_the_admin_only() {
    let config = CoordinatorConfig { auth: two_tenants(), ..CoordinatorConfig::default() };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["meow"]).await;
    let response = harness
        .client
        .post(harness.url("/v1/completions"))
        .bearer_auth("k-a")
        .header("X-Request-Id", "prov-1")
        .json(&json!({"model": "meow", "prompt": [1], "max_tokens": 2, "n": 2}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::OK);
    let completion: Value = response.json().await.expect("json");
    let path = "/v1/requests/prov-1";
    let (status, answer) = harness.send_as(reqwest::Method::GET, Some("k-a"), path, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!((&answer["request_id"], &answer["model"]), (&json!("prov-1"), &json!("meow")));
    let sequences = answer["sequences"].as_array().expect("sequences");
    assert_eq!(sequences.len(), 2);
    for (sequence, choice) in sequences.iter().zip(completion["choices"].as_array().expect("choices")) {
        assert_eq!(sequence["segments"], choice["segments"]);
        assert_eq!(sequence["finish_reason"], choice["finish_reason"]);
        assert_eq!(sequence["num_tokens"], choice["token_ids"].as_array().expect("ids").len());
    }
    assert_eq!(harness.send_as(reqwest::Method::GET, Some("k-admin"), path, None).await.0, StatusCode::OK);
    let (status, answer) = harness.send_as(reqwest::Method::GET, Some("k-b"), path, None).await;
    assert_eq!((status, &answer["error"]["code"]), (StatusCode::NOT_FOUND, &json!("unknown_request")), "{answer}");
    let (status, _) = harness.send_as(reqwest::Method::GET, Some("k-a"), "/v1/requests/never-sent", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The staleness routes are control endpoints: the tenant without control may not set a bound.
    let body = json!({"max_staleness": 0, "batch_size": 1});
    let put =
        |key| harness.send_as(reqwest::Method::PUT, Some(key), "/v1/lora_adapters/meow/staleness", Some(body.clone()));
    assert_eq!(put("k-b").await.0, StatusCode::FORBIDDEN);
    assert_eq!(put("k-a").await.0, StatusCode::OK);
    let policy = harness.status_of("meow").await.staleness.map(|staleness| staleness.policy);
    assert_eq!(policy, Some(StalenessPolicy { max_staleness: 0, batch_size: 1 }));
}
