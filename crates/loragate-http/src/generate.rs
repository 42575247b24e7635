//! vLLM's token-in/token-out `POST /inference/v1/generate` (SkyRL's `generate()` and `sample()`, prime-rl's training
//! data plane and its `prefill_logprobs`): `token_ids` in, `choices[].token_ids` out, with per-token logprobs as
//! `{"token": "token_id:N", "logprob"}`, vLLM's `prompt_logprobs`, `usage`, and loragate's `segments`.
//!
//! It is not behind the body-buffering submission gate: the body is parsed into a validated request and
//! `Coordinator::sample` holds it at a paused adapter's gate, in its parsed form. `max_tokens` unset means up to the
//! context length (never vLLM's hidden 16).
//!
//! `POST /inference/v1/abort_requests` (vLLM ≥ 0.32, beside `/inference/v1/generate`) aborts requests by the
//! `request_id` a generate response reported, without pausing anything: what a loragate fleet sends a worker.

mod request;
mod response;

use axum::extract::{Extension, State};
use axum::response::Response;
use http::{HeaderMap, StatusCode};
use loragate_core::{Principal, RequestId};
use serde::Deserialize;

use self::request::{GenerateBody, GenerateSampling};
use self::response::{GenerateOptions, GenerateRender};
use crate::completions::caller_request_id;
use crate::error::{Api, HttpError};
use crate::json_body::{JsonBody, JsonValue, parse_value};
use crate::output::{ResponseHeader, StreamOptions, respond, unix_now};
use crate::sampling::{self, PromptSpec, VllmSampling, refuse_unless_neutral};
use crate::server::AppState;

/// Where the sampling fields sit in the body.
const SAMPLING_PARAMS: &str = "sampling_params";

/// The handler of `POST /inference/v1/generate`.
pub(crate) async fn generate(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    headers: HeaderMap,
    JsonValue(body): JsonValue,
) -> Result<Response, HttpError> {
    let front = state.front();
    let created = unix_now();
    let request: GenerateBody = parse_value(&body, "")?;
    refuse_unless_neutral("features", request.features.as_ref(), &[], "multimodal inputs are not supported")?;
    let nested = body.get(SAMPLING_PARAMS).cloned().unwrap_or_else(|| serde_json::json!({}));
    let fields: VllmSampling = parse_value(&nested, SAMPLING_PARAMS)?;
    let extras: GenerateSampling = parse_value(&nested, SAMPLING_PARAMS)?;
    let model = front.model_or_base(request.model)?;
    let token_ids = request.token_ids.ok_or(HttpError::MissingField("token_ids"))?;
    let request_id = match request.request_id {
        Some(id) => id,
        None => caller_request_id(&headers)?,
    };
    let prompt_logprobs = fields.prompt_logprobs;
    let mut plan = fields.into_plan(SAMPLING_PARAMS)?;
    plan.params.top_logprobs = extras.logprobs.unwrap_or(0);
    plan.params.prompt_top_logprobs = prompt_logprobs;
    plan.text.with_logprobs = extras.logprobs.is_some();
    let prompt = PromptSpec { request_id, lora_name: front.lora_name_for(&model).to_owned(), token_ids };
    let started = sampling::start(front, &caller, vec![prompt], plan, Api::Generate).await?;
    let request_id = started.request_ids[0].clone();
    let options = GenerateOptions {
        with_logprobs: extras.logprobs.is_some(),
        prompt_logprobs: prompt_logprobs.is_some(),
        include_usage: StreamOptions::wants_usage(request.stream_options),
    };
    let header = ResponseHeader { id: request_id.clone(), created, model };
    let render = GenerateRender::new(header, front.codec().clone(), options, started.prompt_tokens());
    respond(started.parts, render, request.stream.unwrap_or(false), Some(&request_id)).await
}

/// The body of `POST /inference/v1/abort_requests`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct AbortRequestsBody {
    /// The requests to abort (required; an empty list aborts nothing).
    request_ids: Option<Vec<String>>,
}

/// `POST /inference/v1/abort_requests`: aborts the requests with these ids (across every adapter; each one's generate
/// answers `abort` with its tokens) and answers 200 with an empty body once each was handed back. Nothing is paused.
/// A missing `request_ids` is 400, as in vLLM; unknown ids abort nothing.
pub(crate) async fn abort_requests(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<AbortRequestsBody>,
) -> Result<StatusCode, HttpError> {
    let ids = body.request_ids.ok_or(HttpError::MissingField("request_ids"))?;
    let ids: Vec<RequestId> = ids
        .iter()
        .map(|id| RequestId::parse_or_generate(id))
        .collect::<Result<_, _>>()
        .map_err(|err| HttpError::in_api(err, Api::Generate))?;
    if ids.is_empty() {
        return Ok(StatusCode::OK);
    }
    let report = state.front().coordinator().abort_requests(&ids).await;
    if !report.unacknowledged.is_empty() {
        tracing::warn!(unacknowledged = ?report.unacknowledged, "abort_requests: not every request was handed back in time");
    }
    Ok(StatusCode::OK)
}
