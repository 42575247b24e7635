//! The HTTP front under hostile or careless callers (issue 13): held completions keep only their parsed form, a
//! body that never completes fails in time, keys decide who may do what, browsers of other origins and non-JSON
//! bodies are refused, and overload is a 429 naming the limit.

use std::sync::atomic::Ordering;

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use loragate_core::testing::DropTrackedBytes;
use loragate_core::{Key, Keyring, Limits, TenantKeys};
use serde_json::json;
use tower::ServiceExt;

use super::*;

/// The router of a front over `config`, called in-process (no socket copies the body), and its coordinator.
async fn in_process(config: CoordinatorConfig) -> (Router, Coordinator) {
    let coordinator = coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), config, &["meow"]).await;
    let front = HttpFront::new(coordinator.clone(), SERVED_NAME, Arc::new(ByteCodec));
    (router(AppState::new(front)), coordinator)
}

fn completion_call(body: Body) -> http::Request<Body> {
    http::Request::post("/v1/completions").header("content-type", "application/json").body(body).expect("request")
}

#[tokio::test]
async fn a_held_completion_keeps_its_parsed_form_not_its_body() {
    let (app, coordinator) = in_process(CoordinatorConfig::default()).await;
    let meow = loragate_core::AdapterName::parse("meow").expect("name");
    coordinator.abort(&meow).await.expect("pause");
    // A small completion padded with 1 MiB of whitespace the parsed form does not keep.
    let json = format!("{}{}", json!({"model": "meow", "prompt": "x", "max_tokens": 2}), " ".repeat(1 << 20));
    let (tracked, dropped) = DropTrackedBytes::new(json.into_bytes());
    let body = Bytes::from_owner(tracked);
    let call = tokio::spawn(app.oneshot(completion_call(Body::from(body))));

    let adapter = coordinator.lora(&meow).expect("loaded");
    eventually("the completion is held", || async { adapter.status().await.expect("status").held == 1 }).await;
    assert!(dropped.load(Ordering::Acquire), "a held completion keeps its body's bytes");

    coordinator.resume(&meow, None).await.expect("resume");
    let response = call.await.expect("task").expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_body_that_never_completes_is_408_by_the_gate_deadline_and_counted() {
    let config = CoordinatorConfig { max_gate_hold: Duration::from_millis(200), ..CoordinatorConfig::default() };
    let (app, coordinator) = in_process(config).await;
    let trickle = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"{\"model\"")) })
        .chain(futures::stream::pending());
    let started = Instant::now();
    let response = app.oneshot(completion_call(Body::from_stream(trickle))).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(started.elapsed() >= Duration::from_millis(150), "{:?}", started.elapsed());
    assert_eq!(coordinator.metrics().body_read_timeouts("http"), 1);
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.expect("body").to_bytes())
        .expect("an error object");
    assert_eq!(body["error"]["code"], "body_timeout");
}

fn keyring() -> Keyring {
    let tenants = TenantKeys::parse(r#"{"k-team-a": {"adapters": ["team-a/*"], "control": true}}"#).expect("valid");
    let key = |raw| Key::parse(raw).expect("key");
    Keyring::new(Some(key("k-api")), Some(key("k-admin")), tenants).expect("keys")
}

impl Harness {
    /// POSTs `body` as JSON with `key` as bearer token; returns the status and the JSON answer.
    async fn post_as(&self, key: &str, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self.client.post(self.url(path)).bearer_auth(key).json(&body).send().await.expect("send");
        (response.status(), response.json().await.expect("a JSON answer"))
    }
}

#[tokio::test]
async fn keys_decide_who_may_use_which_endpoint_and_adapter() {
    let config = CoordinatorConfig { auth: keyring(), ..CoordinatorConfig::default() };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["team-a/policy", "team-b/policy"]).await;
    let completion = |model: &str| json!({"model": model, "prompt": "x", "max_tokens": 2});
    let abort = |name: &str| json!({"lora_name": name});

    // No key or a wrong one: 401 with a Bearer challenge; health and metrics stay open.
    let response = harness
        .client
        .post(harness.url("/v1/completions"))
        .json(&completion("team-a/policy"))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    assert_eq!(
        harness.post_as("k-wrong", "/v1/completions", completion("team-a/policy")).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(harness.get("/health").await.0, StatusCode::OK);
    let metrics = harness.client.get(harness.url("/metrics")).send().await.expect("metrics");
    assert_eq!(metrics.status(), StatusCode::OK);

    // The API key samples anything and controls nothing; endpoints nobody classified need the admin key.
    assert_eq!(harness.post_as("k-api", "/v1/completions", completion("team-b/policy")).await.0, StatusCode::OK);
    let (status, refused) = harness.post_as("k-api", "/skyrl/v1/abort_lora_requests", abort("team-a/policy")).await;
    assert_eq!((status, &refused["error"]["code"]), (StatusCode::FORBIDDEN, &json!("permission_denied")));
    assert_eq!(harness.post_as("k-api", "/pause", json!({})).await.0, StatusCode::FORBIDDEN);

    // A tenant samples and controls its own adapters, samples the base model, and sees only its own adapters.
    assert_eq!(harness.post_as("k-team-a", "/v1/completions", completion("team-a/policy")).await.0, StatusCode::OK);
    assert_eq!(harness.post_as("k-team-a", "/v1/completions", completion(SERVED_NAME)).await.0, StatusCode::OK);
    let (status, refused) = harness.post_as("k-team-a", "/v1/completions", completion("team-b/policy")).await;
    assert_eq!((status, &refused["error"]["param"]), (StatusCode::FORBIDDEN, &json!("model")));
    let (status, _) = harness.post_as("k-team-a", "/skyrl/v1/abort_lora_requests", abort("team-a/policy")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        harness.post_as("k-team-a", "/skyrl/v1/resume_lora_requests", abort("team-a/policy")).await.0,
        StatusCode::OK
    );
    let (status, refused) = harness.post_as("k-team-a", "/v1/unload_lora_adapter", abort("team-b/policy")).await;
    assert_eq!((status, &refused["error"]["param"]), (StatusCode::FORBIDDEN, &json!("lora_name")));
    let models: Value = harness
        .client
        .get(harness.url("/v1/models"))
        .bearer_auth("k-team-a")
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    let ids: Vec<&str> = models["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, [SERVED_NAME, "team-a/policy"]);

    // The admin key does everything.
    let (status, _) = harness.post_as("k-admin", "/v1/unload_lora_adapter", abort("team-b/policy")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!harness.status_of("team-a/policy").await.paused, "nothing was left paused");
}

#[tokio::test]
async fn extra_routes_pass_the_guard_but_authenticate_themselves_and_the_compat_endpoints_need_their_keys() {
    let config = CoordinatorConfig { auth: keyring(), ..CoordinatorConfig::default() };
    let extra = Router::new().route("/api/v1/healthz", axum::routing::get(|| async { "ok" }));
    let harness =
        serve_front(ScriptedEngine::new(HOLD_AFTER), config, &["team-a/policy"], |front| front.with_routes(extra))
            .await;
    let extra = |origin: Option<&'static str>| {
        let request = harness.client.get(harness.url("/api/v1/healthz"));
        let request = match origin {
            Some(origin) => request.header("Origin", origin),
            None => request,
        };
        async move { request.send().await.expect("send").status() }
    };
    assert_eq!(extra(None).await, StatusCode::OK, "an extra route brings its own authentication (this one: none)");
    assert_eq!(extra(Some("https://evil.example")).await, StatusCode::FORBIDDEN, "but passes the guard");

    let generate = json!({"input_ids": [1, 2], "lora_path": "team-a/policy", "sampling_params": {"max_new_tokens": 2}});
    assert_eq!(harness.post_as("k-api", "/generate", generate.clone()).await.0, StatusCode::OK);
    let tokens = json!({"model": SERVED_NAME, "prompt": "x"});
    assert_eq!(harness.post_as("k-api", "/tokenize", tokens).await.0, StatusCode::OK);
    let abort = harness.client.post(harness.url("/abort_request")).bearer_auth("k-api").json(&json!({"rid": "r"}));
    assert_eq!(abort.send().await.expect("send").status(), StatusCode::FORBIDDEN, "aborts across adapters: admin");
    let (status, refused) = harness.post_as("k-wrong", "/inference/v1/generate", json!({"token_ids": [1]})).await;
    assert_eq!((status, &refused["error"]["code"]), (StatusCode::UNAUTHORIZED, &json!("unauthenticated")));
    for cache in ["/reset_prefix_cache", "/flush_cache"] {
        let (status, _) = harness.post_as("k-team-a", cache, json!({})).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{cache} is engine-wide: a tenant key may not flush it");
        let response = harness.client.post(harness.url(cache)).bearer_auth("k-admin").send().await.expect("send");
        assert_eq!(response.status(), StatusCode::OK, "{cache} with the admin key");
    }
    let (status, _) = harness.post_as("k-api", "/init_broadcaster", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "an unknown path is 404 to any valid key (clients probe with theirs)");
    let unknown = harness.client.post(harness.url("/init_broadcaster")).json(&json!({})).send().await.expect("send");
    assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED, "and 401 without one");
}

#[tokio::test]
async fn browser_requests_from_other_origins_and_non_json_bodies_are_refused() {
    let harness = serve(&["meow"]).await;
    let abort = harness.url("/skyrl/v1/abort_lora_requests");
    let body = json!({"lora_name": "meow"}).to_string();
    let cases = [
        // A form on another site can post text/plain without a preflight.
        (harness.client.post(&abort).header("content-type", "text/plain").body(body.clone()), 415),
        (harness.client.post(&abort).body(body.clone()), 415),
        (harness.client.post(&abort).header("origin", "https://evil.example").json(&json!({"lora_name": "meow"})), 403),
        (harness.client.post(&abort).header("sec-fetch-site", "cross-site").json(&json!({"lora_name": "meow"})), 403),
        (harness.client.get(harness.url("/v1/models")).header("origin", "http://rebound.example:8000"), 403),
    ];
    for (request, status) in cases {
        let response = request.send().await.expect("send");
        assert_eq!(response.status().as_u16(), status);
        let answer: Value = response.json().await.expect("an error object");
        assert!(answer["error"]["message"].is_string(), "{answer}");
    }
    assert!(!harness.status_of("meow").await.paused, "no refused request paused the adapter");
    // A POST without a body needs no content type (it is refused for its missing field, not its type).
    let response = harness.client.post(&abort).header("content-length", "0").send().await.expect("send");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let typed_in_a_browser = harness.client.get(harness.url("/health")).header("sec-fetch-site", "none");
    assert_eq!(typed_in_a_browser.send().await.expect("send").status(), StatusCode::OK);
}

#[tokio::test]
async fn overload_is_429_with_retry_after_naming_the_limit() {
    let config = CoordinatorConfig {
        limits: Limits { max_in_flight_per_adapter: Some(1), ..Limits::default() },
        ..CoordinatorConfig::default()
    };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["meow", "woof"]).await;
    let running = harness.spawn_completion(json!({"model": "meow", "prompt": "x", "max_tokens": 1000}), "long-1");
    eventually("meow is at its cap", || async { harness.status_of("meow").await.in_flight == 1 }).await;
    let response = harness
        .client
        .post(harness.url("/v1/completions"))
        .json(&json!({"model": "meow", "prompt": "x", "max_tokens": 2}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "1");
    let answer: Value = response.json().await.expect("json");
    assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("--max-in-flight-per-adapter")), "{answer}");
    assert_eq!((&answer["error"]["type"], &answer["error"]["param"]), (&json!("rate_limit_error"), &json!("model")));
    let (status, _) = harness.post("/v1/completions", json!({"model": "woof", "prompt": "x", "max_tokens": 2})).await;
    assert_eq!(status, StatusCode::OK, "woof has its own budget");
    harness.pause("meow").await;
    let (status, aborted) = running.await.expect("task");
    assert_eq!((status, &aborted["choices"][0]["finish_reason"]), (StatusCode::OK, &json!("abort")));
    harness.resume("meow").await;
}

/// A server over `config` and `connections`; returns its address and coordinator.
async fn serve_connections(
    config: CoordinatorConfig,
    connections: loragate_net::ConnectionLimits,
) -> (std::net::SocketAddr, Coordinator, oneshot::Sender<()>) {
    let coordinator = coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), config, &["meow"]).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let front =
        HttpFront::new(coordinator.clone(), SERVED_NAME, Arc::new(ByteCodec)).with_connection_limits(connections);
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(serve_http(listener, front, std::future::pending(), async move {
        let _ = stopped.await;
    }));
    (address, coordinator, stop)
}

/// Reads until the server closes the connection (or `limit` passes); returns what was read.
async fn read_until_closed(stream: &mut tokio::net::TcpStream, limit: Duration) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut received = Vec::new();
    let closed = tokio::time::timeout(limit, stream.read_to_end(&mut received)).await;
    closed.ok().map(|_| String::from_utf8_lossy(&received).into_owned())
}

#[tokio::test]
async fn idle_and_slow_header_connections_are_closed_but_held_requests_and_long_polls_are_not() {
    use tokio::io::AsyncWriteExt;

    let limits = loragate_net::ConnectionLimits::new(64, Duration::from_millis(200), Duration::from_millis(400));
    let (address, coordinator, _stop) = serve_connections(CoordinatorConfig::default(), limits.clone()).await;

    // Silent and slow-header connections are closed by the header-read timeout.
    let mut silent = tokio::net::TcpStream::connect(address).await.expect("connect");
    let mut slow = tokio::net::TcpStream::connect(address).await.expect("connect");
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n").await.expect("half a head");
    let started = Instant::now();
    assert!(read_until_closed(&mut silent, Duration::from_secs(10)).await.is_some(), "a silent connection is closed");
    assert!(read_until_closed(&mut slow, Duration::from_secs(10)).await.is_some(), "a slow header is closed");
    assert!(started.elapsed() >= Duration::from_millis(150), "{:?}", started.elapsed());

    // A completion held at a paused gate for longer than the idle timeout keeps its connection.
    let meow = loragate_core::AdapterName::parse("meow").expect("name");
    coordinator.abort(&meow).await.expect("pause");
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    let url = format!("http://{address}");
    let held = tokio::spawn({
        let request = client
            .post(format!("{url}/v1/completions"))
            .json(&json!({"model": "meow", "prompt": "x", "max_tokens": 2}));
        async move { request.send().await.map(|response| response.status()) }
    });
    let long_poll = tokio::spawn({
        let request = client
            .post(format!("{url}/skyrl/v1/wait_lora_unpaused"))
            .json(&json!({"lora_name": "meow", "timeout_s": 1.0}));
        async move { request.send().await.expect("send").json::<Value>().await.expect("json") }
    });
    let adapter = coordinator.lora(&meow).expect("loaded");
    eventually("held and waiting", || async {
        let status = adapter.status().await.expect("status");
        status.held == 1 && status.waiting == 1
    })
    .await;
    assert_eq!(long_poll.await.expect("task"), json!({"paused": true}), "the long-poll ran to its own timeout");
    coordinator.resume(&meow, None).await.expect("resume");
    assert_eq!(held.await.expect("task").expect("the held request's connection stayed open"), StatusCode::OK);
    eventually("idle keep-alive connections are closed too", || async { limits.open_connections() == 0 }).await;
}

#[tokio::test]
async fn past_the_connection_cap_new_connections_wait_for_a_free_slot() {
    let limits = loragate_net::ConnectionLimits::new(2, Duration::from_millis(300), Duration::from_secs(60));
    let (address, _coordinator, _stop) = serve_connections(CoordinatorConfig::default(), limits.clone()).await;
    let _hogs: Vec<tokio::net::TcpStream> =
        futures::future::join_all((0..2).map(|_| tokio::net::TcpStream::connect(address)))
            .await
            .into_iter()
            .map(|hog| hog.expect("connect"))
            .collect();
    eventually("both slots are taken", || async { limits.open_connections() == 2 }).await;
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    let started = Instant::now();
    let health = client.get(format!("http://{address}/health")).send().await.expect("served once a hog is closed");
    assert_eq!(health.status(), StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(200), "it waited for a slot: {:?}", started.elapsed());
}
