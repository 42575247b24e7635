//! `POST /v1/completions`, OpenAI-compatible. Requests reach this handler through the submission gate, which
//! already held them while their adapter was paused.
//!
//! Data flow: the JSON body → [`CompletionBody`] (this API's forms) → the core's [`RawSampleRequest`] (text prompts
//! encoded by the [`TextCodec`](crate::TextCodec)) → [`Coordinator::parse_sample`](loragate_core::Coordinator),
//! which validates → `Coordinator::sample` → the core's events → [`Choices`] (text, stop strings, logprobs) → one
//! JSON response, or server-sent events.

mod choice;
pub(crate) mod decode;
mod request;
mod response;
pub(crate) mod stop;
mod stream;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Json, Response};
use futures::StreamExt;
use http::{HeaderMap, HeaderValue};
use loragate_core::{GateDeadline, RawSampleRequest, SampleRequest, SampleStream};

use self::choice::Choices;
use self::request::{CompletionBody, Prompt};
use self::response::{CompletionHeader, UnaryCompletion};
use crate::error::HttpError;
use crate::json_body::JsonBody;
use crate::server::{AppState, HttpFront};

/// The caller's request id header: the id aborts report, echoed in the response (`id` is `cmpl-<id>`).
pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";

/// OpenAI's default temperature (the core's own default, for gRPC, is 0: greedy).
const DEFAULT_TEMPERATURE: f32 = 1.0;

/// A completion request, validated and ready to sample.
struct Plan {
    sample: SampleRequest,
    model: String,
    stops: Arc<[String]>,
    with_logprobs: bool,
    stream: bool,
}

impl Plan {
    /// Turns the body into a validated core request (the core checks every sampling value).
    fn parse(front: &HttpFront, body: CompletionBody, request_id: String) -> Result<Self, HttpError> {
        let model = body.model.ok_or(HttpError::MissingField("model"))?;
        if model.is_empty() {
            return Err(HttpError::InvalidField {
                param: "model",
                reason: format!("must name the base model ({:?}) or a loaded adapter", front.served_model_name()),
            });
        }
        let prompt_token_ids = match body.prompt.ok_or(HttpError::MissingField("prompt"))? {
            Prompt::Text(text) => {
                front.codec().encode(&text).map_err(|reason| HttpError::InvalidField { param: "prompt", reason })?
            }
            Prompt::TokenIds(token_ids) => token_ids,
        };
        let raw = RawSampleRequest {
            request_id,
            lora_name: front.lora_name_for(&model).to_owned(),
            prompt_token_ids,
            max_tokens: body.max_tokens,
            temperature: body.temperature.unwrap_or(DEFAULT_TEMPERATURE),
            top_p: body.top_p,
            top_k: body.top_k.unwrap_or(0),
            seed: body.seed,
            stop_token_ids: body.stop_token_ids.unwrap_or_default(),
            ignore_eos: body.ignore_eos.unwrap_or(false),
            num_samples: body.n.map_or(1, NonZeroU32::get),
            include_prompt_logprobs: false,
        };
        let sample = front.coordinator().parse_sample(raw).map_err(HttpError::sampling)?;
        Ok(Self {
            sample,
            model,
            stops: body.stop.map(|stops| stops.0).unwrap_or_default().into(),
            with_logprobs: body.logprobs.is_some(),
            stream: body.stream.unwrap_or(false),
        })
    }
}

/// The handler of `POST /v1/completions`.
pub(crate) async fn create_completion(
    State(state): State<AppState>,
    gate: Option<Extension<GateDeadline>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CompletionBody>,
) -> Result<Response, HttpError> {
    let front = state.front();
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let plan = Plan::parse(front, body, caller_request_id(&headers)?)?;
    let request_id = plan.sample.id().to_string();
    let header = CompletionHeader { id: format!("cmpl-{request_id}"), created, model: plan.model };
    let prompt_tokens = plan.sample.prompt().len();
    let count = plan.sample.num_samples();
    let choices = Choices::new(front.codec().clone(), count, plan.stops, plan.with_logprobs);
    // The gate's deadline, so a request the gate let through waits no longer in total if the adapter closes again.
    let deadline = match gate {
        Some(Extension(deadline)) => deadline,
        None => front.coordinator().gate_deadline(None),
    };
    let samples = front.coordinator().sample(plan.sample, deadline).await.map_err(HttpError::sampling)?;
    let mut response = if plan.stream {
        stream::sse_response(header, choices, samples)
    } else {
        let unary = UnaryCompletion::new(header, prompt_tokens, count, plan.with_logprobs);
        Json(collect(unary, choices, samples).await?.finish()).into_response()
    };
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    Ok(response)
}

/// Drives a request to its end (or until every choice stopped at a stop string, dropping the stream so the engine
/// stops) and gathers the response.
async fn collect(
    mut unary: UnaryCompletion,
    mut choices: Choices,
    mut samples: SampleStream,
) -> Result<UnaryCompletion, HttpError> {
    while !choices.all_finished() {
        let Some(event) = samples.next().await else { break };
        if let Some(delta) = choices.on_event(event.map_err(HttpError::sampling)?) {
            unary.absorb(delta);
        }
    }
    Ok(unary)
}

/// The caller's `X-Request-Id`, or empty to have the core make one.
fn caller_request_id(headers: &HeaderMap) -> Result<String, HttpError> {
    match headers.get(REQUEST_ID_HEADER) {
        None => Ok(String::new()),
        Some(value) => value
            .to_str()
            .map(str::to_owned)
            .map_err(|_| HttpError::InvalidField { param: "X-Request-Id", reason: "must be visible ASCII".to_owned() }),
    }
}
