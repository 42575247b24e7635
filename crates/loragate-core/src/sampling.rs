//! Sampling requests: the raw form fronts fill in, and the validated form everything past the edge accepts.

use crate::contract::{
    AdapterKey, AdapterName, AdapterVersion, CoreError, Field, FinishReason, ModelInfo, RequestId, VersionWanted,
};
use std::sync::Arc;

use crate::auth::Principal;

/// The most sequences one request may ask for.
pub const MAX_NUM_SAMPLES: u32 = 64;

/// The most alternatives (most likely tokens) reported per position, as vLLM's default `max_logprobs`.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// The most stop token ids one request may give (every front: they are checked against every sampled token).
pub const MAX_STOP_TOKEN_IDS: usize = 256;

/// The longest `cache_salt`, in bytes.
pub const MAX_CACHE_SALT_BYTES: usize = 1024;

/// The range of OpenAI's presence and frequency penalties.
const PENALTY_RANGE: std::ops::RangeInclusive<f32> = -2.0..=2.0;

/// A sampling request as a front received it, before validation. Mirrors the gRPC `SampleRequest` (whose
/// `SamplingParams` carry every sampling field here); the HTTP fronts fill it from OpenAI, vLLM and SGLang requests,
/// which can also ask for alternatives (`top_logprobs`, `prompt_top_logprobs`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawSampleRequest {
    /// Caller's id; empty to have one made.
    pub request_id: String,
    /// Adapter name; empty for the base model.
    pub lora_name: String,
    /// The prompt.
    pub prompt_token_ids: Vec<u32>,
    /// Most tokens to generate; `None` for "up to the context length".
    pub max_tokens: Option<u32>,
    /// Softmax temperature; 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass; `None` for 1.
    pub top_p: Option<f32>,
    /// Top-k; 0 or -1 disables it.
    pub top_k: i32,
    /// Sampler seed; `None` for a random one.
    pub seed: Option<u64>,
    /// Extra tokens that end a sequence.
    pub stop_token_ids: Vec<u32>,
    /// Keep going past the model's end-of-sequence token.
    pub ignore_eos: bool,
    /// Drop tokens less likely than `min_p` times the most likely one (after temperature); 0 disables it.
    pub min_p: f32,
    /// vLLM's repetition penalty on every token of the prompt and the output so far (> 0; `None` or 1 disables it).
    pub repetition_penalty: Option<f32>,
    /// OpenAI's presence penalty on tokens of the output so far, in [-2, 2]; 0 disables it.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty (per occurrence in the output so far), in [-2, 2]; 0 disables it.
    pub frequency_penalty: f32,
    /// No end-of-sequence or stop token is sampled before this many tokens; 0 disables it.
    pub min_tokens: u32,
    /// Sequences to sample; 0 means 1.
    pub num_samples: u32,
    /// Also return prompt logprobs.
    pub include_prompt_logprobs: bool,
    /// Also report, for each generated token, this many most likely tokens at its position (0: none).
    pub top_logprobs: u32,
    /// Also report, for each prompt token, its rank and this many most likely tokens at its position (implies
    /// prompt logprobs).
    pub prompt_top_logprobs: Option<u32>,
    /// The oldest adapter version that may serve the request; 0 for any.
    pub min_lora_version: u64,
    /// The namespace of the request's cached prefixes (vLLM's `cache_salt`): requests with different salts never
    /// share cached keys and values. `None` or empty: the default namespace.
    pub cache_salt: Option<String>,
}

/// Validated sampling parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    max_tokens: u32,
    temperature: f32,
    top_p: f32,
    top_k: Option<u32>,
    seed: Option<u64>,
    stop_token_ids: Arc<[u32]>,
    ignore_eos: bool,
    min_p: f32,
    repetition_penalty: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    min_tokens: u32,
    top_logprobs: u32,
}

impl SamplingParams {
    /// The generation budget: the requested `max_tokens`, or what the context leaves after the prompt.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// The softmax temperature; 0 means greedy.
    pub fn temperature(&self) -> f32 {
        self.temperature
    }

    /// Whether sampling is greedy (argmax).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Nucleus mass in (0, 1]; 1 disables nucleus filtering.
    pub fn top_p(&self) -> f32 {
        self.top_p
    }

    /// Top-k, if enabled.
    pub fn top_k(&self) -> Option<u32> {
        self.top_k
    }

    /// The sampler seed, if the caller fixed one.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// Tokens that end a sequence besides the model's end-of-sequence tokens.
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_token_ids
    }

    /// Whether the model's end-of-sequence tokens are ignored.
    pub fn ignore_eos(&self) -> bool {
        self.ignore_eos
    }

    /// The min-p threshold in [0, 1]; 0 disables it.
    pub fn min_p(&self) -> f32 {
        self.min_p
    }

    /// vLLM's repetition penalty (> 0); 1 disables it.
    pub fn repetition_penalty(&self) -> f32 {
        self.repetition_penalty
    }

    /// OpenAI's presence penalty; 0 disables it.
    pub fn presence_penalty(&self) -> f32 {
        self.presence_penalty
    }

    /// OpenAI's frequency penalty; 0 disables it.
    pub fn frequency_penalty(&self) -> f32 {
        self.frequency_penalty
    }

    /// Whether any of the three penalties is on.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    /// How many tokens are generated before an end-of-sequence or stop token may be.
    pub fn min_tokens(&self) -> u32 {
        self.min_tokens
    }

    /// How many most likely tokens to report at each generated position (0: none).
    pub fn top_logprobs(&self) -> u32 {
        self.top_logprobs
    }
}

/// A validated sampling request: every field checked against the served model. Only [`SampleRequest::parse`]
/// makes one, so layers past the edge never re-check.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleRequest {
    id: RequestId,
    adapter: AdapterKey,
    prompt: Arc<[u32]>,
    params: SamplingParams,
    num_samples: u32,
    include_prompt_logprobs: bool,
    prompt_top_logprobs: Option<u32>,
    continue_through_abort_pauses: bool,
    /// Which versions of the adapter may serve it.
    wanted: VersionWanted,
    cache_salt: Option<Arc<str>>,
    cache_scope: Option<Arc<str>>,
    /// Who sent it (the only key, besides the admin's, that may read it back once finished).
    owner: Option<Principal>,
}

/// What follows a sequence the core stopped for a pause: a request that continues it, or its end.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Continuation {
    /// Sample the rest: `prompt + tokens so far` with the remaining budget, one sequence (boxed: a request is
    /// large beside a finish reason).
    Request(Box<SampleRequest>),
    /// Nothing is left to sample: its budget is spent, or its last token ends it.
    Finished(FinishReason),
}

impl SampleRequest {
    /// Validates `raw` against `model`. Errors name the first offending field.
    pub fn parse(raw: RawSampleRequest, model: &ModelInfo) -> Result<Self, CoreError> {
        let id = RequestId::parse_or_generate(&raw.request_id)?;
        let adapter = AdapterKey::parse(&raw.lora_name)?;
        let wanted = match (raw.min_lora_version, &adapter) {
            (0, _) => VersionWanted::Any,
            (_, AdapterKey::Base) => {
                return Err(CoreError::invalid(
                    Field::MinLoraVersion,
                    "the base model has no versions; set it only with an adapter's lora_name",
                ));
            }
            (min, AdapterKey::Lora(_)) => VersionWanted::AtLeast(AdapterVersion(min)),
        };
        let prompt = parse_prompt(raw.prompt_token_ids, model)?;
        let max_tokens = parse_max_tokens(raw.max_tokens, prompt.len(), model)?;
        let params = SamplingParams {
            max_tokens,
            temperature: parse_temperature(raw.temperature)?,
            top_p: parse_top_p(raw.top_p)?,
            top_k: parse_top_k(raw.top_k)?,
            seed: raw.seed,
            stop_token_ids: parse_stop_token_ids(raw.stop_token_ids, model)?,
            ignore_eos: raw.ignore_eos,
            min_p: parse_min_p(raw.min_p)?,
            repetition_penalty: parse_repetition_penalty(raw.repetition_penalty)?,
            presence_penalty: parse_penalty(raw.presence_penalty, Field::PresencePenalty)?,
            frequency_penalty: parse_penalty(raw.frequency_penalty, Field::FrequencyPenalty)?,
            min_tokens: parse_min_tokens(raw.min_tokens, max_tokens)?,
            top_logprobs: parse_top_logprobs(raw.top_logprobs, Field::TopLogprobs)?,
        };
        let prompt_top_logprobs =
            raw.prompt_top_logprobs.map(|k| parse_top_logprobs(k, Field::PromptTopLogprobs)).transpose()?;
        let num_samples = match raw.num_samples {
            0 => 1,
            n if n > MAX_NUM_SAMPLES => {
                return Err(CoreError::invalid(Field::NumSamples, format!("is {n}, the limit is {MAX_NUM_SAMPLES}")));
            }
            n => n,
        };
        Ok(Self {
            id,
            adapter,
            prompt,
            params,
            num_samples,
            include_prompt_logprobs: raw.include_prompt_logprobs || prompt_top_logprobs.is_some(),
            prompt_top_logprobs,
            continue_through_abort_pauses: false,
            wanted,
            cache_salt: parse_cache_salt(raw.cache_salt)?,
            cache_scope: None,
            owner: None,
        })
    }

    /// The pin `lora_name` may spell, `NAME@V` (V ≥ 1), as the adapter `NAME` and the version `V`. Whether it is a
    /// pin or the name of an adapter containing `@` is decided by what is loaded ([`SampleRequest::pinned`]).
    pub fn pin_spelled(&self) -> Option<(AdapterName, AdapterVersion)> {
        let name = self.adapter.adapter_name()?.as_str();
        let (base, version) = name.rsplit_once('@')?;
        let version = version.parse::<u64>().ok().filter(|version| *version > 0 && !base.is_empty())?;
        Some((AdapterName::parse(base).ok()?, AdapterVersion(version)))
    }

    /// The same request as a pin of `name` at exactly `version` (what `NAME@V` asks for). A `min_lora_version` above
    /// the pinned version can never be met and is refused.
    pub fn pinned(self, name: AdapterName, version: AdapterVersion) -> Result<Self, CoreError> {
        if let VersionWanted::AtLeast(least) = self.wanted
            && least > version
        {
            return Err(CoreError::invalid(
                Field::MinLoraVersion,
                format!("is {least}, above the version {version} that lora_name pins; nothing could serve it"),
            ));
        }
        Ok(Self { adapter: AdapterKey::Lora(name), wanted: VersionWanted::Exactly(version), ..self })
    }

    /// Says who sent the request: once it finished, only that key (or the admin's) may read it back
    /// ([`crate::Coordinator::finished_request`]). Without an owner, only the admin may.
    pub fn owned_by(mut self, owner: Principal) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Who sent the request, if its front said.
    pub fn owner(&self) -> Option<&Principal> {
        self.owner.as_ref()
    }

    /// Which versions of the adapter may serve the request.
    pub fn wanted(&self) -> VersionWanted {
        self.wanted
    }

    /// The exact version the engine must serve the request with, for a pinned request (`NAME@V`); `None`: the
    /// newest version it holds.
    pub fn pinned_version(&self) -> Option<AdapterVersion> {
        match self.wanted {
            VersionWanted::Exactly(version) => Some(version),
            VersionWanted::Any | VersionWanted::AtLeast(_) => None,
        }
    }

    /// Confines the request's cached prefixes to `scope` (the caller's tenant, with tenant keys): requests of
    /// different scopes never share cached keys and values, whatever their salts. `None`: the shared scope.
    pub fn scope_cache_to(mut self, scope: Option<Arc<str>>) -> Self {
        self.cache_scope = scope;
        self
    }

    /// The request's cache salt, if it gave one.
    pub fn cache_salt(&self) -> Option<&str> {
        self.cache_salt.as_deref()
    }

    /// The scope its cached prefixes are confined to (see [`SampleRequest::scope_cache_to`]).
    pub fn cache_scope(&self) -> Option<&str> {
        self.cache_scope.as_deref()
    }

    /// Asks the core to continue this request's sequences itself after an abort-mode pause too (as it always does
    /// after a keep-mode pause), so its caller never sees `FINISH_REASON_ABORT` from a pause. For fronts whose
    /// clients cannot express an abort (the Tinker SDK). Aborts by unload, by request id and at shutdown still end
    /// the request.
    pub fn continue_through_abort_pauses(mut self) -> Self {
        self.continue_through_abort_pauses = true;
        self
    }

    /// Whether the core continues this request's sequences after abort-mode pauses.
    pub fn continues_through_abort_pauses(&self) -> bool {
        self.continue_through_abort_pauses
    }

    /// How to continue sequence `sequence` after it was stopped with `generated` tokens: `prompt + generated` as a
    /// one-sequence request for the remaining budget (attempt `attempt`, under an id derived from this one), or
    /// its end if nothing is left (a spent budget, or a last token that ends it). Prompt logprobs are never asked
    /// again: they cover the original prompt, from the first attempt.
    pub(crate) fn continuation(
        &self,
        sequence: u32,
        attempt: u32,
        generated: &[u32],
        model: &ModelInfo,
    ) -> Continuation {
        let produced = u32::try_from(generated.len()).unwrap_or(u32::MAX);
        if produced >= self.params.max_tokens {
            return Continuation::Finished(FinishReason::Length);
        }
        if let Some(&last) = generated.last()
            && ((!self.params.ignore_eos && model.eos_token_ids.contains(&last))
                || self.params.stop_token_ids.contains(&last))
        {
            return Continuation::Finished(FinishReason::Stop);
        }
        let prompt: Arc<[u32]> = self.prompt.iter().chain(generated).copied().collect();
        let params = SamplingParams {
            max_tokens: self.params.max_tokens - produced,
            min_tokens: self.params.min_tokens.saturating_sub(produced),
            ..self.params.clone()
        };
        Continuation::Request(Box::new(Self {
            id: self.id.continuation(sequence, attempt),
            adapter: self.adapter.clone(),
            prompt,
            params,
            num_samples: 1,
            include_prompt_logprobs: false,
            prompt_top_logprobs: None,
            continue_through_abort_pauses: self.continue_through_abort_pauses,
            wanted: self.wanted,
            cache_salt: self.cache_salt.clone(),
            cache_scope: self.cache_scope.clone(),
            owner: self.owner.clone(),
        }))
    }

    /// The request's id.
    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// What the request samples from.
    pub fn adapter(&self) -> &AdapterKey {
        &self.adapter
    }

    /// The prompt's tokens.
    pub fn prompt(&self) -> &Arc<[u32]> {
        &self.prompt
    }

    /// How to sample.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// How many sequences to sample (at least 1).
    pub fn num_samples(&self) -> u32 {
        self.num_samples
    }

    /// Whether prompt logprobs are wanted.
    pub fn include_prompt_logprobs(&self) -> bool {
        self.include_prompt_logprobs
    }

    /// With prompt logprobs: whether each prompt token's rank and alternatives are wanted too, and how many
    /// alternatives (`Some(0)`: the rank alone).
    pub fn prompt_top_logprobs(&self) -> Option<u32> {
        self.prompt_top_logprobs
    }
}

fn parse_prompt(tokens: Vec<u32>, model: &ModelInfo) -> Result<Arc<[u32]>, CoreError> {
    if tokens.is_empty() {
        return Err(CoreError::invalid(Field::PromptTokenIds, "must not be empty"));
    }
    if let Some((index, token)) = tokens.iter().enumerate().find(|(_, t)| **t >= model.vocab_size) {
        return Err(CoreError::invalid(
            Field::PromptTokenIds,
            format!("token {token} at index {index} is outside the vocabulary (size {})", model.vocab_size),
        ));
    }
    let context = model.context_length as usize;
    if tokens.len() >= context {
        return Err(CoreError::invalid(
            Field::PromptTokenIds,
            format!("has {} tokens, leaving no room in the {context}-token context", tokens.len()),
        ));
    }
    Ok(tokens.into())
}

fn parse_max_tokens(requested: Option<u32>, prompt_len: usize, model: &ModelInfo) -> Result<u32, CoreError> {
    // The prompt is shorter than the context (checked before), so this never underflows.
    let room = model.context_length - prompt_len as u32;
    match requested {
        None => Ok(room),
        Some(0) => Err(CoreError::invalid(Field::MaxTokens, "must be at least 1 (leave it unset for no limit)")),
        Some(n) if n > room => Err(CoreError::invalid(
            Field::MaxTokens,
            format!(
                "is {n}, but the prompt's {prompt_len} tokens leave room for {room} in the {}-token context",
                model.context_length
            ),
        )),
        Some(n) => Ok(n),
    }
}

fn parse_cache_salt(salt: Option<String>) -> Result<Option<Arc<str>>, CoreError> {
    match salt {
        None => Ok(None),
        Some(salt) if salt.is_empty() => Ok(None),
        Some(salt) if salt.len() > MAX_CACHE_SALT_BYTES => Err(CoreError::invalid(
            Field::CacheSalt,
            format!("has {} bytes, the limit is {MAX_CACHE_SALT_BYTES}", salt.len()),
        )),
        Some(salt) => Ok(Some(salt.into())),
    }
}

fn parse_temperature(temperature: f32) -> Result<f32, CoreError> {
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(CoreError::invalid(Field::Temperature, format!("must be finite and >= 0, got {temperature:?}")));
    }
    Ok(temperature)
}

fn parse_top_p(top_p: Option<f32>) -> Result<f32, CoreError> {
    match top_p {
        None => Ok(1.0),
        Some(p) if p.is_finite() && p > 0.0 && p <= 1.0 => Ok(p),
        Some(p) => Err(CoreError::invalid(Field::TopP, format!("must be in (0, 1], got {p:?}"))),
    }
}

fn parse_top_k(top_k: i32) -> Result<Option<u32>, CoreError> {
    match top_k {
        0 | -1 => Ok(None),
        k if k > 0 => Ok(Some(k as u32)),
        k => Err(CoreError::invalid(Field::TopK, format!("must be positive, or 0 or -1 to disable it, got {k}"))),
    }
}

fn parse_min_p(min_p: f32) -> Result<f32, CoreError> {
    if min_p.is_finite() && (0.0..=1.0).contains(&min_p) {
        Ok(min_p)
    } else {
        Err(CoreError::invalid(Field::MinP, format!("must be in [0, 1], got {min_p:?}")))
    }
}

fn parse_repetition_penalty(penalty: Option<f32>) -> Result<f32, CoreError> {
    match penalty {
        None => Ok(1.0),
        Some(p) if p.is_finite() && p > 0.0 => Ok(p),
        Some(p) => Err(CoreError::invalid(Field::RepetitionPenalty, format!("must be finite and > 0, got {p:?}"))),
    }
}

fn parse_penalty(penalty: f32, field: Field) -> Result<f32, CoreError> {
    if penalty.is_finite() && PENALTY_RANGE.contains(&penalty) {
        Ok(penalty)
    } else {
        Err(CoreError::invalid(field, format!("must be in [-2, 2], got {penalty:?}")))
    }
}

fn parse_min_tokens(min_tokens: u32, max_tokens: u32) -> Result<u32, CoreError> {
    if min_tokens > max_tokens {
        return Err(CoreError::invalid(
            Field::MinTokens,
            format!("is {min_tokens}, more than the {max_tokens} tokens this request may generate"),
        ));
    }
    Ok(min_tokens)
}

fn parse_top_logprobs(k: u32, field: Field) -> Result<u32, CoreError> {
    if k > MAX_TOP_LOGPROBS {
        return Err(CoreError::invalid(field, format!("is {k}, the limit is {MAX_TOP_LOGPROBS}")));
    }
    Ok(k)
}

fn parse_stop_token_ids(mut ids: Vec<u32>, model: &ModelInfo) -> Result<Arc<[u32]>, CoreError> {
    if ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(CoreError::invalid(
            Field::StopTokenIds,
            format!("has {} stop tokens, the limit is {MAX_STOP_TOKEN_IDS}", ids.len()),
        ));
    }
    if let Some(bad) = ids.iter().find(|t| **t >= model.vocab_size) {
        return Err(CoreError::invalid(
            Field::StopTokenIds,
            format!("token {bad} is outside the vocabulary (size {})", model.vocab_size),
        ));
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ModelInfo {
        ModelInfo { vocab_size: 260, context_length: 64, eos_token_ids: vec![257] }
    }

    fn raw() -> RawSampleRequest {
        RawSampleRequest { prompt_token_ids: vec![1, 2, 3], ..Default::default() }
    }

    #[test]
    fn defaults_resolve_to_a_full_context_budget_greedy_single_sample() {
        let req = SampleRequest::parse(raw(), &model()).expect("valid");
        assert_eq!(req.params().max_tokens(), 61);
        assert!(req.params().is_greedy());
        assert_eq!(req.params().top_p(), 1.0);
        assert_eq!(req.params().top_k(), None);
        assert_eq!(req.num_samples(), 1);
        assert_eq!(req.adapter(), &AdapterKey::Base);
        assert!(!req.id().as_str().is_empty());
    }

    #[test]
    fn each_bad_value_is_rejected_naming_its_field() {
        let cases: Vec<(RawSampleRequest, Field)> = vec![
            (RawSampleRequest { prompt_token_ids: vec![], ..raw() }, Field::PromptTokenIds),
            (RawSampleRequest { prompt_token_ids: vec![1, 260], ..raw() }, Field::PromptTokenIds),
            (RawSampleRequest { prompt_token_ids: vec![1; 64], ..raw() }, Field::PromptTokenIds),
            (RawSampleRequest { max_tokens: Some(0), ..raw() }, Field::MaxTokens),
            (RawSampleRequest { max_tokens: Some(62), ..raw() }, Field::MaxTokens),
            (RawSampleRequest { temperature: -0.5, ..raw() }, Field::Temperature),
            (RawSampleRequest { temperature: f32::NAN, ..raw() }, Field::Temperature),
            (RawSampleRequest { top_p: Some(0.0), ..raw() }, Field::TopP),
            (RawSampleRequest { top_p: Some(1.5), ..raw() }, Field::TopP),
            (RawSampleRequest { top_k: -2, ..raw() }, Field::TopK),
            (RawSampleRequest { stop_token_ids: vec![999], ..raw() }, Field::StopTokenIds),
            (RawSampleRequest { stop_token_ids: vec![1; MAX_STOP_TOKEN_IDS + 1], ..raw() }, Field::StopTokenIds),
            (RawSampleRequest { min_p: 1.5, ..raw() }, Field::MinP),
            (RawSampleRequest { min_p: -0.1, ..raw() }, Field::MinP),
            (RawSampleRequest { repetition_penalty: Some(0.0), ..raw() }, Field::RepetitionPenalty),
            (RawSampleRequest { repetition_penalty: Some(f32::INFINITY), ..raw() }, Field::RepetitionPenalty),
            (RawSampleRequest { presence_penalty: 2.5, ..raw() }, Field::PresencePenalty),
            (RawSampleRequest { frequency_penalty: -3.0, ..raw() }, Field::FrequencyPenalty),
            (RawSampleRequest { frequency_penalty: f32::NAN, ..raw() }, Field::FrequencyPenalty),
            (RawSampleRequest { min_tokens: 62, ..raw() }, Field::MinTokens),
            (RawSampleRequest { min_tokens: 5, max_tokens: Some(4), ..raw() }, Field::MinTokens),
            (RawSampleRequest { top_logprobs: MAX_TOP_LOGPROBS + 1, ..raw() }, Field::TopLogprobs),
            (RawSampleRequest { prompt_top_logprobs: Some(21), ..raw() }, Field::PromptTopLogprobs),
            (RawSampleRequest { num_samples: MAX_NUM_SAMPLES + 1, ..raw() }, Field::NumSamples),
            (RawSampleRequest { lora_name: "two words".into(), ..raw() }, Field::LoraName),
            (RawSampleRequest { request_id: "x".repeat(300), ..raw() }, Field::RequestId),
            (RawSampleRequest { cache_salt: Some("s".repeat(MAX_CACHE_SALT_BYTES + 1)), ..raw() }, Field::CacheSalt),
        ];
        for (request, field) in cases {
            match SampleRequest::parse(request.clone(), &model()) {
                Err(CoreError::InvalidArgument { field: got, .. }) => {
                    assert_eq!(got, field, "{request:?}")
                }
                other => panic!("{request:?} gave {other:?}, expected an error on {field}"),
            }
        }
    }

    #[test]
    fn the_extended_sampling_fields_default_to_off_and_keep_their_values() {
        let plain = SampleRequest::parse(raw(), &model()).expect("valid");
        let params = plain.params();
        assert_eq!(
            (params.min_p(), params.repetition_penalty(), params.min_tokens(), params.top_logprobs()),
            (0.0, 1.0, 0, 0)
        );
        assert!(!params.has_penalties());
        assert_eq!((plain.include_prompt_logprobs(), plain.prompt_top_logprobs()), (false, None));

        let tuned = RawSampleRequest {
            min_p: 0.05,
            repetition_penalty: Some(1.2),
            presence_penalty: 0.5,
            frequency_penalty: -0.5,
            min_tokens: 61,
            top_logprobs: MAX_TOP_LOGPROBS,
            prompt_top_logprobs: Some(0),
            ..raw()
        };
        let tuned = SampleRequest::parse(tuned, &model()).expect("valid");
        let params = tuned.params();
        assert_eq!((params.min_p(), params.repetition_penalty()), (0.05, 1.2));
        assert_eq!((params.presence_penalty(), params.frequency_penalty()), (0.5, -0.5));
        assert_eq!((params.min_tokens(), params.top_logprobs()), (61, MAX_TOP_LOGPROBS));
        assert!(params.has_penalties());
        assert_eq!(
            (tuned.include_prompt_logprobs(), tuned.prompt_top_logprobs()),
            (true, Some(0)),
            "asking for prompt alternatives asks for prompt logprobs"
        );
        let neutral = RawSampleRequest { repetition_penalty: Some(1.0), ..raw() };
        assert!(!SampleRequest::parse(neutral, &model()).expect("valid").params().has_penalties());
    }

    #[test]
    fn a_continuation_samples_the_rest_of_the_budget_after_prompt_and_tokens() {
        let raw = RawSampleRequest {
            request_id: "r".into(),
            max_tokens: Some(10),
            num_samples: 3,
            min_tokens: 5,
            prompt_top_logprobs: Some(2),
            cache_salt: Some("salt".into()),
            ..raw()
        };
        let request = SampleRequest::parse(raw, &model())
            .expect("valid")
            .continue_through_abort_pauses()
            .scope_cache_to(Some("tenant-0".into()));
        let Continuation::Request(next) = request.continuation(2, 1, &[7, 8, 9], &model()) else {
            panic!("budget is left")
        };
        assert_eq!(&*next.prompt, &[1, 2, 3, 7, 8, 9]);
        assert_eq!(next.params().max_tokens(), 7);
        assert_eq!(next.num_samples(), 1);
        assert!(!next.include_prompt_logprobs() && next.prompt_top_logprobs().is_none());
        assert_eq!(next.params().min_tokens(), 2, "the tokens already produced count towards min_tokens");
        assert!(next.continues_through_abort_pauses());
        assert_eq!((next.cache_salt(), next.cache_scope()), (Some("salt"), Some("tenant-0")), "the same cache");
        assert_ne!(next.id(), request.id(), "the engine sees a fresh id per continuation");
        assert_eq!(request.continuation(0, 1, &[5; 10], &model()), Continuation::Finished(FinishReason::Length));
        assert_eq!(request.continuation(0, 1, &[5, 257], &model()), Continuation::Finished(FinishReason::Stop));
    }

    #[test]
    fn an_empty_cache_salt_is_no_salt() {
        let empty = RawSampleRequest { cache_salt: Some(String::new()), ..raw() };
        assert_eq!(SampleRequest::parse(empty, &model()).expect("valid").cache_salt(), None);
        let salted = RawSampleRequest { cache_salt: Some("a".into()), ..raw() };
        assert_eq!(SampleRequest::parse(salted, &model()).expect("valid").cache_salt(), Some("a"));
    }

    #[test]
    fn max_tokens_up_to_the_room_left_is_accepted() {
        let req = SampleRequest::parse(RawSampleRequest { max_tokens: Some(61), ..raw() }, &model()).expect("valid");
        assert_eq!(req.params().max_tokens(), 61);
    }
}
