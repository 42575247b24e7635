//! The request side every sampling endpoint shares: the sampling fields of vLLM's and SGLang's APIs parsed into one
//! [`SamplingPlan`] (the core's raw fields plus this front's text options), and [`start`], which turns the prompts of
//! one HTTP request into one validated core request each and starts them through `Coordinator::sample` — the one
//! gate every front reuses: a request for a paused adapter is held there until it reopens.
//!
//! Every sampling field the clients send is either implemented (by the engine's sampler or this front's text
//! handling), accepted where its value changes nothing, or refused with 400 naming it: a field is never ignored
//! silently, since a trainer's logprobs would then be wrong.

mod sglang;
mod stop_strings;
mod vllm;

use std::sync::Arc;

use futures::future::try_join_all;
use loragate_core::{Action, Principal, RawSampleRequest, SampleRequest};
use serde_json::Value;

pub(crate) use self::sglang::SglangSampling;
pub(crate) use self::stop_strings::StopStrings;
pub(crate) use self::vllm::VllmSampling;
use crate::error::{Api, HttpError};
use crate::output::{Choices, Part, TextOptions};
use crate::server::HttpFront;

/// OpenAI's, vLLM's and SGLang's default temperature (the core's own default, for gRPC, is 0: greedy).
const DEFAULT_TEMPERATURE: f32 = 1.0;

/// What an endpoint asks of each of its prompts, parsed but not yet validated by the core.
#[derive(Clone, Debug, Default)]
pub(crate) struct SamplingPlan {
    /// The core's fields, except the request id, the adapter and the prompt (set per prompt by [`start`]).
    pub(crate) params: RawSampleRequest,
    /// How this front renders the text.
    pub(crate) text: TextOptions,
}

/// One prompt of an HTTP request.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PromptSpec {
    /// The core request's id (empty: the core makes one).
    pub(crate) request_id: String,
    /// The adapter (empty: the base model).
    pub(crate) lora_name: String,
    /// The prompt.
    pub(crate) token_ids: Vec<u32>,
}

/// The started core requests of one HTTP request, in prompt order.
pub(crate) struct Started {
    /// Their outputs, to render.
    pub(crate) parts: Vec<Part>,
    /// Each prompt's request id.
    pub(crate) request_ids: Vec<String>,
    /// Each prompt's tokens.
    pub(crate) prompts: Vec<Arc<[u32]>>,
}

impl Started {
    /// The prompt tokens of every prompt together (for `usage`).
    pub(crate) fn prompt_tokens(&self) -> usize {
        self.prompts.iter().map(|prompt| prompt.len()).sum()
    }
}

/// Validates one core request per prompt and checks that `caller` may sample each one's adapter (every one before
/// any starts, so a bad prompt in a batch starts nothing), then admits and starts them all together: each waits at
/// its adapter's gate within the server's gate deadline. If one fails, the others are dropped, which cancels them.
pub(crate) async fn start(
    front: &HttpFront,
    caller: &Principal,
    prompts: Vec<PromptSpec>,
    plan: SamplingPlan,
    api: Api,
) -> Result<Started, HttpError> {
    let coordinator = front.coordinator();
    let requests = prompts
        .into_iter()
        .map(|prompt| {
            let raw = RawSampleRequest {
                request_id: prompt.request_id,
                lora_name: prompt.lora_name,
                prompt_token_ids: prompt.token_ids,
                ..plan.params.clone()
            };
            coordinator.parse_sample(raw)
        })
        .collect::<Result<Vec<SampleRequest>, _>>()
        .map_err(|err| HttpError::in_api(err, api))?;
    for request in &requests {
        caller.authorize(Action::Sample, request.adapter()).map_err(|err| HttpError::in_api(err, api))?;
    }
    let deadline = coordinator.gate_deadline(None);
    let request_ids = requests.iter().map(|request| request.id().to_string()).collect();
    let prompts: Vec<Arc<[u32]>> = requests.iter().map(|request| request.prompt().clone()).collect();
    let num_samples = requests.first().map_or(1, SampleRequest::num_samples);
    let streams = try_join_all(requests.into_iter().map(|request| coordinator.sample(request, deadline)))
        .await
        .map_err(|err| HttpError::in_api(err, api))?;
    let options = Arc::new(plan.text);
    let parts = streams
        .into_iter()
        .zip(&prompts)
        .enumerate()
        .map(|(index, (samples, prompt))| {
            let choices = Choices::new(front.codec().clone(), options.clone(), index, prompt.clone(), num_samples);
            Part::new(choices, samples)
        })
        .collect();
    Ok(Started { parts, request_ids, prompts })
}

/// Refuses `value` at `param` unless it is absent, `null`, or one of `neutral` (values that change nothing).
pub(crate) fn refuse_unless_neutral(
    param: &str,
    value: Option<&Value>,
    neutral: &[Value],
    why: &str,
) -> Result<(), HttpError> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(value) if neutral.contains(value) => Ok(()),
        Some(value) => Err(HttpError::invalid(param, format!("{value} is not supported: {why}"))),
    }
}

/// Whether `value` is an empty object or array (a neutral `logit_bias`, `bad_words`, …).
pub(crate) fn is_empty_collection(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}
