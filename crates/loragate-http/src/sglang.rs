//! SGLang's native API: `POST /generate` (AReaL's, skyrl-train's, verl's and slime's rollouts), single prompts or
//! batches, answered in SGLang's shape, and `POST /abort_request` (verl's and slime's). Each prompt is one core
//! request (its id the caller's `rid`), sampled through `Coordinator::sample`, so a request for a paused adapter is
//! held at its gate; an aborted one answers 200 with its partial `output_ids`, its logprobs and
//! `finish_reason {"type": "abort"}`. `/abort_request` aborts requests by `rid` (or all of them) without pausing any
//! adapter: new requests keep being admitted.
//!
//! `max_new_tokens` unset means up to the context length (SGLang's own default is 128), as everywhere in loragate.

mod request;
mod response;

use axum::extract::{Extension, State};
use axum::response::Response;
use http::StatusCode;
use loragate_core::{Principal, RequestId};
use serde::Deserialize;
use serde_json::{Value, json};

use self::request::{OneOrMany, SglangBody};
use self::response::{SglangOptions, SglangRender};
use crate::completions::prompt_request_ids;
use crate::error::{Api, HttpError};
use crate::json_body::{JsonValue, OptionalJsonBody, parse_value};
use crate::output::respond;
use crate::sampling::{self, PromptSpec, SglangSampling, is_empty_collection, refuse_unless_neutral};
use crate::server::{AppState, HttpFront};

/// Where the sampling fields sit in the body.
const SAMPLING_PARAMS: &str = "sampling_params";

/// The handler of `POST /generate`.
pub(crate) async fn generate(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    JsonValue(body): JsonValue,
) -> Result<Response, HttpError> {
    let front = state.front();
    let request: SglangBody = parse_value(&body, "")?;
    refuse_out_of_scope(&request)?;
    let nested = match body.get(SAMPLING_PARAMS) {
        None | Some(Value::Null) => json!({}),
        Some(Value::Array(_)) => {
            return Err(HttpError::invalid(SAMPLING_PARAMS, "send one sampling_params object for every prompt"));
        }
        Some(object) => object.clone(),
    };
    let fields: SglangSampling = parse_value(&nested, SAMPLING_PARAMS)?;
    let (prompts, batch) = prompts(front, &request)?;
    let count = prompts.len();
    let lora_names: Vec<Option<String>> = match request.lora_path {
        None => vec![None; count],
        Some(OneOrMany::One(name)) => vec![name; count],
        Some(OneOrMany::Many(names)) => one_per_prompt(names, count, "lora_path")?,
    };
    let lora_names = lora_names.iter().map(|name| front.lora_name_for(name.as_deref().unwrap_or("")).to_owned());
    let request_ids = match request.rid {
        None => prompt_request_ids("", count),
        Some(OneOrMany::One(base)) => prompt_request_ids(&base, count),
        Some(OneOrMany::Many(ids)) => one_per_prompt(ids, count, "rid")?,
    };
    let return_logprob = request.return_logprob.unwrap_or(false);
    let top_logprobs_num = request.top_logprobs_num.unwrap_or(0);
    let logprob_start_len = request
        .logprob_start_len
        .filter(|start| *start >= 0 && return_logprob)
        .map(|start| usize::try_from(start).unwrap_or(usize::MAX));
    let mut plan = fields.into_plan()?;
    plan.params.top_logprobs = if return_logprob { top_logprobs_num } else { 0 };
    plan.params.prompt_top_logprobs = logprob_start_len.map(|_| top_logprobs_num);
    plan.text.with_logprobs = return_logprob;
    let num_samples = plan.params.num_samples.max(1);
    let specs = prompts
        .into_iter()
        .zip(lora_names)
        .zip(request_ids)
        .map(|((token_ids, lora_name), request_id)| PromptSpec { request_id, lora_name, token_ids })
        .collect();
    let started = sampling::start(front, &caller, specs, plan, Api::Sglang).await?;
    let options = SglangOptions {
        return_logprob,
        logprob_start_len,
        top_logprobs_num,
        text_in_logprobs: request.return_text_in_logprobs.unwrap_or(false),
        as_list: batch || num_samples > 1,
    };
    let prompt_lengths = started.prompts.iter().map(|prompt| prompt.len()).collect();
    let render = SglangRender::new(front.codec().clone(), options, started.request_ids.clone(), prompt_lengths);
    respond(started.parts, render, request.stream.unwrap_or(false), None).await
}

/// The body of `POST /abort_request`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct AbortBody {
    /// The request to abort (a `/generate` request's `rid`; an empty one aborts nothing).
    rid: Option<String>,
    /// Abort every admitted request instead.
    abort_all: Option<bool>,
}

/// `POST /abort_request`: aborts the request `rid` (or, with `abort_all`, every admitted request of every adapter)
/// and answers 200 with an empty body once each was handed back, as SGLang does. Nothing is paused: an aborted
/// `/generate` answers `abort` with its tokens, and its resubmission is admitted at once. An unknown `rid` aborts
/// nothing.
pub(crate) async fn abort_request(
    State(state): State<AppState>,
    OptionalJsonBody(body): OptionalJsonBody<AbortBody>,
) -> Result<StatusCode, HttpError> {
    let coordinator = state.front().coordinator();
    let report = if body.abort_all.unwrap_or(false) {
        coordinator.abort_all_requests().await
    } else {
        let Some(rid) = body.rid.filter(|rid| !rid.is_empty()) else {
            return Ok(StatusCode::OK);
        };
        let id = RequestId::parse_or_generate(&rid).map_err(|err| HttpError::in_api(err, Api::Sglang))?;
        coordinator.abort_requests(&[id]).await
    };
    if !report.unacknowledged.is_empty() {
        tracing::warn!(unacknowledged = ?report.unacknowledged, "abort_request: not every request was handed back in time");
    }
    tracing::debug!(aborted = ?report.aborted, kept = ?report.kept, "abort_request");
    Ok(StatusCode::OK)
}

/// The prompts' token ids (text encoded with the tokenizer's special tokens), and whether they came as a batch.
fn prompts(front: &HttpFront, request: &SglangBody) -> Result<(Vec<Vec<u32>>, bool), HttpError> {
    match (&request.input_ids, &request.text) {
        (Some(_), Some(_)) => Err(HttpError::invalid("input_ids", "give input_ids or text, not both")),
        (Some(OneOrMany::One(ids)), None) => Ok((vec![ids.clone()], false)),
        (Some(OneOrMany::Many(batch)), None) if batch.is_empty() => {
            Err(HttpError::invalid("input_ids", "must not be empty"))
        }
        (Some(OneOrMany::Many(batch)), None) => Ok((batch.clone(), true)),
        (None, Some(text)) => {
            let (texts, batch) = match text {
                OneOrMany::One(text) => (vec![text.clone()], false),
                OneOrMany::Many(texts) if texts.is_empty() => {
                    return Err(HttpError::invalid("text", "must hold at least one prompt"));
                }
                OneOrMany::Many(texts) => (texts.clone(), true),
            };
            let encoded = texts
                .iter()
                .map(|text| front.codec().encode(text, true).map_err(|reason| HttpError::invalid("text", reason)))
                .collect::<Result<_, _>>()?;
            Ok((encoded, batch))
        }
        (None, None) => Err(HttpError::MissingField("input_ids")),
    }
}

/// A list with one entry per prompt.
fn one_per_prompt<T>(values: Vec<T>, count: usize, param: &str) -> Result<Vec<T>, HttpError> {
    if values.len() != count {
        return Err(HttpError::invalid(param, format!("has {} entries for {count} prompts", values.len())));
    }
    Ok(values)
}

/// Refuses what this server cannot honour unless its value is neutral.
fn refuse_out_of_scope(request: &SglangBody) -> Result<(), HttpError> {
    if let Some(images) = request.image_data.as_ref().filter(|images| !images.is_null() && !is_empty_collection(images))
    {
        let images_only_null = images.as_array().is_some_and(|items| items.iter().all(Value::is_null));
        if !images_only_null {
            return Err(HttpError::invalid("image_data", "images are not supported"));
        }
    }
    refuse_unless_neutral(
        "custom_logit_processor",
        request.custom_logit_processor.as_ref(),
        &[],
        "loragate runs no custom logit processors",
    )?;
    refuse_unless_neutral(
        "token_ids_logprob",
        request.token_ids_logprob.as_ref(),
        &[],
        "logprobs of chosen tokens are not implemented",
    )?;
    refuse_unless_neutral(
        "return_hidden_states",
        request.return_hidden_states.as_ref(),
        &[json!(false)],
        "hidden states are not returned",
    )?;
    refuse_unless_neutral(
        "return_routed_experts",
        request.return_routed_experts.as_ref(),
        &[json!(false)],
        "the served model has no experts",
    )
}
