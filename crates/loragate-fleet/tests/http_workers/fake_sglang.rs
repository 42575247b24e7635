//! A fake of SGLang's HTTP server (test code only, from its public API): `/health`, `/v1/models` (the base model
//! only, as SGLang lists it), `/load_lora_adapter` / `/unload_lora_adapter` (`{"success", "error_message"}`, 400 on
//! failure), `/generate` (streamed with cumulative `output_ids` and `output_token_logprobs` triples; unstreamed with
//! `input_token_logprobs`; 400 "not loaded" for an adapter it does not hold) and `/abort_request {"rid"}`, after
//! which the aborted stream ends with `finish_reason {"type": "abort"}`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::fakes::{FakeState, Step, prompt, sse, steps};

/// The fake's routes.
pub(crate) fn router(state: Arc<FakeState>) -> Router {
    Router::new()
        .route("/health", get(|State(state): State<Arc<FakeState>>| async move { state.health() }))
        .route("/v1/models", get(|| async { Json(json!({"data": [{"id": "fake-sglang", "max_model_len": 4096}]})) }))
        .route("/load_lora_adapter", post(load))
        .route("/unload_lora_adapter", post(unload))
        .route("/generate", post(generate))
        .route("/abort_request", post(abort_request))
        .with_state(state)
}

fn failed(message: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({"success": false, "error_message": message}))).into_response()
}

async fn load(State(state): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    state.record("load", &body);
    let (name, path) = (body["lora_name"].as_str().unwrap_or_default(), body["lora_path"].as_str().unwrap_or_default());
    if state.loaded.lock().contains_key(name) {
        return failed(format!("The LoRA adapter {name} is already loaded."));
    }
    if state.refuses(path) {
        return failed(format!("Failed to load LoRA adapter {name}: cannot read {path}"));
    }
    state.loaded.lock().insert(name.to_owned(), path.to_owned());
    let loaded = state.loaded.lock().clone();
    Json(json!({"success": true, "error_message": null, "loaded_adapters": loaded})).into_response()
}

async fn unload(State(state): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    state.record("unload", &body);
    let name = body["lora_name"].as_str().unwrap_or_default();
    match state.loaded.lock().remove(name) {
        Some(_) => Json(json!({"success": true})).into_response(),
        None => failed(format!("LoRA adapter {name} is not loaded")),
    }
}

fn triple(token: u32, logprob: f64) -> Value {
    json!([logprob, token, null])
}

async fn generate(State(state): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    state.record("/generate", &body);
    if let Some(lora) = body["lora_path"].as_str()
        && !state.loaded.lock().contains_key(lora)
    {
        let message = format!("The following requested LoRA adapters are not loaded: {lora}");
        return (StatusCode::BAD_REQUEST, Json(json!({"error": {"message": message}}))).into_response();
    }
    let rid = body["rid"].as_str().unwrap_or("generated").to_owned();
    let prompt = prompt(&body, "input_ids");
    if body["stream"] != true {
        // A scoring request: the prompt's logprobs from position 0 (the first null), with a top candidate each.
        let input: Vec<Value> = prompt
            .iter()
            .enumerate()
            .map(|(position, &token)| if position == 0 { json!([null, token, null]) } else { triple(token, -1.0) })
            .collect();
        let top: Vec<Value> = (0..prompt.len())
            .map(|position| if position == 0 { Value::Null } else { json!([triple(7, -0.25)]) })
            .collect();
        let meta = json!({"id": rid, "finish_reason": {"type": "length", "length": 1}, "completion_tokens": 1,
            "input_token_logprobs": input, "input_top_logprobs": top, "output_token_logprobs": [triple(10, -0.5)]});
        return Json(json!({"text": "", "output_ids": [10], "meta_info": meta})).into_response();
    }
    // SGLang's own default when a client leaves it out: 128.
    let max_tokens = body["sampling_params"]["max_new_tokens"].as_u64().map_or(128, |max| max as u32);
    let mut output: Vec<u32> = Vec::new();
    let chunks = steps(&state, rid.clone(), max_tokens).map(move |step| {
        let finish = match step {
            Step::KeepAlive => return None,
            Step::Token(token) => {
                output.push(token);
                Value::Null
            }
            Step::Finish("length") => json!({"type": "length", "length": output.len()}),
            Step::Finish(_) => json!({"type": "abort", "message": "Abort in waiting queue"}),
        };
        let triples: Vec<Value> = output.iter().map(|&token| triple(token, -0.5)).collect();
        Some(json!({"text": "", "output_ids": output, "meta_info": {"id": rid, "finish_reason": finish,
            "completion_tokens": output.len(), "output_token_logprobs": triples}}))
    });
    sse(chunks.boxed())
}

async fn abort_request(State(state): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    if body["abort_all"] == true {
        panic!("the fleet never aborts everything on a worker");
    }
    state.abort(body["rid"].as_str().unwrap_or_default());
    StatusCode::OK.into_response()
}
