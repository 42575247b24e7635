//! vLLM's sampling fields (OpenAI's plus vLLM's extensions): flat in `/v1/completions` and `/v1/chat/completions`
//! bodies, nested under `sampling_params` in `/inference/v1/generate`. Parsed once here for all three.

use std::num::NonZeroU32;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::StopStrings;
use super::{
    SamplingPlan, SharedSampling, VLLM_NEUTRAL_REQUEST_FIELDS, VLLM_NEUTRAL_SAMPLING_FIELDS, is_empty_collection,
    refuse_unless_neutral,
};
use crate::error::HttpError;
use crate::json_body::{JsonObject, ParseBody, field_names};

/// A flat body of one of vLLM's OpenAI APIs as it arrives (`/v1/completions`, `/v1/chat/completions`): the API's own
/// fields `B` and the sampling fields the APIs share. Any other key is refused, but for the fields the clients send
/// that change nothing.
pub(crate) struct VllmRequest<B> {
    /// The API's own fields.
    pub(crate) body: B,
    /// The shared sampling fields.
    pub(crate) fields: VllmSampling,
}

impl<B: DeserializeOwned> ParseBody for VllmRequest<B> {
    fn parse_body(bytes: &[u8]) -> Result<Self, HttpError> {
        let known = [
            field_names::<B>(),
            field_names::<VllmSampling>(),
            VLLM_NEUTRAL_SAMPLING_FIELDS,
            VLLM_NEUTRAL_REQUEST_FIELDS,
        ];
        let mut object = JsonObject::parse(bytes, &known)?;
        Ok(Self { body: object.take()?, fields: object.take()? })
    }
}

/// vLLM's sampling fields (unknown fields are refused by each endpoint, which knows which fields it accepts without
/// effect); the fields that would change sampling in ways
/// loragate does not implement are kept as raw values to be refused unless neutral.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct VllmSampling {
    /// Choices per prompt.
    n: Option<NonZeroU32>,
    /// Most tokens to generate; absent or null for "up to the context length".
    max_tokens: Option<u32>,
    /// Softmax temperature; absent means 1.
    temperature: Option<f32>,
    /// Nucleus mass.
    top_p: Option<f32>,
    /// Top-k; -1 or 0 disables it.
    top_k: Option<i32>,
    /// Min-p; 0 disables it.
    min_p: Option<f32>,
    /// Sampler seed.
    seed: Option<u64>,
    /// Strings that end a choice.
    stop: Option<StopStrings>,
    /// Extra tokens that end a choice.
    stop_token_ids: Option<Vec<u32>>,
    /// Keep going past the end-of-sequence token.
    ignore_eos: Option<bool>,
    /// No end-of-sequence, stop token or stop string before this many tokens.
    min_tokens: Option<u32>,
    /// OpenAI's presence penalty.
    presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty.
    frequency_penalty: Option<f32>,
    /// vLLM's repetition penalty.
    repetition_penalty: Option<f32>,
    /// Keep a matched stop string in the text.
    include_stop_str_in_output: Option<bool>,
    /// Alternatives per prompt token (`null`: no prompt logprobs).
    pub(crate) prompt_logprobs: Option<u32>,
    use_beam_search: Option<Value>,
    best_of: Option<Value>,
    length_penalty: Option<Value>,
    logit_bias: Option<Value>,
    allowed_token_ids: Option<Value>,
    bad_words: Option<Value>,
    logits_processors: Option<Value>,
    truncate_prompt_tokens: Option<Value>,
    guided_json: Option<Value>,
    guided_regex: Option<Value>,
    guided_choice: Option<Value>,
    guided_grammar: Option<Value>,
    structured_outputs: Option<Value>,
}

impl VllmSampling {
    /// Choices per prompt.
    pub(crate) fn n(&self) -> u32 {
        self.n.map_or(1, NonZeroU32::get)
    }

    /// Overrides `max_tokens` (chat's `max_completion_tokens` takes precedence over it).
    pub(crate) fn set_max_tokens(&mut self, max_tokens: Option<u32>) {
        if max_tokens.is_some() {
            self.max_tokens = max_tokens;
        }
    }

    /// The plan these fields describe; `at` is where they sit in the body (`""` or `"sampling_params"`), for naming
    /// a refused field.
    pub(crate) fn into_plan(self, at: &str) -> Result<SamplingPlan, HttpError> {
        self.refuse_unsupported(at)?;
        let shared = SharedSampling {
            max_tokens: self.max_tokens,
            min_tokens: self.min_tokens,
            seed: self.seed,
            include_stop_str: self.include_stop_str_in_output,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            stop: self.stop,
            stop_token_ids: self.stop_token_ids,
            ignore_eos: self.ignore_eos,
            n: self.n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
        };
        // vLLM's "no top-k" is 0 (it takes -1 too).
        Ok(shared.into_plan(0))
    }

    fn refuse_unsupported(&self, at: &str) -> Result<(), HttpError> {
        let name = |field: &str| if at.is_empty() { field.to_owned() } else { format!("{at}.{field}") };
        let n = json!(self.n());
        let refusals: [(&str, &Option<Value>, Vec<Value>, &str); 5] = [
            ("use_beam_search", &self.use_beam_search, vec![json!(false)], "loragate samples, it does not search"),
            ("best_of", &self.best_of, vec![n], "every sampled sequence is returned (ask for n instead)"),
            ("length_penalty", &self.length_penalty, vec![json!(1), json!(1.0)], "it applies to beam search only"),
            ("truncate_prompt_tokens", &self.truncate_prompt_tokens, Vec::new(), "prompts are never truncated"),
            ("structured_outputs", &self.structured_outputs, Vec::new(), "constrained decoding is not implemented"),
        ];
        for (field, value, neutral, why) in &refusals {
            refuse_unless_neutral(&name(field), value.as_ref(), neutral, why)?;
        }
        let token_filters = [
            ("logit_bias", &self.logit_bias),
            ("allowed_token_ids", &self.allowed_token_ids),
            ("bad_words", &self.bad_words),
            ("logits_processors", &self.logits_processors),
        ];
        for (field, value) in token_filters {
            if let Some(value) = value.as_ref().filter(|value| !value.is_null() && !is_empty_collection(value)) {
                let reason = format!("{value} is not supported: loragate applies no per-token biases or filters");
                return Err(HttpError::invalid(name(field), reason));
            }
        }
        let guided = [
            ("guided_json", &self.guided_json),
            ("guided_regex", &self.guided_regex),
            ("guided_choice", &self.guided_choice),
            ("guided_grammar", &self.guided_grammar),
        ];
        for (field, value) in guided {
            refuse_unless_neutral(&name(field), value.as_ref(), &[], "constrained decoding is not implemented")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_body::parse_value;

    fn plan(json: Value) -> Result<SamplingPlan, HttpError> {
        parse_value::<VllmSampling>(&json, "")?.into_plan("")
    }

    fn refused(json: Value, at: &str) -> String {
        let err = parse_value::<VllmSampling>(&json, at).and_then(|fields| fields.into_plan(at)).expect_err("refused");
        err.param().expect("names a field")
    }

    #[test]
    fn skyrls_fields_are_accepted_and_implemented() {
        let skyrl = json!({"min_tokens": 1, "skip_special_tokens": true, "include_stop_str_in_output": true,
            "max_tokens": 1024, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "logprobs": 1,
            "stop": null, "output_kind": 2, "repetition_penalty": 1.1});
        let plan = plan(skyrl).expect("accepted");
        let params = &plan.params;
        assert_eq!((params.max_tokens, params.min_tokens, params.top_k, params.min_p), (Some(1024), 1, -1, 0.0));
        assert_eq!((params.temperature, params.top_p, params.repetition_penalty), (1.0, Some(1.0), Some(1.1)));
        assert!(plan.text.include_stop_str && plan.text.stops.is_empty());
        assert_eq!(plan.text.min_tokens, 1, "stop strings wait for min_tokens too");
    }

    #[test]
    fn areals_neutral_values_are_accepted() {
        let areal = json!({"top_p": 1.0, "top_k": 100000000, "max_tokens": 8, "temperature": 0.7,
            "stop_token_ids": [], "ignore_eos": false, "skip_special_tokens": true,
            "return_tokens_as_token_ids": true, "logprobs": 0, "use_beam_search": false, "stream": false,
            "best_of": 1, "logit_bias": {}, "length_penalty": 1.0, "bad_words": []});
        let plan = plan(areal).expect("accepted");
        assert_eq!((plan.params.top_k, plan.params.temperature), (100_000_000, 0.7));
        let defaults = plan_of_nothing();
        assert_eq!(
            (defaults.params.temperature, defaults.params.max_tokens, defaults.params.num_samples),
            (1.0, None, 1)
        );
    }

    fn plan_of_nothing() -> SamplingPlan {
        plan(json!({})).expect("empty is fine")
    }

    #[test]
    fn fields_that_would_change_sampling_unimplemented_are_refused_by_name() {
        assert_eq!(refused(json!({"use_beam_search": true}), ""), "use_beam_search");
        assert_eq!(refused(json!({"best_of": 3, "n": 2}), ""), "best_of");
        assert_eq!(refused(json!({"logit_bias": {"5": 10}}), ""), "logit_bias");
        assert_eq!(
            refused(json!({"guided_json": {"type": "object"}}), "sampling_params"),
            "sampling_params.guided_json"
        );
        assert_eq!(refused(json!({"allowed_token_ids": [1, 2]}), ""), "allowed_token_ids");
        assert_eq!(refused(json!({"min_tokens": -1}), "sampling_params"), "sampling_params.min_tokens");
        assert_eq!(refused(json!({"stop": [""]}), ""), "stop");
    }
}
