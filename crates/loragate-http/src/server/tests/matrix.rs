//! The route × key matrix of docs/security.md, row by row: every route of this front, called with the admin key, the
//! API key, a tenant key that may only sample and a tenant key with `control` (and with no key), each on a fresh
//! server, answers the status the matrix says. The tenants own `team-a/*`; `team-b/*` belongs to another tenant.

use loragate_core::testing::{MATRIX_KEYS, matrix_keyring};
use loragate_core::{AdapterRoot, AdapterStore};
use serde_json::json;
use tower::ServiceExt;

use super::*;

/// One row: a call and the status it gets with each key of [`MATRIX_KEYS`]; without a key every row but the open ones is
/// 401.
struct Row {
    method: &'static str,
    path: &'static str,
    body: Option<Value>,
    statuses: [u16; 4],
}

fn row(method: &'static str, path: &'static str, body: Option<Value>, statuses: [u16; 4]) -> Row {
    Row { method, path, body, statuses }
}

const OPEN: [u16; 4] = [200; 4];
const SAMPLE: [u16; 4] = [200, 200, 200, 200];
const FOREIGN_SAMPLE: [u16; 4] = [200, 200, 403, 403];
const CONTROL: [u16; 4] = [200, 403, 403, 200];
const FOREIGN_CONTROL: [u16; 4] = [200, 403, 403, 403];
const ADMIN: [u16; 4] = [200, 403, 403, 403];

fn rows() -> Vec<Row> {
    let completion = |model: &str| json!({"model": model, "prompt": "x", "max_tokens": 2});
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2});
    let named = |name: &str| json!({"lora_name": name});
    let load = |name: &str, path: &str| json!({"lora_name": name, "lora_path": path});
    let swap = |name: &str, path: &str| json!({"lora_name": name, "lora_path": path, "load_inplace": true});
    vec![
        row("GET", "/health", None, OPEN),
        row("GET", "/ready", None, OPEN),
        row("GET", "/metrics", None, OPEN),
        // Sampling: anyone may sample its own adapters and the base model; tenants only theirs, pins included.
        row("POST", "/v1/completions", Some(completion("team-a/policy")), SAMPLE),
        row("POST", "/v1/completions", Some(completion(SERVED_NAME)), SAMPLE),
        row("POST", "/v1/completions", Some(completion("team-a/policy@1")), SAMPLE),
        row("POST", "/v1/completions", Some(completion("team-b/policy")), FOREIGN_SAMPLE),
        row("POST", "/v1/completions", Some(completion("team-b/policy@1")), FOREIGN_SAMPLE),
        row("POST", "/v1/chat/completions", Some(chat("team-a/policy")), SAMPLE),
        row("POST", "/v1/chat/completions", Some(chat("team-b/policy")), FOREIGN_SAMPLE),
        row(
            "POST",
            "/inference/v1/generate",
            Some(json!({"model": "team-a/policy", "token_ids": [1, 2], "sampling_params": {"max_tokens": 2}})),
            SAMPLE,
        ),
        row(
            "POST",
            "/inference/v1/generate",
            Some(json!({"model": "team-b/policy", "token_ids": [1, 2], "sampling_params": {"max_tokens": 2}})),
            FOREIGN_SAMPLE,
        ),
        row(
            "POST",
            "/generate",
            Some(json!({"input_ids": [1, 2], "lora_path": "team-a/policy", "sampling_params": {"max_new_tokens": 2}})),
            SAMPLE,
        ),
        row(
            "POST",
            "/generate",
            Some(json!({"input_ids": [1, 2], "lora_path": "team-b/policy", "sampling_params": {"max_new_tokens": 2}})),
            FOREIGN_SAMPLE,
        ),
        row("POST", "/tokenize", Some(json!({"model": SERVED_NAME, "prompt": "x"})), SAMPLE),
        row("POST", "/detokenize", Some(json!({"model": SERVED_NAME, "tokens": [120]})), SAMPLE),
        row("GET", "/v1/models", None, SAMPLE),
        row("GET", "/get_server_info", None, SAMPLE),
        row("GET", "/server_info", None, SAMPLE),
        row("GET", "/is_paused", None, SAMPLE),
        row("POST", "/skyrl/v1/wait_lora_unpaused", Some(named("team-a/policy")), SAMPLE),
        row("POST", "/skyrl/v1/wait_lora_unpaused", Some(named("team-b/policy")), FOREIGN_SAMPLE),
        row("GET", "/v1/lora_adapters/team-a%2Fpolicy", None, SAMPLE),
        row("GET", "/v1/lora_adapters/team-b%2Fpolicy", None, FOREIGN_SAMPLE),
        row("GET", "/v1/requests/no-such-request", None, [404; 4]),
        // Control of one's own adapters: the admin key, and a tenant key with control.
        row("POST", "/skyrl/v1/abort_lora_requests", Some(named("team-a/policy")), CONTROL),
        row("POST", "/skyrl/v1/abort_lora_requests", Some(named("team-b/policy")), FOREIGN_CONTROL),
        row("POST", "/skyrl/v1/resume_lora_requests", Some(named("team-a/policy")), CONTROL),
        row("POST", "/skyrl/v1/resume_lora_requests", Some(named("team-b/policy")), FOREIGN_CONTROL),
        row("POST", "/v1/unload_lora_adapter", Some(named("team-a/policy")), CONTROL),
        row("POST", "/v1/unload_lora_adapter", Some(named("team-b/policy")), FOREIGN_CONTROL),
        row("POST", "/unload_lora_adapter", Some(named("team-a/policy")), CONTROL),
        row("POST", "/unload_lora_adapter", Some(named("team-b/policy")), FOREIGN_CONTROL),
        row(
            "PUT",
            "/v1/lora_adapters/team-a%2Fpolicy/staleness",
            Some(json!({"max_staleness": 1, "batch_size": 4})),
            CONTROL,
        ),
        row(
            "PUT",
            "/v1/lora_adapters/team-b%2Fpolicy/staleness",
            Some(json!({"max_staleness": 1, "batch_size": 4})),
            FOREIGN_CONTROL,
        ),
        row("DELETE", "/v1/lora_adapters/team-a%2Fpolicy/staleness", None, CONTROL),
        row("DELETE", "/v1/lora_adapters/team-b%2Fpolicy/staleness", None, FOREIGN_CONTROL),
        // Loads and swaps: the adapter must be the tenant's, and so must the directory it loads from.
        row("POST", "/v1/load_lora_adapter", Some(load("team-a/new", "team-a/step-2")), CONTROL),
        row("POST", "/load_lora_adapter", Some(load("team-a/new", "team-a/step-2")), CONTROL),
        row("POST", "/v1/load_lora_adapter", Some(load("team-a/new", "team-b/step-2")), FOREIGN_CONTROL),
        row("POST", "/v1/load_lora_adapter", Some(load("team-a/new", "team-b/no-such-dir")), [400, 403, 403, 403]),
        row("POST", "/v1/load_lora_adapter", Some(load("team-a/new", "team-a/../team-b/step-2")), FOREIGN_CONTROL),
        row("POST", "/v1/load_lora_adapter", Some(load("team-b/new", "team-b/step-2")), FOREIGN_CONTROL),
        row("POST", "/v1/load_lora_adapter", Some(swap("team-a/policy", "team-a/step-2")), CONTROL),
        row("POST", "/v1/load_lora_adapter", Some(swap("team-a/policy", "team-b/step-2")), FOREIGN_CONTROL),
        row("POST", "/skyrl/v1/load_lora_adapter", Some(load("team-a/policy", "team-a/step-2")), CONTROL),
        row("POST", "/skyrl/v1/load_lora_adapter", Some(load("team-a/policy", "team-b/step-2")), FOREIGN_CONTROL),
        // Pushed versions and their files: control of the adapter (a push that is no multipart body is a 415 once allowed; the
        // scripted adapters have no files on disk: 503 once allowed).
        row("PUT", "/v1/lora_adapters/team-a%2Fpolicy", None, [415, 403, 403, 415]),
        row("PUT", "/v1/lora_adapters/team-b%2Fpolicy", None, [415, 403, 403, 403]),
        row("GET", "/v1/lora_adapters/team-a%2Fpolicy/versions/1/adapter_config.json", None, [503, 403, 403, 503]),
        row("GET", "/v1/lora_adapters/team-b%2Fpolicy/versions/1/adapter_config.json", None, [503, 403, 403, 403]),
        // The whole engine: the admin key only.
        row("POST", "/pause", None, ADMIN),
        row("POST", "/resume", None, ADMIN),
        row("POST", "/pause_generation", None, ADMIN),
        row("POST", "/continue_generation", None, ADMIN),
        row("POST", "/areal_pause_generation", None, ADMIN),
        row("POST", "/areal_continue_generation", None, ADMIN),
        row("POST", "/reset_prefix_cache", None, ADMIN),
        row("POST", "/flush_cache", None, ADMIN),
        row("GET", "/flush_cache", None, ADMIN),
        row("POST", "/abort_request", Some(json!({"rid": "r"})), ADMIN),
        row("POST", "/inference/v1/abort_requests", Some(json!({"request_ids": []})), ADMIN),
        // Not a route: 404 to any valid key, 401 without one.
        row("POST", "/init_broadcaster", Some(json!({})), [404; 4]),
    ]
}

/// An adapter root with `team-a/step-2` and `team-b/step-2`.
fn adapter_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("a temporary directory");
    for dir in ["team-a/step-2", "team-b/step-2"] {
        std::fs::create_dir_all(root.path().join(dir)).expect("mkdir");
        std::fs::write(root.path().join(dir).join("adapter_model.safetensors"), dir).expect("weights");
    }
    root
}

/// A fresh front (authentication on, `team-a/policy` and `team-b/policy` loaded) answering one call.
async fn call(root: &tempfile::TempDir, row: &Row, key: Option<&str>) -> (u16, String) {
    let store = AdapterStore::open(root.path().join(".store"), 1 << 20).expect("an adapter store");
    let mut config = CoordinatorConfig {
        auth: matrix_keyring(),
        adapter_root: Some(AdapterRoot::new(root.path()).expect("root")),
        adapter_store: Some(store),
        ..CoordinatorConfig::default()
    };
    config.reserved_names.push(SERVED_NAME.to_owned());
    let coordinator =
        coordinator_with_adapters(ScriptedEngine::new(HOLD_AFTER), config, &["team-a/policy", "team-b/policy"]).await;
    let template = crate::ChatTemplate::new(CHAT_TEMPLATE, None, None).expect("the test template compiles");
    let front = HttpFront::new(coordinator, SERVED_NAME, Arc::new(ByteCodec)).with_chat_template(template);
    let mut request = http::Request::builder().method(row.method).uri(row.path);
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let request = match &row.body {
        Some(body) => request.header("content-type", "application/json").body(Body::from(body.to_string())),
        None => request.header("content-length", "0").body(Body::empty()),
    };
    let response = router(AppState::new(front)).oneshot(request.expect("a request")).await.expect("infallible");
    let status = response.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(response.into_body()).await.expect("the body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).chars().take(200).collect())
}

#[tokio::test]
async fn every_route_answers_each_key_as_the_matrix_says() {
    let root = adapter_root();
    let mut wrong = Vec::new();
    for row in rows() {
        let open = row.statuses == OPEN && matches!(row.path, "/health" | "/ready" | "/metrics");
        let without_key = if open { 200 } else { 401 };
        let (status, body) = call(&root, &row, None).await;
        if status != without_key {
            wrong.push(format!("{} {} without a key: {status}, not {without_key} ({body})", row.method, row.path));
        }
        for (key, expected) in MATRIX_KEYS.iter().zip(row.statuses) {
            let (status, body) = call(&root, &row, Some(key)).await;
            if status != expected {
                let shown = row.body.as_ref().map(Value::to_string).unwrap_or_default();
                wrong
                    .push(format!("{} {} {shown} with {key}: {status}, not {expected} ({body})", row.method, row.path));
            }
        }
    }
    assert!(wrong.is_empty(), "cells that differ from the matrix:\n{}", wrong.join("\n"));
}

/// POSTs `body` as JSON with `key` as bearer token; returns the status and the JSON answer.
async fn post_with_key(harness: &Harness, key: &str, path: &str, body: Value) -> (StatusCode, Value) {
    let response = harness.client.post(harness.url(path)).bearer_auth(key).json(&body).send().await.expect("send");
    (response.status(), response.json().await.expect("a JSON answer"))
}

#[tokio::test]
async fn a_tenant_loading_or_swapping_from_another_tenants_directory_is_refused_and_changes_nothing() {
    let root = adapter_root();
    #[cfg(unix)]
    std::os::unix::fs::symlink(root.path().join("team-b/step-2"), root.path().join("team-a/link")).expect("symlink");
    let config = CoordinatorConfig {
        auth: matrix_keyring(),
        adapter_root: Some(AdapterRoot::new(root.path()).expect("root")),
        ..CoordinatorConfig::default()
    };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["team-a/policy"]).await;
    let mut refused_paths = vec!["team-b/step-2", "team-b/no-such-dir", "team-ab/x", "/etc", "team-a/../team-b/step-2"];
    if cfg!(unix) {
        refused_paths.push("team-a/link");
    }
    for path in refused_paths {
        for (route, body) in [
            ("/v1/load_lora_adapter", json!({"lora_name": "team-a/new", "lora_path": path})),
            ("/v1/load_lora_adapter", json!({"lora_name": "team-a/policy", "lora_path": path, "load_inplace": true})),
            ("/skyrl/v1/load_lora_adapter", json!({"lora_name": "team-a/policy", "lora_path": path})),
        ] {
            let (status, refused) = post_with_key(&harness, "k-a-control", route, body).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{route} from {path}: {refused}");
            assert_eq!(refused["error"]["param"], "lora_path", "{refused}");
            let message = refused["error"]["message"].as_str().expect("a message");
            assert_eq!(
                message,
                format!(
                    "lora_path: {path:?} is outside the directories this key may load adapters from (team-a/*, under \
                     the adapter root)"
                ),
                "the same words whether or not the path exists"
            );
        }
    }
    let adapters = harness.coordinator.list_adapters().await;
    assert_eq!(adapters.len(), 1, "no adapter was created: {adapters:?}");
    let policy = harness.status_of("team-a/policy").await;
    assert!(!policy.paused, "a refused swap leaves the gate open");
    assert_eq!(policy.version.0, 1, "and the weights as they were");

    // Its own directory loads, and the admin key loads from anywhere under the root.
    let own = json!({"lora_name": "team-a/new", "lora_path": "team-a/step-2"});
    assert_eq!(post_with_key(&harness, "k-a-control", "/v1/load_lora_adapter", own).await.0, StatusCode::OK);
    let any = json!({"lora_name": "team-a/policy", "lora_path": "team-b/step-2", "load_inplace": true});
    assert_eq!(post_with_key(&harness, "k-admin", "/v1/load_lora_adapter", any).await.0, StatusCode::OK);
}
