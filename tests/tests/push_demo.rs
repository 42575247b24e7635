//! Pushing adapter versions to a real demo server (issue 31): `PUT /v1/lora_adapters/{name}` with a real
//! `multipart/form-data` body (built here, and sent by `curl -F` where curl is installed) and `PushLoraAdapter` with
//! the Rust client, each sampled at its new version; refusals that name the field and keep the old version served;
//! a push dropped midway; concurrent pushes to one name.

use futures::StreamExt;
use loragate_client::{AdapterPayload, SwapOptions, TrainerClient};
use loragate_core::testing::eventually_within as eventually;
use loragate_tests::{DemoServer, PATIENCE, sample_request};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Digest;

const BOUNDARY: &str = "loragate-push-test-boundary-7d3f";

/// The demo adapter `name`'s two files.
fn demo_files(demo: &DemoServer, name: &str) -> (Vec<u8>, Vec<u8>) {
    let dir = demo.adapter_root.join(name);
    let config = std::fs::read(dir.join("adapter_config.json")).expect("config");
    let weights = std::fs::read(dir.join("adapter_model.safetensors")).expect("weights");
    (config, weights)
}

/// `weights` with the lowest mantissa byte of its first floats set from `variant`: another valid, finite adapter.
fn variant(weights: &[u8], variant: u8) -> Vec<u8> {
    let header_len = u64::from_le_bytes(weights[..8].try_into().expect("8 bytes")) as usize;
    let mut changed = weights.to_vec();
    for float in 0..4 {
        changed[8 + header_len + 4 * float] = variant;
    }
    changed
}

fn sha_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A `multipart/form-data` body with the two parts (in this order), as `curl -F` builds it.
fn multipart(parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, bytes) in parts {
        body.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

async fn put(demo: &DemoServer, name: &str, query: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .put(demo.http_url(&format!("/v1/lora_adapters/{name}{query}")))
        .header("content-type", format!("multipart/form-data; boundary={BOUNDARY}"))
        .body(body)
        .send()
        .await
        .expect("the push is answered");
    let status = response.status();
    (status, response.json().await.expect("a JSON answer"))
}

/// Samples `model` over HTTP; the version of its tokens.
async fn http_sample_version(demo: &DemoServer, model: &str) -> u64 {
    let answer: Value = reqwest::Client::new()
        .post(demo.http_url("/v1/completions"))
        .json(&json!({"model": model, "prompt": "hi", "max_tokens": 3}))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    answer["choices"][0]["segments"][0]["lora_version"].as_u64().unwrap_or_else(|| panic!("segments: {answer}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_multipart_push_is_served_at_its_new_version_and_its_files_come_back() {
    let demo = DemoServer::start().await;
    let (config, weights) = demo_files(&demo, "meow");
    let body = multipart(&[("adapter_config.json", &config), ("adapter_model.safetensors", &weights)]);
    let (status, answer) = put(&demo, "purr", &format!("?mode=abort&sha256={}", sha_hex(&weights)), body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["status"], "ok");
    assert_eq!((answer["lora_name"].as_str(), answer["version"].as_u64()), (Some("purr"), Some(1)), "{answer}");
    assert_eq!(answer["sha256"].as_str(), Some(sha_hex(&weights).as_str()));
    assert_eq!(answer["bytes"].as_u64(), Some(weights.len() as u64));
    assert_eq!(http_sample_version(&demo, "purr").await, 1);

    // A second version under the same name is a swap.
    let changed = variant(&weights, 7);
    let body = multipart(&[("adapter_config.json", &config), ("adapter_model.safetensors", &changed)]);
    let (status, answer) = put(&demo, "purr", "", body).await;
    assert_eq!((status, answer["version"].as_u64()), (StatusCode::OK, Some(2)), "{answer}");
    assert_eq!(http_sample_version(&demo, "purr").await, 2);

    let state: Value =
        reqwest::get(demo.http_url("/v1/lora_adapters/purr")).await.expect("get").json().await.expect("json");
    assert_eq!(state["version"].as_u64(), Some(2), "{state}");
    assert_eq!(state["sha256"].as_str(), Some(sha_hex(&changed).as_str()), "{state}");
    assert_eq!(state["versions"][0]["source"], "push", "{state}");
    let file = reqwest::get(demo.http_url("/v1/lora_adapters/purr/versions/2/adapter_model.safetensors"))
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes");
    assert_eq!(sha_hex(&file), sha_hex(&changed));
    let config_back = reqwest::get(demo.http_url("/v1/lora_adapters/purr/versions/2/adapter_config.json"))
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes");
    assert_eq!(config_back.as_ref(), config.as_slice());
    let released =
        reqwest::get(demo.http_url("/v1/lora_adapters/purr/versions/1/adapter_model.safetensors")).await.expect("get");
    assert_eq!(released.status(), StatusCode::GONE, "version 1 was released (--retain-versions 1)");
    // Only the served version's files are kept (the released version's are deleted after the push answered).
    let store = demo.server.coordinator().adapter_store().expect("a store");
    eventually("version 1's files are collected", PATIENCE, || async { store.blob_dirs().expect("list").len() == 1 })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_dash_f_pushes_a_version() {
    if std::process::Command::new("curl").arg("--version").output().is_err() {
        eprintln!("curl is not installed: skipped");
        return;
    }
    let demo = DemoServer::start().await;
    let dir = demo.adapter_root.join("woof");
    let url = demo.http_url("/v1/lora_adapters/meow?mode=keep");
    let mut curl = std::process::Command::new("curl");
    curl.args(["-sS", "-X", "PUT", "-F"])
        .arg(format!("adapter_config.json=@{}", dir.join("adapter_config.json").display()))
        .arg("-F")
        .arg(format!("adapter_model.safetensors=@{}", dir.join("adapter_model.safetensors").display()))
        .arg(&url);
    let output = tokio::task::spawn_blocking(move || curl.output()).await.expect("joined").expect("curl runs");
    let answer: Value = serde_json::from_slice(&output.stdout).expect("curl printed JSON");
    let woof_sha = sha_hex(&std::fs::read(dir.join("adapter_model.safetensors")).expect("woof"));
    assert_eq!(answer["version"].as_u64(), Some(2), "{answer}");
    assert_eq!(answer["sha256"].as_str(), Some(woof_sha.as_str()), "{answer}");
    assert_eq!(http_sample_version(&demo, "meow").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_push_with_the_rust_client_is_sampled_at_its_new_version() {
    let demo = DemoServer::start().await;
    let trainer = TrainerClient::connect(format!("http://{}", demo.server.grpc_addr())).await.expect("connects");
    let woof = demo.adapter_root.join("woof");
    let pushed = trainer
        .push_adapter("meow", AdapterPayload::Directory(woof.to_path_buf()), SwapOptions::default())
        .await
        .expect("pushed");
    assert_eq!(pushed.version, 2);
    let woof_sha = sha_hex(&std::fs::read(woof.join("adapter_model.safetensors")).expect("woof"));
    assert_eq!(pushed.sha256, woof_sha);
    let response = demo.sampler().sample(sample_request("meow", 4)).await.expect("samples").into_inner();
    let segments = &response.sequences[0].segments;
    assert_eq!(segments.iter().map(|segment| segment.lora_version).collect::<Vec<_>>(), vec![2], "{segments:?}");
    assert_eq!(demo.status("meow").await.sha256, woof_sha);
}

/// A push that must be refused: what it is, its query, its body, the status and the field named.
type Refusal = (&'static str, &'static str, Vec<u8>, StatusCode, Option<&'static str>);

/// Each refused push: the status, the field named (HTTP `param`), and meow still at version 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pushes_are_refused_naming_the_field_and_the_old_version_stays_served() {
    let demo = DemoServer::start().await;
    let (config, weights) = demo_files(&demo, "meow");
    let other_rank = String::from_utf8(config.clone()).expect("utf8").replacen("\"r\": ", "\"r\": 1", 1);
    let mut pickle = vec![0x80, 0x04, 0x95];
    pickle.extend_from_slice(&weights[..200]);
    let missing_b = {
        // The header with one module's lora_B moved to another module (same length): the first has no B.
        let header_len = u64::from_le_bytes(weights[..8].try_into().expect("8")) as usize;
        let header = String::from_utf8(weights[8..8 + header_len].to_vec()).expect("utf8 header");
        let renamed = header.replacen("down_proj.lora_B", "down_prxj.lora_B", 1);
        let mut file = weights.clone();
        file[8..8 + header_len].copy_from_slice(renamed.as_bytes());
        file
    };
    let parts = |weights: &[u8]| multipart(&[("adapter_config.json", &config), ("adapter_model.safetensors", weights)]);
    let cases: Vec<Refusal> = vec![
        ("sha mismatch", "?sha256=", parts(&weights), StatusCode::BAD_REQUEST, Some("sha256")),
        (
            "truncated",
            "",
            parts(&weights[..weights.len() - 100]),
            StatusCode::BAD_REQUEST,
            Some("adapter_model.safetensors"),
        ),
        ("pickle", "", parts(&pickle), StatusCode::UNSUPPORTED_MEDIA_TYPE, None),
        ("garbage", "", parts(b"definitely not tensors, just some words"), StatusCode::UNSUPPORTED_MEDIA_TYPE, None),
        ("missing B", "", parts(&missing_b), StatusCode::BAD_REQUEST, Some("adapter_model.safetensors")),
        (
            "wrong shapes",
            "",
            multipart(&[("adapter_config.json", other_rank.as_bytes()), ("adapter_model.safetensors", &weights)]),
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
        ),
        (
            "weights first",
            "",
            multipart(&[("adapter_model.safetensors", &weights)]),
            StatusCode::BAD_REQUEST,
            Some("adapter_model.safetensors"),
        ),
    ];
    for (what, query, body, status, param) in cases {
        let query = if query == "?sha256=" { format!("?sha256={}", "ab".repeat(32)) } else { query.to_owned() };
        let (got, answer) = put(&demo, "meow", &query, body).await;
        assert_eq!(got, status, "{what}: {answer}");
        if what == "missing B" {
            assert!(
                answer["error"]["message"].as_str().is_some_and(|m| m.contains("down_proj has no lora_B")),
                "{answer}"
            );
        }
        if let Some(param) = param {
            assert_eq!(answer["error"]["param"].as_str(), Some(param), "{what}: {answer}");
        }
        assert_eq!(demo.status("meow").await.version, 1, "{what} changed the served version");
    }
    for name in ["a..b", "x@3"] {
        let (got, answer) = put(&demo, name, "", parts(&weights)).await;
        assert_eq!((got, answer["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("lora_name")), "{answer}");
    }
    let not_multipart = reqwest::Client::new()
        .put(demo.http_url("/v1/lora_adapters/meow"))
        .header("content-type", "application/octet-stream")
        .body(weights.clone())
        .send()
        .await
        .expect("answered");
    assert_eq!(not_multipart.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(http_sample_version(&demo, "meow").await, 1);
    let store = demo.server.coordinator().adapter_store().expect("a store");
    assert_eq!((store.pending_uploads().expect("tmp"), store.blob_dirs().expect("blobs").len()), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_push_is_refused_before_its_body_ends() {
    // The demo adapters (269,184 bytes) still fit; the pushed file's header announces 1,280,000 bytes of tensors.
    let demo = DemoServer::start_with(|config| config.engine.max_adapter_bytes = 300_000).await;
    let (config, _) = demo_files(&demo, "meow");
    let module = "base_model.model.model.layers.0.self_attn.q_proj";
    let header = format!(
        r#"{{"{module}.lora_A.weight":{{"dtype":"F32","shape":[8,20000],"data_offsets":[0,640000]}},"{module}.lora_B.weight":{{"dtype":"F32","shape":[20000,8],"data_offsets":[640000,1280000]}}}}"#
    );
    let mut weights = (header.len() as u64).to_le_bytes().to_vec();
    weights.extend_from_slice(header.as_bytes());
    weights.extend(std::iter::repeat_n(0u8, 32 << 10));
    let mut start =
        format!("--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"adapter_config.json\"\r\n\r\n").into_bytes();
    start.extend_from_slice(&config);
    start.extend_from_slice(
        format!("\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"adapter_model.safetensors\"\r\n\r\n")
            .as_bytes(),
    );
    start.extend_from_slice(&weights);
    // The body never ends: only a refusal made before reading it all can be answered.
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(start) }).chain(futures::stream::pending());
    let response = tokio::time::timeout(
        PATIENCE,
        reqwest::Client::new()
            .put(demo.http_url("/v1/lora_adapters/meow"))
            .header("content-type", format!("multipart/form-data; boundary={BOUNDARY}"))
            .body(reqwest::Body::wrap_stream(body))
            .send(),
    )
    .await
    .expect("answered before the body ended")
    .expect("an answer");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let answer: Value = response.json().await.expect("json");
    assert!(answer["error"]["message"].as_str().is_some_and(|message| message.contains("--max-adapter-bytes")));
    let store = demo.server.coordinator().adapter_store().expect("a store");
    eventually("no push is pending", PATIENCE, || async { store.pending_uploads().expect("tmp") == 0 }).await;
    assert_eq!(demo.status("meow").await.version, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_whose_client_goes_away_midway_leaves_nothing() {
    let demo = DemoServer::start().await;
    let (config, weights) = demo_files(&demo, "meow");
    let header = loragate_proto::v1::PushLoraAdapterHeader {
        lora_name: "meow".into(),
        adapter_config_json: String::from_utf8(config).expect("utf8"),
        ..Default::default()
    };
    use loragate_proto::v1::push_lora_adapter_request::Part;
    let first = [
        loragate_proto::v1::PushLoraAdapterRequest { part: Some(Part::Header(header)) },
        loragate_proto::v1::PushLoraAdapterRequest {
            part: Some(Part::Chunk(weights[..weights.len() / 2].to_vec().into())),
        },
    ];
    let messages = futures::stream::iter(first).chain(futures::stream::pending());
    let mut control = demo.control();
    let store = demo.server.coordinator().adapter_store().expect("a store").clone();
    let push = tokio::spawn(async move { control.push_lora_adapter(messages).await });
    eventually("the push is being received", PATIENCE, || async { store.pending_uploads().expect("tmp") == 1 }).await;
    push.abort();
    eventually("no push is pending", PATIENCE, || async { store.pending_uploads().expect("tmp") == 0 }).await;
    assert!(store.blob_dirs().expect("blobs").is_empty());
    let status = demo.status("meow").await;
    assert_eq!((status.version, status.paused, status.in_flight), (1, false, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_pushes_to_one_name_each_get_their_own_version() {
    let demo = DemoServer::start_with(|config| config.adapters.retain_versions = 32).await;
    let (config, weights) = demo_files(&demo, "meow");
    let pushes = (0..20u8).map(|index| {
        let body =
            multipart(&[("adapter_config.json", &config), ("adapter_model.safetensors", &variant(&weights, index))]);
        let expected = sha_hex(&variant(&weights, index));
        let demo = &demo;
        async move {
            let (status, answer) = put(demo, "fresh", "", body).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
            assert_eq!(answer["sha256"].as_str(), Some(expected.as_str()), "{answer}");
            (answer["version"].as_u64().expect("a version"), expected)
        }
    });
    let mut answered = futures::future::join_all(pushes).await;
    answered.sort();
    let versions: Vec<u64> = answered.iter().map(|(version, _)| *version).collect();
    assert_eq!(versions, (1..=20).collect::<Vec<u64>>());
    let state: Value =
        reqwest::get(demo.http_url("/v1/lora_adapters/fresh")).await.expect("get").json().await.expect("json");
    for (version, sha) in &answered {
        let listed = state["versions"].as_array().expect("versions").iter().find(|held| held["version"] == *version);
        assert_eq!(listed.and_then(|held| held["sha256"].as_str()), Some(sha.as_str()), "v{version}: {state}");
    }
}

/// `PUT` of the demo adapter's files to `name`, presenting `key`.
async fn put_as(demo: &DemoServer, key: Option<&str>, name: &str, body: Vec<u8>) -> StatusCode {
    let mut request = reqwest::Client::new()
        .put(demo.http_url(&format!("/v1/lora_adapters/{name}")))
        .header("content-type", format!("multipart/form-data; boundary={BOUNDARY}"))
        .body(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.expect("the push is answered").status()
}

/// `GET` of `path` on the HTTP front, presenting `key`.
async fn get_as(demo: &DemoServer, key: &str, path: &str) -> StatusCode {
    let response = reqwest::Client::new().get(demo.http_url(path)).bearer_auth(key).send().await.expect("answered");
    response.status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_pushes_to_and_reads_only_the_adapters_its_key_owns() {
    const ADMIN: &str = "k-admin-push-test";
    const TEAM_A: &str = "k-team-a-trainer";
    const TEAM_B: &str = "k-team-b-trainer";
    const A_ROLLOUTS: &str = "k-team-a-rollouts";
    let keys = tempfile::Builder::new().prefix("loragate-tenant-keys-").tempdir().expect("a temporary directory");
    let file = keys.path().join("tenants.json");
    let tenants = json!({
        TEAM_A: {"adapters": ["a-*"], "control": true},
        TEAM_B: {"adapters": ["b-*"], "control": true},
        A_ROLLOUTS: {"adapters": ["a-*"]},
    });
    std::fs::write(&file, tenants.to_string()).expect("tenant file");
    let demo = DemoServer::start_with(|config| {
        config.authentication.admin_key = Some(ADMIN.parse().expect("a key"));
        config.authentication.tenant_keys = Some(file);
    })
    .await;
    let (config, weights) = demo_files(&demo, "meow");
    let body = |variant_byte| {
        let changed = variant(&weights, variant_byte);
        multipart(&[("adapter_config.json", &config), ("adapter_model.safetensors", &changed)])
    };

    assert_eq!(put_as(&demo, Some(TEAM_A), "a-policy", body(1)).await, StatusCode::OK, "its own adapter");
    assert_eq!(put_as(&demo, Some(TEAM_B), "b-policy", body(2)).await, StatusCode::OK, "its own adapter");
    let a_policy = |demo: &DemoServer| {
        let request = reqwest::Client::new().get(demo.http_url("/v1/lora_adapters/a-policy")).bearer_auth(ADMIN);
        async move { request.send().await.expect("answered").json::<Value>().await.expect("JSON") }
    };
    let before = a_policy(&demo).await;
    assert_eq!(before["version"].as_u64(), Some(1), "{before}");

    // Another tenant's adapter, one no tenant owns, a key that may only sample, no key: refused, nothing changed.
    assert_eq!(put_as(&demo, Some(TEAM_B), "a-policy", body(3)).await, StatusCode::FORBIDDEN);
    assert_eq!(put_as(&demo, Some(TEAM_A), "meow", body(4)).await, StatusCode::FORBIDDEN);
    assert_eq!(put_as(&demo, Some(A_ROLLOUTS), "a-policy", body(5)).await, StatusCode::FORBIDDEN);
    assert_eq!(put_as(&demo, None, "a-policy", body(6)).await, StatusCode::UNAUTHORIZED);
    let after = a_policy(&demo).await;
    assert_eq!((&after["version"], &after["sha256"]), (&before["version"], &before["sha256"]), "nothing changed");
    let store = demo.server.coordinator().adapter_store().expect("a store");
    assert_eq!(store.pending_uploads().expect("tmp"), 0, "no refused push left a temporary file");

    // The files of a version: the owning tenant and the admin read them, no one else.
    let file = "/v1/lora_adapters/a-policy/versions/1/adapter_model.safetensors";
    assert_eq!(get_as(&demo, TEAM_A, file).await, StatusCode::OK);
    assert_eq!(get_as(&demo, ADMIN, file).await, StatusCode::OK);
    assert_eq!(get_as(&demo, TEAM_B, file).await, StatusCode::FORBIDDEN);
    assert_eq!(get_as(&demo, TEAM_B, "/v1/lora_adapters/a-policy").await, StatusCode::FORBIDDEN);
    assert_eq!(
        get_as(&demo, TEAM_A, "/v1/lora_adapters/b-policy/versions/1/adapter_config.json").await,
        StatusCode::FORBIDDEN
    );
}
