//! Issue 20: strict request bodies (a typo is a 400 naming it, never a silent default), a wait-mode pause bounded by
//! `timeout_s` (504 past it), batches that can never be admitted (400, not 429), unknown models listed, refusals that
//! say `Connection: close` when they leave a body unread, and vLLM's response fields.

use loragate_core::{Key, Keyring, Limits, TenantKeys};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// The `code` and `param` of an error answer.
fn code_and_param(answer: &Value) -> (&str, &str) {
    (answer["error"]["code"].as_str().unwrap_or("-"), answer["error"]["param"].as_str().unwrap_or("-"))
}

#[tokio::test]
async fn a_control_body_with_an_unknown_field_is_refused_naming_it_and_changes_nothing() {
    let harness = serve(&["meow"]).await;
    for (path, body, field) in [
        ("/skyrl/v1/abort_lora_requests", json!({"lora_name": "meow", "lease": 5, "owner": "x"}), "lease"),
        ("/skyrl/v1/abort_lora_requests", json!({"lora_name": "meow", "ownr": "x"}), "ownr"),
        ("/skyrl/v1/resume_lora_requests", json!({"lora_name": "meow", "pauseid": "p"}), "pauseid"),
        ("/skyrl/v1/wait_lora_unpaused", json!({"lora_name": "meow", "timeout": 1}), "timeout"),
        ("/v1/load_lora_adapter", json!({"lora_name": "meow", "lora_path": "x", "inplace": true}), "inplace"),
        ("/skyrl/v1/load_lora_adapter", json!({"lora_name": "meow", "in_memory": true}), "in_memory"),
        ("/v1/unload_lora_adapter", json!({"lora_name": "meow", "force": true}), "force"),
        ("/unload_lora_adapter", json!({"name": "meow"}), "name"),
        ("/abort_request", json!({"rid": "r", "abort_al": true}), "abort_al"),
        ("/pause_generation", json!({"mode": "abort", "timeout": 1}), "timeout"),
        ("/continue_generation", json!({"x": 1}), "x"),
        ("/resume", json!({"x": 1}), "x"),
        ("/areal_pause_generation", json!({"x": 1}), "x"),
    ] {
        let (status, answer) = harness.post(path, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {answer}");
        assert_eq!(code_and_param(&answer), ("unknown_field", field), "{path} {body}: {answer}");
        assert!(answer["error"]["message"].as_str().is_some_and(|message| message.contains(field)), "{answer}");
    }
    let status = harness.status_of("meow").await;
    assert!(!status.paused && status.pauses.is_empty(), "a refused pause paused nothing: {status:?}");
    let (status, answer) = harness.post("/pause?mdoe=keep", json!({})).await;
    assert_eq!((status, code_and_param(&answer).1), (StatusCode::BAD_REQUEST, "mdoe"), "{answer}");
    assert!(!harness.coordinator.is_paused_globally().await.expect("answer"), "a refused /pause paused nothing");
}

#[tokio::test]
async fn the_framework_clients_control_bodies_are_accepted() {
    let harness = serve(&["meow"]).await;
    // What the released clients send (framework-clients.md): SkyRL, prime-rl, AReaL, verl, slime.
    for (path, body) in [
        ("/skyrl/v1/abort_lora_requests", json!({"lora_name": "meow", "mode": "keep", "owner": "o", "lease_s": 5})),
        ("/skyrl/v1/resume_lora_requests", json!({"lora_name": "meow"})),
        ("/skyrl/v1/wait_lora_unpaused", json!({"lora_name": "meow", "timeout_s": 0})),
        ("/pause_generation", json!({})),
        ("/continue_generation", json!({})),
        ("/areal_pause_generation", json!({})),
        ("/areal_continue_generation", json!({})),
        ("/abort_request", json!({"rid": "", "abort_all": false})),
        ("/abort_request", json!({"abort_all": true})),
    ] {
        let (status, answer) = harness.post_empty(path, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{path} {body}: {answer}");
    }
    let response = harness.client.post(harness.url("/pause?mode=keep&clear_cache=false")).send().await.expect("send");
    assert_eq!(response.status(), StatusCode::OK, "SkyRL's and prime-rl's /pause: a query, no body");
    let response = harness.client.post(harness.url("/resume")).send().await.expect("send");
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_lease_over_the_maximum_is_refused_naming_it() {
    let harness = serve(&["meow"]).await;
    for lease in [1e300, 86_400.5] {
        let body = json!({"lora_name": "meow", "owner": "trainer", "lease_s": lease});
        let (status, answer) = harness.post("/skyrl/v1/abort_lora_requests", body).await;
        assert_eq!((status, code_and_param(&answer).1), (StatusCode::BAD_REQUEST, "lease_s"), "{lease}: {answer}");
    }
    assert!(!harness.status_of("meow").await.paused, "nothing was paused");
    let body = json!({"lora_name": "meow", "owner": "trainer", "lease_s": 86_400});
    assert_eq!(harness.post("/skyrl/v1/abort_lora_requests", body).await.0, StatusCode::OK, "the maximum itself");
}

#[tokio::test]
async fn a_wait_mode_pause_past_its_timeout_is_504_and_withdrawn() {
    let harness = serve(&["meow"]).await;
    let running = harness.spawn_completion(json!({"model": "meow", "prompt": "x", "max_tokens": 1000}), "long");
    eventually("the completion runs", || async { harness.status_of("meow").await.in_flight == 1 }).await;
    let started = Instant::now();
    let body = json!({"lora_name": "meow", "mode": "wait", "timeout_s": 0.2});
    let (status, answer) = harness.post("/skyrl/v1/abort_lora_requests", body).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{answer}");
    assert!(started.elapsed() < Duration::from_secs(30), "bounded by timeout_s: {:?}", started.elapsed());
    assert!(!harness.status_of("meow").await.paused, "the pause was withdrawn");
    assert!(!running.is_finished(), "and the running completion went on");
    let body = json!({"lora_name": "meow", "mode": "abort", "timeout_s": 1});
    let (status, answer) = harness.post("/skyrl/v1/abort_lora_requests", body).await;
    assert_eq!((status, code_and_param(&answer).1), (StatusCode::BAD_REQUEST, "timeout_s"), "wait mode only");
    let (status, answer) = harness.post("/pause?mode=wait&timeout_s=0.2", json!({})).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "the engine-wide wait too: {answer}");
    assert!(!harness.coordinator.is_paused_globally().await.expect("answer"), "withdrawn everywhere");
    harness.pause("meow").await;
    let (status, answer) = running.await.expect("task");
    assert_eq!((status, &answer["choices"][0]["finish_reason"]), (StatusCode::OK, &json!("abort")));
}

#[tokio::test]
async fn sampling_bodies_refuse_unknown_fields_and_accept_what_the_clients_send() {
    let harness = serve(&["meow"]).await;
    for (path, body, field) in [
        ("/v1/completions", json!({"model": "meow", "prompt": "x", "max_tokns": 2}), "max_tokns"),
        ("/v1/completions", json!({"model": "meow", "prompt": "x", "max_tokens": 2, "padding": "x"}), "padding"),
        (
            "/inference/v1/generate",
            json!({"token_ids": [1], "sampling_params": {"top_kk": 1}}),
            "sampling_params.top_kk",
        ),
        ("/inference/v1/generate", json!({"token_ids": [1], "tokens": [1]}), "tokens"),
        ("/generate", json!({"input_ids": [1], "sampling_params": {"max_tokens": 2}}), "sampling_params.max_tokens"),
        ("/generate", json!({"input_ids": [1], "lora": "meow"}), "lora"),
        ("/tokenize", json!({"prompt": "x", "add_bos": true}), "add_bos"),
        ("/detokenize", json!({"tokens": [1], "skip": true}), "skip"),
    ] {
        let (status, answer) = harness.post(path, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {answer}");
        assert_eq!(code_and_param(&answer), ("unknown_field", field), "{path} {body}: {answer}");
    }
    for (path, body) in [
        // The openai SDK's and vLLM's neutral fields, and AReaL's flat body.
        (
            "/v1/completions",
            json!({"model": "meow", "prompt": [1, 2], "max_tokens": 2, "user": "u", "cache_salt": "s", "priority": 0,
                   "skip_special_tokens": true, "spaces_between_special_tokens": true, "best_of": 1,
                   "logit_bias": {}, "suffix": "", "use_beam_search": false, "top_k": 100000000, "logprobs": 0,
                   "return_tokens_as_token_ids": true, "stop_token_ids": [], "ignore_eos": false, "stream": false}),
        ),
        // SkyRL's and prime-rl's generate.
        (
            "/inference/v1/generate",
            json!({"model": "meow", "token_ids": [1, 2], "cache_salt": "salt", "priority": 0,
                   "sampling_params": {"min_tokens": 1, "skip_special_tokens": true, "include_stop_str_in_output": true,
                   "max_tokens": 2, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "logprobs": 1,
                   "stop": null, "output_kind": 2, "routed_experts_prompt_start": 0}}),
        ),
        // slime's and AReaL's SGLang bodies.
        (
            "/generate",
            json!({"input_ids": [1, 2], "return_logprob": true, "image_data": [], "stream": false,
                   "sampling_params": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 2,
                   "stop": null, "stop_token_ids": null, "skip_special_tokens": false, "no_stop_trim": true,
                   "spaces_between_special_tokens": false, "custom_params": {"return_top_p_token_ids": true}}}),
        ),
        ("/tokenize", json!({"model": SERVED_NAME, "prompt": "Hi", "add_special_tokens": true})),
        ("/detokenize", json!({"model": SERVED_NAME, "tokens": [72, 105]})),
    ] {
        let (status, answer) = harness.post(path, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{path} {body}: {answer}");
    }
}

#[tokio::test]
async fn a_batch_that_can_never_be_admitted_is_400_naming_the_limit_not_429() {
    let limits = Limits { max_in_flight: 4, ..Limits::default() };
    let config = CoordinatorConfig { limits, ..CoordinatorConfig::default() };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["meow"]).await;
    let prompts = |count: usize| json!(vec![vec![1, 2]; count]);
    let (status, answer) = harness.post("/v1/completions", json!({"prompt": prompts(5), "max_tokens": 2})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(code_and_param(&answer), ("batch_too_large", "prompt"));
    assert!(answer["error"]["message"].as_str().is_some_and(|message| message.contains("--max-in-flight")));
    let (status, answer) = harness.post("/generate", json!({"input_ids": prompts(5)})).await;
    assert_eq!((status, code_and_param(&answer)), (StatusCode::BAD_REQUEST, ("batch_too_large", "input_ids")));
    let (status, answer) = harness.post("/v1/completions", json!({"prompt": prompts(4), "max_tokens": 2})).await;
    assert_eq!(status, StatusCode::OK, "at the cap: {answer}");

    let harness = serve(&["meow"]).await;
    let too_many = crate::sampling::MAX_BATCH_SEQUENCES / 64 + 1;
    let body = json!({"prompt": prompts(too_many), "n": 64, "max_tokens": 2});
    let (status, answer) = harness.post("/v1/completions", body).await;
    assert_eq!((status, code_and_param(&answer)), (StatusCode::BAD_REQUEST, ("batch_too_large", "prompt")));
    assert!(answer["error"]["message"].as_str().is_some_and(|message| message.contains("sequences")), "{answer}");
}

#[tokio::test]
async fn an_unknown_model_lists_the_served_names_the_caller_may_use() {
    let harness = serve(&["meow", "woof"]).await;
    let (status, answer) = harness.post("/v1/completions", json!({"model": "mew", "prompt": "x"})).await;
    assert_eq!((status, code_and_param(&answer)), (StatusCode::NOT_FOUND, ("unknown_adapter", "model")));
    let message = answer["error"]["message"].as_str().expect("message");
    assert!(message.contains("\"mew\"") && message.contains(r#""demo", "meow", "woof""#), "{message}");
    let (status, answer) = harness.post("/generate", json!({"input_ids": [1], "lora_path": "mew"})).await;
    assert_eq!((status, code_and_param(&answer).1), (StatusCode::NOT_FOUND, "lora_path"), "{answer}");

    // A tenant whose grant covers the name (`m*`) learns it is not loaded, and sees only its own adapters.
    let tenants = TenantKeys::parse(r#"{"k-m": {"adapters": ["m*"]}}"#).expect("tenants");
    let auth = Keyring::new(Some(Key::parse("k-api").expect("key")), None, tenants).expect("keys");
    let config = CoordinatorConfig { auth, ..CoordinatorConfig::default() };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["meow", "woof"]).await;
    let response = harness
        .client
        .post(harness.url("/v1/completions"))
        .bearer_auth("k-m")
        .json(&json!({"model": "mew", "prompt": "x"}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let answer: Value = response.json().await.expect("json");
    let message = answer["error"]["message"].as_str().expect("message");
    assert!(message.contains(r#""demo", "meow""#) && !message.contains("woof"), "only what it may use: {message}");
}

/// Sends raw `request` bytes on a fresh connection, then `second` on the same one if the first answer allows it;
/// returns the first answer's head and whether a second answer came.
async fn on_one_connection(harness: &Harness, request: String, second: &str) -> (String, bool) {
    let address = harness.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    let head_end = loop {
        let read = stream.read(&mut buffer).await.expect("read");
        assert!(read > 0, "the server answered: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buffer[..read]);
        if let Some(end) = answer.windows(4).position(|window| window == b"\r\n\r\n") {
            break end;
        }
    };
    let head = String::from_utf8_lossy(&answer[..head_end]).to_ascii_lowercase();
    if head.contains("connection: close") {
        return (head, false);
    }
    // Drain the first body (by its length), then ask again on the same connection.
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0);
    while answer.len() < head_end + 4 + length {
        let read = stream.read(&mut buffer).await.expect("read");
        assert!(read > 0, "the body");
        answer.extend_from_slice(&buffer[..read]);
    }
    stream.write_all(second.as_bytes()).await.expect("write again");
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buffer)).await.expect("in time");
    (head, read.is_ok_and(|read| read > 0 && buffer.starts_with(b"HTTP/1.1 ")))
}

#[tokio::test]
async fn a_refusal_that_leaves_the_body_unread_says_connection_close_and_others_keep_the_connection() {
    let config = CoordinatorConfig {
        auth: Keyring::new(Some(Key::parse("k-api").expect("key")), None, TenantKeys::default()).expect("keys"),
        ..CoordinatorConfig::default()
    };
    let harness = serve_engine(ScriptedEngine::new(HOLD_AFTER), config, &["meow"]).await;
    let health = "GET /health HTTP/1.1\r\nhost: x\r\n\r\n";
    // A body the refusal never reads (sent after the head, as clients often do): the server says it closes.
    let body = r#"{"lora_name": "meow"}"#;
    let unauthorized = format!(
        "POST /skyrl/v1/wait_lora_unpaused HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (head, _) = on_one_connection(&harness, unauthorized, health).await;
    assert!(head.starts_with("http/1.1 401") && head.contains("connection: close"), "{head}");
    // Refusals of bodiless requests, and answers after a body was read, keep the connection usable.
    let bodiless = "GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n".to_owned();
    let (head, reused) = on_one_connection(&harness, bodiless, health).await;
    assert!(head.starts_with("http/1.1 401") && !head.contains("connection: close") && reused, "{head}");
    let body = r#"{"lora_name": "meow", "timeout_s": 0}"#;
    let served = format!(
        "POST /skyrl/v1/wait_lora_unpaused HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k-api\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (head, reused) = on_one_connection(&harness, served, health).await;
    assert!(head.starts_with("http/1.1 200") && !head.contains("connection: close") && reused, "{head}");
    let refused_after_reading = "POST /skyrl/v1/wait_lora_unpaused HTTP/1.1\r\nhost: x\r\nauthorization: Bearer \
         k-api\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        .to_owned();
    let (head, reused) = on_one_connection(&harness, refused_after_reading, health).await;
    assert!(head.starts_with("http/1.1 400") && reused, "a 400 after reading the body keeps the connection: {head}");
}

#[tokio::test]
async fn completions_and_chat_carry_vllms_response_fields() {
    let harness = serve_with_chat(&["meow"]).await;
    // The scripted engine emits bytes 0, 1, 2: the stop string "\u{1}" ends the choice.
    let body = json!({"model": "meow", "prompt": [7, 8], "max_tokens": 3, "stop": ["\u{1}"], "return_token_ids": true});
    let (status, answer) = harness.post("/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let choice = &answer["choices"][0];
    assert_eq!((&choice["finish_reason"], &choice["stop_reason"]), (&json!("stop"), &json!("\u{1}")));
    assert_eq!((&choice["prompt_token_ids"], &choice["prompt_logprobs"]), (&json!([7, 8]), &json!(null)));
    assert_eq!(answer["usage"]["prompt_tokens_details"], json!({"cached_tokens": 0}));
    let (_, answer) = harness.post("/v1/completions", json!({"model": "meow", "prompt": [7], "max_tokens": 3})).await;
    let choice = &answer["choices"][0];
    assert_eq!((&choice["stop_reason"], &choice["prompt_logprobs"]), (&json!(null), &json!(null)), "keys present");
    assert!(choice.get("prompt_token_ids").is_none(), "not asked for: {choice}");

    let chunks = harness
        .stream("/v1/completions", json!({"model": "meow", "prompt": [7, 8], "max_tokens": 3, "echo": true}))
        .await;
    assert_eq!(chunks[0]["choices"][0]["prompt_token_ids"], json!([7, 8]), "streamed with echo: on the first chunk");
    assert!(chunks[1..].iter().all(|chunk| chunk["choices"][0].get("prompt_token_ids").is_none()));

    let messages = json!([{"role": "user", "content": "hi"}]);
    let body = json!({"model": "meow", "messages": messages, "max_tokens": 3, "stop": "\u{1}"});
    let (status, answer) = harness.post("/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["choices"][0]["stop_reason"], json!("\u{1}"), "the stop string");
    assert!(answer.get("prompt_logprobs").is_some_and(Value::is_null), "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens_details"], json!({"cached_tokens": 0}));
}
