//! SGLang's native API: `POST /generate` (AReaL's, skyrl-train's, verl's and slime's rollouts), single prompts or
//! batches, answered in SGLang's shape, and `POST /abort_request` (verl's and slime's). Each prompt is one core
//! request (its id the caller's `rid`), sampled through `Coordinator::sample`, so a request for a paused adapter is
//! held at its gate; an aborted one answers 200 with its partial `output_ids`, its logprobs and
//! `finish_reason {"type": "abort"}`. `/abort_request` aborts requests by `rid` (or all of them) without pausing any
//! adapter (new requests keep being admitted) and answers once the cancel was requested, not once the request was
//! handed back.
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
use crate::front::HttpFront;
use crate::json_body::{JsonObject, OptionalJsonBody, ParseBody, Parsed, field_names};
use crate::output::respond;
use crate::sampling::{self, PromptSpec, SamplingPlan, SglangSampling, is_empty_collection, refuse_unless_neutral};
use crate::state::AppState;

/// Where the sampling fields sit in the body.
const SAMPLING_PARAMS: &str = "sampling_params";

/// SGLang sampling fields the clients send whose values change nothing here: `skip_special_tokens` and
/// `spaces_between_special_tokens` (special tokens are never written in the text), `custom_params` (slime's
/// parameters for custom logit processors, which are refused on their own).
const NEUTRAL_SAMPLING_FIELDS: &[&str] = &["skip_special_tokens", "spaces_between_special_tokens", "custom_params"];

/// Top-level fields the clients send whose values change nothing here: `custom_params` (slime's, next to
/// `input_ids`; its custom logit processor parameters, a processor itself being refused on its own).
const NEUTRAL_REQUEST_FIELDS: &[&str] = &["custom_params"];

/// A `/generate` body as it arrives: SGLang's request fields, and its sampling fields under `sampling_params`. Any
/// other key is refused, at either level, but for the fields the clients send that change nothing.
pub(crate) struct SglangRequest {
    body: SglangBody,
    fields: SglangSampling,
}

impl ParseBody for SglangRequest {
    fn parse_body(bytes: &[u8]) -> Result<Self, HttpError> {
        let mut object =
            JsonObject::parse(bytes, &[field_names::<SglangBody>(), &[SAMPLING_PARAMS], NEUTRAL_REQUEST_FIELDS])?;
        let nested = match object.take_value(SAMPLING_PARAMS) {
            Some(Value::Array(_)) => {
                return Err(HttpError::invalid(SAMPLING_PARAMS, "send one sampling_params object for every prompt"));
            }
            other => other,
        };
        let nested_known = [field_names::<SglangSampling>(), NEUTRAL_SAMPLING_FIELDS];
        let mut nested = JsonObject::nested(nested, SAMPLING_PARAMS, &nested_known)?;
        Ok(Self { body: object.take()?, fields: nested.take()? })
    }
}

/// A `/generate` request, its prompts encoded, ready to start: nothing of its body is left.
struct Plan {
    specs: Vec<PromptSpec>,
    sampling: SamplingPlan,
    options: SglangOptions,
    stream: bool,
}

impl Plan {
    fn parse(front: &HttpFront, request: SglangRequest) -> Result<Self, HttpError> {
        let SglangRequest { body, fields } = request;
        refuse_out_of_scope(&body)?;
        let (prompts, batch) = prompts(front, body.input_ids, body.text)?;
        let count = prompts.len();
        let lora_names: Vec<Option<String>> = match body.lora_path {
            None => vec![None; count],
            Some(OneOrMany::One(name)) => vec![name; count],
            Some(OneOrMany::Many(names)) => one_per_prompt(names, count, "lora_path")?,
        };
        let lora_names = lora_names.iter().map(|name| front.lora_name_for(name.as_deref().unwrap_or("")).to_owned());
        let request_ids = match body.rid {
            None => prompt_request_ids("", count),
            Some(OneOrMany::One(base)) => prompt_request_ids(&base, count),
            Some(OneOrMany::Many(ids)) => one_per_prompt(ids, count, "rid")?,
        };
        let return_logprob = body.return_logprob.unwrap_or(false);
        let top_logprobs_num = body.top_logprobs_num.unwrap_or(0);
        let logprob_start_len = body
            .logprob_start_len
            .filter(|start| *start >= 0 && return_logprob)
            .map(|start| usize::try_from(start).unwrap_or(usize::MAX));
        let mut sampling = fields.into_plan()?;
        sampling.params.top_logprobs = if return_logprob { top_logprobs_num } else { 0 };
        sampling.params.prompt_top_logprobs = logprob_start_len.map(|_| top_logprobs_num);
        sampling.params.cache_salt = body.cache_salt;
        sampling.text.with_logprobs = return_logprob;
        sampling.params.min_lora_version = body.min_lora_version.unwrap_or(0);
        let num_samples = sampling.params.num_samples.max(1);
        let specs = prompts
            .into_iter()
            .zip(lora_names)
            .zip(request_ids)
            .map(|((token_ids, lora_name), request_id)| PromptSpec { request_id, lora_name, token_ids })
            .collect();
        let options = SglangOptions {
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            text_in_logprobs: body.return_text_in_logprobs.unwrap_or(false),
            as_list: batch || num_samples > 1,
        };
        Ok(Self { specs, sampling, options, stream: body.stream.unwrap_or(false) })
    }
}

/// The handler of `POST /generate`.
pub(crate) async fn generate(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Parsed(request): Parsed<SglangRequest>,
) -> Result<Response, HttpError> {
    let front = state.front();
    // The request is consumed here: only its plan (no part of the body) waits at the gate.
    let plan = Plan::parse(front, request)?;
    let started = sampling::start(front, &caller, plan.specs, plan.sampling, Api::Sglang).await?;
    let prompt_lengths = started.prompts.iter().map(|prompt| prompt.len()).collect();
    let (request_ids, cached) = (started.request_ids.clone(), started.cached.clone());
    let render = SglangRender::new(front.codec().clone(), plan.options, request_ids, prompt_lengths, cached);
    respond(started.parts, render, plan.stream, None).await
}

/// The body of `POST /abort_request` (strict: another field is a 400 naming it).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AbortBody {
    /// The request to abort (a `/generate` request's `rid`; an empty one aborts nothing).
    rid: Option<String>,
    /// Abort every admitted request instead.
    abort_all: Option<bool>,
}

/// `POST /abort_request`: aborts the request `rid` (or, with `abort_all`, every admitted request of every adapter)
/// and answers 200 with an empty body once the cancel was requested, as SGLang does (its handler forwards the abort
/// to the scheduler and answers at once): the aborted `/generate` acknowledges it by answering `abort` with its
/// tokens. Nothing is paused: its resubmission is admitted at once. An unknown `rid` aborts nothing.
pub(crate) async fn abort_request(
    State(state): State<AppState>,
    OptionalJsonBody(body): OptionalJsonBody<AbortBody>,
) -> Result<StatusCode, HttpError> {
    let coordinator = state.front().coordinator();
    let requested = if body.abort_all.unwrap_or(false) {
        coordinator.request_abort_all().await
    } else {
        let Some(rid) = body.rid.filter(|rid| !rid.is_empty()) else {
            return Ok(StatusCode::OK);
        };
        let id = RequestId::parse_or_generate(&rid).map_err(|err| HttpError::in_api(err, Api::Sglang))?;
        coordinator.request_aborts(&[id]).await
    };
    // The hand-backs are awaited off the answer's path, only to log those that never come.
    tokio::spawn(async move {
        let report = requested.handed_back().await;
        tracing::debug!(aborted = ?report.aborted, kept = ?report.kept, "abort_request");
    });
    Ok(StatusCode::OK)
}

/// The prompts' token ids (text encoded with the tokenizer's special tokens), and whether they came as a batch.
fn prompts(
    front: &HttpFront,
    input_ids: Option<OneOrMany<Vec<u32>>>,
    text: Option<OneOrMany<String>>,
) -> Result<(Vec<Vec<u32>>, bool), HttpError> {
    match (input_ids, text) {
        (Some(_), Some(_)) => Err(HttpError::invalid("input_ids", "give input_ids or text, not both")),
        (Some(OneOrMany::One(ids)), None) => Ok((vec![ids], false)),
        (Some(OneOrMany::Many(batch)), None) if batch.is_empty() => {
            Err(HttpError::invalid("input_ids", "must not be empty"))
        }
        (Some(OneOrMany::Many(batch)), None) => Ok((batch, true)),
        (None, Some(text)) => {
            let (texts, batch) = match text {
                OneOrMany::One(text) => (vec![text], false),
                OneOrMany::Many(texts) if texts.is_empty() => {
                    return Err(HttpError::invalid("text", "must hold at least one prompt"));
                }
                OneOrMany::Many(texts) => (texts, true),
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
