//! vLLM's token-in/token-out `POST /inference/v1/generate` (SkyRL's `generate()` and `sample()`, prime-rl's training
//! data plane and its `prefill_logprobs`): `token_ids` in, `choices[].token_ids` out, with per-token logprobs as
//! `{"token": "token_id:N", "logprob"}`, vLLM's `prompt_logprobs`, `usage`, and loragate's `segments`.
//!
//! The body is parsed (strictly: unknown fields are refused, at the top level and in `sampling_params`) into a
//! validated request, and `Coordinator::sample` holds it at a paused adapter's gate, in its parsed form. `max_tokens` unset means up to the
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
use crate::front::HttpFront;
use crate::json_body::{JsonBody, JsonObject, ParseBody, Parsed, field_names};
use crate::output::{ResponseHeader, StreamOptions, respond, unix_now};
use crate::sampling::{
    self, PromptSpec, SamplingPlan, VLLM_NEUTRAL_SAMPLING_FIELDS, VllmSampling, refuse_unless_neutral,
};
use crate::state::AppState;

/// Where the sampling fields sit in the body.
const SAMPLING_PARAMS: &str = "sampling_params";

/// vLLM's request fields accepted without effect on this endpoint: the OpenAI ones, and `kv_transfer_params`
/// (disaggregated serving; there is nothing to transfer).
const NEUTRAL_REQUEST_FIELDS: &[&str] = &["priority", "user", "kv_transfer_params"];

/// A generate body as it arrives: this endpoint's own fields, and under `sampling_params` the sampling fields it
/// shares with vLLM's other APIs plus its own `logprobs`. Any other key is refused, at either level, but for the
/// fields the clients send that change nothing.
pub(crate) struct GenerateRequest {
    body: GenerateBody,
    fields: VllmSampling,
    extras: GenerateSampling,
}

impl ParseBody for GenerateRequest {
    fn parse_body(bytes: &[u8]) -> Result<Self, HttpError> {
        let known = [field_names::<GenerateBody>(), &[SAMPLING_PARAMS], NEUTRAL_REQUEST_FIELDS];
        let mut object = JsonObject::parse(bytes, &known)?;
        let nested_known =
            [field_names::<VllmSampling>(), field_names::<GenerateSampling>(), VLLM_NEUTRAL_SAMPLING_FIELDS];
        let mut nested = JsonObject::nested(object.take_value(SAMPLING_PARAMS), SAMPLING_PARAMS, &nested_known)?;
        Ok(Self { body: object.take()?, fields: nested.take()?, extras: nested.take()? })
    }
}

/// A generate request, ready to start: nothing of its body is left.
struct Plan {
    prompt: PromptSpec,
    sampling: SamplingPlan,
    model: String,
    options: GenerateOptions,
    stream: bool,
}

impl Plan {
    fn parse(front: &HttpFront, request: GenerateRequest, headers: &HeaderMap) -> Result<Self, HttpError> {
        let GenerateRequest { body, fields, extras } = request;
        refuse_unless_neutral("features", body.features.as_ref(), &[], "multimodal inputs are not supported")?;
        let model = front.model_or_base(body.model)?;
        let token_ids = body.token_ids.ok_or(HttpError::MissingField("token_ids"))?;
        let request_id = match body.request_id {
            Some(id) => id,
            None => caller_request_id(headers)?,
        };
        let prompt_logprobs = fields.prompt_logprobs;
        let mut sampling = fields.into_plan(SAMPLING_PARAMS)?;
        sampling.params.top_logprobs = extras.logprobs.unwrap_or(0);
        sampling.params.prompt_top_logprobs = prompt_logprobs;
        sampling.params.cache_salt = body.cache_salt;
        sampling.text.with_logprobs = extras.logprobs.is_some();
        sampling.params.min_lora_version = body.min_lora_version.unwrap_or(0);
        let options = GenerateOptions {
            with_logprobs: extras.logprobs.is_some(),
            prompt_logprobs: prompt_logprobs.is_some(),
            include_usage: StreamOptions::wants_usage(body.stream_options),
        };
        let prompt = PromptSpec { request_id, lora_name: front.lora_name_for(&model).to_owned(), token_ids };
        Ok(Self { prompt, sampling, model, options, stream: body.stream.unwrap_or(false) })
    }
}

/// The handler of `POST /inference/v1/generate`.
pub(crate) async fn generate(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    headers: HeaderMap,
    Parsed(request): Parsed<GenerateRequest>,
) -> Result<Response, HttpError> {
    let front = state.front();
    let created = unix_now();
    // The request is consumed here: only its plan (no part of the body) waits at the gate.
    let plan = Plan::parse(front, request, &headers)?;
    let started = sampling::start(front, &caller, vec![plan.prompt], plan.sampling, Api::Generate).await?;
    let request_id = started.request_ids[0].clone();
    let header = ResponseHeader { id: request_id.clone(), created, model: plan.model };
    let render = GenerateRender::new(header, front.codec().clone(), plan.options, started.prompt_tokens());
    respond(started.parts, render, plan.stream, Some(&request_id)).await
}

/// The body of `POST /inference/v1/abort_requests`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
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
    // The core warns about any request not handed back in time.
    state.front().coordinator().abort_requests(&ids).await;
    Ok(StatusCode::OK)
}
