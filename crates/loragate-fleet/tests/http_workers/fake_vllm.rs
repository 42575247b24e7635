//! A fake of vLLM's OpenAI-compatible HTTP server (test code only, from its public API): `/health`, `/v1/models`
//! (adapters with their `root` path), runtime LoRA loading (`/v1/load_lora_adapter` refuses a loaded name with 400
//! "has already been loaded", a path it cannot read with 404 "No adapter found"), `/v1/completions` (streamed by token
//! ids with `return_token_ids`; unstreamed with `prompt_logprobs`), and with the token API (vLLM ≥ 0.32
//! `--enable-scale-out`) `/inference/v1/generate`, reporting its own request ids (`generate-tokens-<id>`), and
//! `/inference/v1/abort_requests`. Without the token API (vLLM 0.32 started without `--enable-scale-out`) both routes
//! exist but answer 403 "Scale-out endpoints are disabled", and the only abort is the client going away.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::fakes::{FakeState, Step, error, prompt, sse, steps};

/// The served model's name.
const BASE: &str = "fake-vllm";

/// The fake's routes.
pub(crate) fn router(state: Arc<FakeState>, token_api: bool) -> Router {
    let mut router = Router::new()
        .route("/health", get(|State(state): State<Arc<FakeState>>| async move { state.health() }))
        .route("/v1/models", get(models))
        .route("/v1/load_lora_adapter", post(load))
        .route("/v1/unload_lora_adapter", post(unload))
        .route("/v1/completions", post(completions));
    router = match token_api {
        true => router
            .route("/inference/v1/generate", post(generate))
            .route("/inference/v1/abort_requests", post(abort_requests)),
        false => router
            .route("/inference/v1/generate", post(scale_out_disabled))
            .route("/inference/v1/abort_requests", post(scale_out_disabled)),
    };
    router.with_state(state)
}

/// vLLM 0.32's answer on the token API's routes when it was started without `--enable-scale-out`.
async fn scale_out_disabled() -> Response {
    error(
        StatusCode::FORBIDDEN,
        "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
    )
}

async fn models(State(state): State<Arc<FakeState>>) -> Json<Value> {
    let mut data = vec![json!({"id": BASE, "root": "/models/fake", "parent": null, "max_model_len": 4096})];
    for (name, path) in state.loaded.lock().iter() {
        data.push(json!({"id": name, "root": path, "parent": BASE, "max_model_len": 4096}));
    }
    Json(json!({"object": "list", "data": data}))
}

async fn load(State(state): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    state.record("load", &body);
    let (Some(name), Some(path)) = (body["lora_name"].as_str(), body["lora_path"].as_str()) else {
        return error(StatusCode::BAD_REQUEST, "lora_name and lora_path are required");
    };
    if state.loaded.lock().contains_key(name) {
        return error(StatusCode::BAD_REQUEST, &format!("The lora adapter '{name}' has already been loaded."));
    }
    if state.refuses(path) {
        return error(StatusCode::NOT_FOUND, &format!("No adapter found for {path}"));
    }
    state.loaded.lock().insert(name.to_owned(), path.to_owned());
    (StatusCode::OK, format!("Success: LoRA adapter '{name}' added successfully.")).into_response()
}

async fn unload(State(state): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    state.record("unload", &body);
    let name = body["lora_name"].as_str().unwrap_or_default();
    match state.loaded.lock().remove(name) {
        Some(_) => (StatusCode::OK, "Success").into_response(),
        None => error(StatusCode::NOT_FOUND, &format!("The lora adapter '{name}' cannot be found.")),
    }
}

/// vLLM's answer to a body naming a model it does not serve (neither the base model nor a loaded adapter).
fn unknown_model(state: &FakeState, body: &Value) -> Option<Response> {
    match body["model"].as_str() {
        None => None,
        Some(model) if model == BASE || state.loaded.lock().contains_key(model) => None,
        Some(model) => Some(error(StatusCode::NOT_FOUND, &format!("The model `{model}` does not exist."))),
    }
}

fn budget(value: &Value) -> u32 {
    // vLLM's own default when a client leaves it out: 16.
    value.as_u64().map_or(16, |max| max as u32)
}

async fn completions(State(state): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    state.record("/v1/completions", &body);
    if let Some(refused) = unknown_model(&state, &body) {
        return refused;
    }
    let prompt = prompt(&body, "prompt");
    if body["stream"] != true {
        // A scoring request: the prompt's logprobs, each position with the prompt token's entry and a top one.
        let positions: Vec<Value> = prompt
            .iter()
            .enumerate()
            .map(|(position, token)| match position {
                0 => Value::Null,
                _ => json!({token.to_string(): {"logprob": -1.0, "rank": 2, "decoded_token": "x"},
                            "7": {"logprob": -0.25, "rank": 1, "decoded_token": "y"}}),
            })
            .collect();
        let choice =
            json!({"index": 0, "text": "", "token_ids": [10], "prompt_logprobs": positions, "finish_reason": "length"});
        return Json(json!({"id": "cmpl-score", "object": "text_completion", "choices": [choice]})).into_response();
    }
    let id = format!("cmpl-{}", state.bodies.lock().len());
    let chunks = steps(&state, id, budget(&body["max_tokens"])).map(|step| {
        let choice = match step {
            Step::KeepAlive => return None,
            Step::Token(token) => json!({"index": 0, "text": "", "token_ids": [token],
                "logprobs": {"tokens": [format!("token_id:{token}")], "token_logprobs": [-0.5],
                             "top_logprobs": [{format!("token_id:{token}"): -0.5}], "text_offset": [0]},
                "finish_reason": null}),
            Step::Finish(reason) => {
                json!({"index": 0, "text": "", "token_ids": [], "logprobs": null, "finish_reason": reason})
            }
        };
        Some(json!({"id": "cmpl", "object": "text_completion", "choices": [choice]}))
    });
    sse(chunks.boxed())
}

async fn generate(State(state): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    if !body["token_ids"].is_array() || !body["sampling_params"].is_object() {
        // vLLM validates the body first (FastAPI answers 422, which vLLM turns into 400).
        return error(StatusCode::BAD_REQUEST, "token_ids and sampling_params are required");
    }
    state.record("/inference/v1/generate", &body);
    if let Some(refused) = unknown_model(&state, &body) {
        return refused;
    }
    // vLLM prefixes the caller's id: the id to abort is the one the stream reports.
    let id = format!("generate-tokens-{}", body["request_id"].as_str().unwrap_or("none"));
    let reported = id.clone();
    let chunks = steps(&state, id, budget(&body["sampling_params"]["max_tokens"])).map(move |step| {
        let choice = match step {
            Step::KeepAlive => return None,
            Step::Token(token) => json!({"index": 0, "token_ids": [token],
                "logprobs": {"content": [{"token_id": token, "logprob": -0.5, "rank": 1,
                                          "top_logprobs": [{"token_id": token, "logprob": -0.5, "rank": 1}]}]},
                "finish_reason": null}),
            Step::Finish(reason) => json!({"index": 0, "token_ids": [], "logprobs": null, "finish_reason": reason}),
        };
        Some(json!({"request_id": reported, "choices": [choice]}))
    });
    sse(chunks.boxed())
}

async fn abort_requests(State(state): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    let Some(ids) = body["request_ids"].as_array() else {
        return error(StatusCode::BAD_REQUEST, "Missing 'request_ids' in request body");
    };
    for id in ids.iter().filter_map(Value::as_str) {
        state.abort(id);
    }
    StatusCode::OK.into_response()
}
