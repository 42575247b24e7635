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

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;

use futures::future::try_join_all;
use loragate_core::{
    Action, AdapterKey, CachedPromptTokens, Field, Limit, Principal, RawSampleRequest, SampleRequest, SampleStream,
};
use serde_json::Value;

pub(crate) use self::sglang::SglangSampling;
pub(crate) use self::stop_strings::StopStrings;
pub(crate) use self::vllm::{VllmRequest, VllmSampling};
use crate::error::{Api, HttpError, wire_name};
use crate::front::HttpFront;
use crate::output::{Choices, Part, PromptTokens, TextOptions};

/// OpenAI's, vLLM's and SGLang's default temperature (the core's own default, for gRPC, is 0: greedy).
const DEFAULT_TEMPERATURE: f32 = 1.0;

/// The most sequences one HTTP request may ask for over all its prompts (prompts × `n`): a batch over it is refused
/// with 400 whatever the server's load, since its cost is out of proportion to its body (1,000 prompts × `n` = 64
/// from a few kilobytes).
pub(crate) const MAX_BATCH_SEQUENCES: usize = 4096;

/// vLLM sampling fields the clients send whose values change nothing here (text is always detokenized, special
/// tokens never written, and the output always whole per chunk): flat in the OpenAI bodies, under
/// `sampling_params` in `/inference/v1/generate`.
pub(crate) const VLLM_NEUTRAL_SAMPLING_FIELDS: &[&str] = &[
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "output_kind",
    "detokenize",
    "routed_experts_prompt_start",
];

/// vLLM request fields the clients send that change nothing here: `priority` (requests are scheduled in arrival
/// order), `user` (OpenAI's end-user tag).
pub(crate) const VLLM_NEUTRAL_REQUEST_FIELDS: &[&str] = &["priority", "user"];

/// What an endpoint asks of each of its prompts, parsed but not yet validated by the core.
#[derive(Clone, Debug, Default)]
pub(crate) struct SamplingPlan {
    /// The core's fields, except the request id, the adapter and the prompt (set per prompt by [`start`]).
    pub(crate) params: RawSampleRequest,
    /// How this front renders the text.
    pub(crate) text: TextOptions,
}

/// The sampling values vLLM's and SGLang's APIs share, under whichever name each family gives them (`max_tokens` or
/// `max_new_tokens`, `seed` or `sampling_seed`, ...): the one place their defaults are applied.
#[derive(Debug)]
pub(crate) struct SharedSampling {
    /// Most tokens to generate; absent for "up to the context length".
    pub(crate) max_tokens: Option<u32>,
    /// No end-of-sequence, stop token or stop string before this many tokens.
    pub(crate) min_tokens: Option<u32>,
    /// Softmax temperature; absent means [`DEFAULT_TEMPERATURE`].
    pub(crate) temperature: Option<f32>,
    /// Nucleus mass.
    pub(crate) top_p: Option<f32>,
    /// Top-k.
    pub(crate) top_k: Option<i32>,
    /// Min-p; 0 disables it.
    pub(crate) min_p: Option<f32>,
    /// Sampler seed.
    pub(crate) seed: Option<u64>,
    /// Strings that end a sequence.
    pub(crate) stop: Option<StopStrings>,
    /// Extra tokens that end a sequence.
    pub(crate) stop_token_ids: Option<Vec<u32>>,
    /// Keep going past the end-of-sequence token.
    pub(crate) ignore_eos: Option<bool>,
    /// Sequences per prompt.
    pub(crate) n: Option<NonZeroU32>,
    /// OpenAI's presence penalty.
    pub(crate) presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty.
    pub(crate) frequency_penalty: Option<f32>,
    /// vLLM's repetition penalty.
    pub(crate) repetition_penalty: Option<f32>,
    /// Keep a matched stop string in the text (vLLM's `include_stop_str_in_output`, SGLang's `no_stop_trim`).
    pub(crate) include_stop_str: Option<bool>,
}

impl SharedSampling {
    /// The plan these values describe; `top_k_off` is the family's `top_k` when none is given (both disable it).
    pub(crate) fn into_plan(self, top_k_off: i32) -> SamplingPlan {
        let min_tokens = self.min_tokens.unwrap_or(0);
        let params = RawSampleRequest {
            max_tokens: self.max_tokens,
            temperature: self.temperature.unwrap_or(DEFAULT_TEMPERATURE),
            top_p: self.top_p,
            top_k: self.top_k.unwrap_or(top_k_off),
            seed: self.seed,
            stop_token_ids: self.stop_token_ids.unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            min_tokens,
            num_samples: self.n.map_or(1, NonZeroU32::get),
            ..RawSampleRequest::default()
        };
        let text = TextOptions {
            stops: self.stop.map(|stops| stops.0).unwrap_or_default().into(),
            include_stop_str: self.include_stop_str.unwrap_or(false),
            min_tokens,
            with_logprobs: false,
        };
        SamplingPlan { params, text }
    }
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
    /// How many of each prompt's tokens the engine found in its prefix cache (known once tokens came).
    pub(crate) cached: Vec<CachedPromptTokens>,
}

impl Started {
    /// The prompt tokens of every prompt together, and the cached ones among them (for `usage`).
    pub(crate) fn prompt_tokens(&self) -> PromptTokens {
        PromptTokens::new(self.prompts.iter().map(|prompt| prompt.len()).sum(), self.cached.clone())
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
    check_batch(front, &prompts, plan.params.num_samples, api)?;
    let requests = prompts
        .into_iter()
        .map(|prompt| {
            let raw = RawSampleRequest {
                request_id: prompt.request_id,
                lora_name: prompt.lora_name,
                prompt_token_ids: prompt.token_ids,
                ..plan.params.clone()
            };
            // With tenant keys, a tenant's cached prefixes are its own; the caller is the request's owner: only it may
            // read the finished request back (GET /v1/requests/{id}).
            coordinator
                .parse_sample(raw)
                .map(|request| request.scope_cache_to(caller.cache_scope()).owned_by(caller.clone()))
        })
        .collect::<Result<Vec<SampleRequest>, _>>()
        .map_err(|err| HttpError::in_api(err, api))?;
    for request in &requests {
        caller.authorize(Action::Sample, request.adapter()).map_err(|err| HttpError::in_api(err, api))?;
    }
    for request in &requests {
        if coordinator.adapter(request.adapter()).is_err() {
            return Err(unknown_model(front, caller, request.adapter(), api).await);
        }
    }
    let deadline = coordinator.gate_deadline(None);
    let request_ids = requests.iter().map(|request| request.id().to_string()).collect();
    let prompts: Vec<Arc<[u32]>> = requests.iter().map(|request| request.prompt().clone()).collect();
    let num_samples = requests.first().map_or(1, SampleRequest::num_samples);
    let streams = try_join_all(requests.into_iter().map(|request| coordinator.sample(request, deadline)))
        .await
        .map_err(|err| HttpError::in_api(err, api))?;
    let options = Arc::new(plan.text);
    let cached = streams.iter().map(SampleStream::cached_prompt_tokens).collect();
    let parts = streams
        .into_iter()
        .zip(&prompts)
        .enumerate()
        .map(|(index, (samples, prompt))| {
            let choices = Choices::new(front.codec().clone(), options.clone(), index, prompt.clone(), num_samples);
            Part::new(choices, samples)
        })
        .collect();
    Ok(Started { parts, request_ids, prompts, cached })
}

/// Refuses a batch that could never be admitted whole (400, not 429: waiting would not help): more prompts than the
/// in-flight caps let in at once (each prompt is one admitted request), or more than [`MAX_BATCH_SEQUENCES`]
/// sequences in all.
fn check_batch(front: &HttpFront, prompts: &[PromptSpec], n: u32, api: Api) -> Result<(), HttpError> {
    let param = wire_name(Field::PromptTokenIds, api);
    let limits = front.coordinator().config().limits;
    let too_many = |cap: u32, flag: &str, counted: &str| HttpError::BatchTooLarge {
        param,
        reason: format!(
            "{} prompts{counted} can never be admitted at once: {flag} is {cap} (send at most {cap} per request)",
            prompts.len()
        ),
    };
    if prompts.len() > limits.max_in_flight as usize {
        return Err(too_many(limits.max_in_flight, Limit::InFlight.flag(), ""));
    }
    if let Some(cap) = limits.max_in_flight_per_adapter {
        let mut per_adapter: HashMap<&str, usize> = HashMap::new();
        for prompt in prompts {
            *per_adapter.entry(prompt.lora_name.as_str()).or_default() += 1;
        }
        if per_adapter.values().any(|&count| count > cap as usize) {
            return Err(too_many(cap, Limit::InFlightPerAdapter.flag(), " of one adapter"));
        }
    }
    let sequences = prompts.len().saturating_mul(n.max(1) as usize);
    if sequences > MAX_BATCH_SEQUENCES {
        return Err(HttpError::BatchTooLarge {
            param,
            reason: format!(
                "{} prompts × n = {} asks for {sequences} sequences; one request may ask for at most \
                 {MAX_BATCH_SEQUENCES}",
                prompts.len(),
                n.max(1)
            ),
        });
    }
    Ok(())
}

/// The 404 for a model nobody serves, listing the served names `caller` may use (the base model first).
async fn unknown_model(front: &HttpFront, caller: &Principal, key: &AdapterKey, api: Api) -> HttpError {
    let mut served = vec![front.served_model_name().to_owned()];
    let adapters = front.coordinator().list_adapters().await;
    served.extend(
        adapters.iter().filter(|status| caller.may_see(&status.key)).map(|status| status.key.as_wire_str().to_owned()),
    );
    HttpError::UnknownModel { param: wire_name(Field::LoraName, api), model: key.as_wire_str().to_owned(), served }
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
