//! The error table over the wire: every bad input gets its status and an OpenAI error object naming the field, and
//! the server keeps serving with nothing leaked or left paused.

use serde_json::json;

use super::*;

/// How a case sends its request.
enum Send {
    Json(&'static str, Value),
    Raw(&'static str, String),
    Text(&'static str, String),
    WithRequestId(Value, String),
    Get(&'static str),
}

fn completion(extra: Value) -> Value {
    let mut body = json!({"model": "meow", "prompt": "x", "max_tokens": 2});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        for (key, value) in extra {
            body.insert(key.clone(), value.clone());
        }
    }
    body
}

fn without(field: &str) -> Value {
    let mut body = completion(json!({}));
    body.as_object_mut().map(|fields| fields.remove(field));
    body
}

#[tokio::test]
async fn unknown_paths_keep_answering_404_in_openais_shape() {
    let harness = serve(&["meow"]).await;
    for path in ["/init_broadcaster", "/collective_rpc", "/v1/chat/completions/render"] {
        let response = harness.client.post(harness.url(path)).json(&json!({})).send().await.expect("send");
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body["error"]["code"], "no_such_endpoint", "{path}");
    }
}

#[tokio::test]
async fn each_bad_input_gets_its_status_and_an_error_naming_the_field() {
    let harness = serve(&["meow"]).await;
    let cases: Vec<(&str, Send, StatusCode, Option<&str>)> = vec![
        ("malformed JSON", Send::Raw("/v1/completions", "{".into()), StatusCode::BAD_REQUEST, None),
        ("not an object", Send::Raw("/v1/completions", "[1]".into()), StatusCode::BAD_REQUEST, None),
        ("empty body", Send::Raw("/v1/completions", String::new()), StatusCode::BAD_REQUEST, None),
        ("no prompt", Send::Json("/v1/completions", without("prompt")), StatusCode::BAD_REQUEST, Some("prompt")),
        (
            "empty model",
            Send::Json("/v1/completions", completion(json!({"model": ""}))),
            StatusCode::BAD_REQUEST,
            Some("model"),
        ),
        (
            "malformed model",
            Send::Json("/v1/completions", completion(json!({"model": "two words"}))),
            StatusCode::BAD_REQUEST,
            Some("model"),
        ),
        (
            "unknown model",
            Send::Json("/v1/completions", completion(json!({"model": "ghost"}))),
            StatusCode::NOT_FOUND,
            Some("model"),
        ),
        (
            "max_tokens 0",
            Send::Json("/v1/completions", completion(json!({"max_tokens": 0}))),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
        ),
        (
            "max_tokens over the context",
            Send::Json("/v1/completions", completion(json!({"max_tokens": 5000}))),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
        ),
        (
            "max_tokens a string",
            Send::Json("/v1/completions", completion(json!({"max_tokens": "2"}))),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
        ),
        (
            "an empty prompt in a batch",
            Send::Json("/v1/completions", completion(json!({"prompt": [[1], []]}))),
            StatusCode::BAD_REQUEST,
            Some("prompt"),
        ),
        (
            "empty token prompt",
            Send::Json("/v1/completions", completion(json!({"prompt": []}))),
            StatusCode::BAD_REQUEST,
            Some("prompt"),
        ),
        (
            "token outside the vocabulary",
            Send::Json("/v1/completions", completion(json!({"prompt": [1, 999]}))),
            StatusCode::BAD_REQUEST,
            Some("prompt"),
        ),
        (
            "a bad prompt in a batch",
            Send::Json("/v1/completions", completion(json!({"prompt": [[1], [999]]}))),
            StatusCode::BAD_REQUEST,
            Some("prompt"),
        ),
        (
            "min_p over 1",
            Send::Json("/v1/completions", completion(json!({"min_p": 2}))),
            StatusCode::BAD_REQUEST,
            Some("min_p"),
        ),
        (
            "presence_penalty over 2",
            Send::Json("/v1/completions", completion(json!({"presence_penalty": 3}))),
            StatusCode::BAD_REQUEST,
            Some("presence_penalty"),
        ),
        (
            "repetition_penalty 0",
            Send::Json("/v1/completions", completion(json!({"repetition_penalty": 0}))),
            StatusCode::BAD_REQUEST,
            Some("repetition_penalty"),
        ),
        (
            "min_tokens over max_tokens",
            Send::Json("/v1/completions", completion(json!({"min_tokens": 3}))),
            StatusCode::BAD_REQUEST,
            Some("min_tokens"),
        ),
        (
            "more alternatives than served",
            Send::Json("/v1/completions", completion(json!({"logprobs": 21}))),
            StatusCode::BAD_REQUEST,
            Some("logprobs"),
        ),
        (
            "a logit bias",
            Send::Json("/v1/completions", completion(json!({"logit_bias": {"5": 10}}))),
            StatusCode::BAD_REQUEST,
            Some("logit_bias"),
        ),
        (
            "beam search",
            Send::Json("/v1/completions", completion(json!({"use_beam_search": true}))),
            StatusCode::BAD_REQUEST,
            Some("use_beam_search"),
        ),
        (
            "a suffix",
            Send::Json("/v1/completions", completion(json!({"suffix": "end"}))),
            StatusCode::BAD_REQUEST,
            Some("suffix"),
        ),
        (
            "chat on a model without a chat template",
            Send::Json(
                "/v1/chat/completions",
                json!({"model": "meow", "messages": [{"role": "user", "content": "x"}]}),
            ),
            StatusCode::BAD_REQUEST,
            Some("messages"),
        ),
        (
            "generate without token_ids",
            Send::Json("/inference/v1/generate", json!({})),
            StatusCode::BAD_REQUEST,
            Some("token_ids"),
        ),
        (
            "generate with max_tokens 0",
            Send::Json("/inference/v1/generate", json!({"token_ids": [1], "sampling_params": {"max_tokens": 0}})),
            StatusCode::BAD_REQUEST,
            Some("sampling_params.max_tokens"),
        ),
        (
            "generate with a wrongly typed sampling field",
            Send::Json("/inference/v1/generate", json!({"token_ids": [1], "sampling_params": {"top_k": "all"}})),
            StatusCode::BAD_REQUEST,
            Some("sampling_params.top_k"),
        ),
        (
            "generate with too many alternatives",
            Send::Json("/inference/v1/generate", json!({"token_ids": [1], "sampling_params": {"logprobs": 21}})),
            StatusCode::BAD_REQUEST,
            Some("sampling_params.logprobs"),
        ),
        (
            "generate with constrained decoding",
            Send::Json("/inference/v1/generate", json!({"token_ids": [1], "sampling_params": {"guided_regex": "a"}})),
            StatusCode::BAD_REQUEST,
            Some("sampling_params.guided_regex"),
        ),
        (
            "generate on an unknown model",
            Send::Json("/inference/v1/generate", json!({"token_ids": [1], "model": "ghost"})),
            StatusCode::NOT_FOUND,
            Some("model"),
        ),
        ("sglang without a prompt", Send::Json("/generate", json!({})), StatusCode::BAD_REQUEST, Some("input_ids")),
        (
            "sglang with an empty prompt",
            Send::Json("/generate", json!({"input_ids": []})),
            StatusCode::BAD_REQUEST,
            Some("input_ids"),
        ),
        ("sglang with no texts", Send::Json("/generate", json!({"text": []})), StatusCode::BAD_REQUEST, Some("text")),
        (
            "sglang with an empty prompt in a batch",
            Send::Json("/generate", json!({"input_ids": [[1], []]})),
            StatusCode::BAD_REQUEST,
            Some("input_ids"),
        ),
        (
            "sglang with max_new_tokens 0",
            Send::Json("/generate", json!({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}})),
            StatusCode::BAD_REQUEST,
            Some("sampling_params.max_new_tokens"),
        ),
        (
            "sglang with a regex",
            Send::Json("/generate", json!({"input_ids": [1], "sampling_params": {"regex": "a"}})),
            StatusCode::BAD_REQUEST,
            Some("sampling_params.regex"),
        ),
        (
            "sglang on an unknown adapter",
            Send::Json("/generate", json!({"input_ids": [1], "lora_path": "ghost"})),
            StatusCode::NOT_FOUND,
            Some("lora_path"),
        ),
        (
            "sglang with one rid too many",
            Send::Json("/generate", json!({"input_ids": [[1], [2]], "rid": ["a", "b", "c"]})),
            StatusCode::BAD_REQUEST,
            Some("rid"),
        ),
        ("tokenize without a prompt", Send::Json("/tokenize", json!({})), StatusCode::BAD_REQUEST, Some("prompt")),
        (
            "tokenize for an unknown model",
            Send::Json("/tokenize", json!({"model": "ghost", "prompt": "x"})),
            StatusCode::NOT_FOUND,
            Some("model"),
        ),
        (
            "detokenize a token outside the vocabulary",
            Send::Json("/detokenize", json!({"tokens": [1, 999]})),
            StatusCode::BAD_REQUEST,
            Some("tokens"),
        ),
        (
            "negative temperature",
            Send::Json("/v1/completions", completion(json!({"temperature": -1}))),
            StatusCode::BAD_REQUEST,
            Some("temperature"),
        ),
        (
            "top_p 0",
            Send::Json("/v1/completions", completion(json!({"top_p": 0}))),
            StatusCode::BAD_REQUEST,
            Some("top_p"),
        ),
        (
            "top_k -5",
            Send::Json("/v1/completions", completion(json!({"top_k": -5}))),
            StatusCode::BAD_REQUEST,
            Some("top_k"),
        ),
        ("n 0", Send::Json("/v1/completions", completion(json!({"n": 0}))), StatusCode::BAD_REQUEST, Some("n")),
        (
            "n over the limit",
            Send::Json("/v1/completions", completion(json!({"n": 65}))),
            StatusCode::BAD_REQUEST,
            Some("n"),
        ),
        (
            "stop token outside the vocabulary",
            Send::Json("/v1/completions", completion(json!({"stop_token_ids": [999]}))),
            StatusCode::BAD_REQUEST,
            Some("stop_token_ids"),
        ),
        (
            "empty stop string",
            Send::Json("/v1/completions", completion(json!({"stop": ""}))),
            StatusCode::BAD_REQUEST,
            Some("stop"),
        ),
        (
            "a thousand stop strings",
            Send::Json("/v1/completions", completion(json!({"stop": vec!["x"; 1000]}))),
            StatusCode::BAD_REQUEST,
            Some("stop"),
        ),
        (
            "a text/plain body",
            Send::Text("/v1/completions", completion(json!({})).to_string()),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Some("Content-Type"),
        ),
        (
            "negative logprobs",
            Send::Json("/v1/completions", completion(json!({"logprobs": -1}))),
            StatusCode::BAD_REQUEST,
            Some("logprobs"),
        ),
        (
            "overlong request id",
            Send::WithRequestId(completion(json!({})), "r".repeat(300)),
            StatusCode::BAD_REQUEST,
            Some("X-Request-Id"),
        ),
        (
            "body over the limit",
            Send::Raw("/v1/completions", format!(r#"{{"model": "meow", "prompt": "{}"}}"#, "x".repeat(BODY_LIMIT))),
            StatusCode::PAYLOAD_TOO_LARGE,
            None,
        ),
        (
            "abort without a name",
            Send::Json("/skyrl/v1/abort_lora_requests", json!({})),
            StatusCode::BAD_REQUEST,
            Some("lora_name"),
        ),
        (
            "abort with an empty name",
            Send::Json("/skyrl/v1/abort_lora_requests", json!({"lora_name": ""})),
            StatusCode::BAD_REQUEST,
            Some("lora_name"),
        ),
        (
            "abort of an unknown adapter",
            Send::Json("/skyrl/v1/abort_lora_requests", json!({"lora_name": "ghost"})),
            StatusCode::NOT_FOUND,
            Some("lora_name"),
        ),
        (
            "resume of an unknown adapter",
            Send::Json("/skyrl/v1/resume_lora_requests", json!({"lora_name": "ghost"})),
            StatusCode::NOT_FOUND,
            Some("lora_name"),
        ),
        (
            "resume without a name",
            Send::Json("/skyrl/v1/resume_lora_requests", json!({"lora_name": null})),
            StatusCode::BAD_REQUEST,
            Some("lora_name"),
        ),
        (
            "wait on an unknown adapter",
            Send::Json("/skyrl/v1/wait_lora_unpaused", json!({"lora_name": "ghost", "timeout_s": 0})),
            StatusCode::NOT_FOUND,
            Some("lora_name"),
        ),
        (
            "negative timeout_s",
            Send::Json("/skyrl/v1/wait_lora_unpaused", json!({"lora_name": "meow", "timeout_s": -1})),
            StatusCode::BAD_REQUEST,
            Some("timeout_s"),
        ),
        (
            "non-numeric timeout_s",
            Send::Json("/skyrl/v1/wait_lora_unpaused", json!({"lora_name": "meow", "timeout_s": "soon"})),
            StatusCode::BAD_REQUEST,
            Some("timeout_s"),
        ),
        (
            "infinite timeout_s",
            Send::Raw("/skyrl/v1/wait_lora_unpaused", r#"{"lora_name": "meow", "timeout_s": 1e999}"#.into()),
            StatusCode::BAD_REQUEST,
            Some("timeout_s"),
        ),
        (
            "load without an adapter root",
            Send::Json("/v1/load_lora_adapter", json!({"lora_name": "x", "lora_path": "/tmp"})),
            StatusCode::BAD_REQUEST,
            Some("lora_path"),
        ),
        (
            "load without a path",
            Send::Json("/v1/load_lora_adapter", json!({"lora_name": "x"})),
            StatusCode::BAD_REQUEST,
            Some("lora_path"),
        ),
        (
            "load under the served name",
            Send::Json("/v1/load_lora_adapter", json!({"lora_name": SERVED_NAME, "lora_path": "x"})),
            StatusCode::BAD_REQUEST,
            Some("lora_name"),
        ),
        (
            "unload of an unknown adapter",
            Send::Json("/v1/unload_lora_adapter", json!({"lora_name": "ghost"})),
            StatusCode::NOT_FOUND,
            Some("lora_name"),
        ),
        ("no such endpoint", Send::Get("/v2/nothing"), StatusCode::NOT_FOUND, None),
    ];
    for (case, send, status, param) in cases {
        let request = match send {
            Send::Json(path, body) => harness.client.post(harness.url(path)).json(&body),
            Send::Raw(path, body) => {
                harness.client.post(harness.url(path)).header("content-type", "application/json").body(body)
            }
            Send::Text(path, body) => {
                harness.client.post(harness.url(path)).header("content-type", "text/plain").body(body)
            }
            Send::WithRequestId(body, id) => {
                harness.client.post(harness.url("/v1/completions")).header("X-Request-Id", id).json(&body)
            }
            Send::Get(path) => harness.client.get(harness.url(path)),
        };
        let response = request.send().await.unwrap_or_else(|err| panic!("{case}: {err}"));
        assert_eq!(response.status(), status, "{case}");
        let body: Value = response.json().await.unwrap_or_else(|err| panic!("{case}: not JSON: {err}"));
        let error = &body["error"];
        assert_eq!(error["param"].as_str(), param, "{case}: {body}");
        for field in ["message", "type", "code"] {
            assert!(error[field].as_str().is_some_and(|text| !text.is_empty()), "{case}: no {field} in {body}");
        }
    }

    let adapters = harness.coordinator.list_adapters().await;
    let names: Vec<&str> = adapters.iter().map(|status| status.key.as_wire_str()).collect();
    assert_eq!(names, ["meow"], "bad input never creates a registry entry");
    let meow = harness.status_of("meow").await;
    assert_eq!((meow.paused, meow.in_flight, meow.held, meow.waiting), (false, 0, 0, 0), "nothing leaked");
    let (status, body) = harness.post("/v1/completions", completion(json!({}))).await;
    assert_eq!((status, &body["choices"][0]["finish_reason"]), (StatusCode::OK, &json!("length")), "still serving");
}
