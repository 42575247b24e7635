//! SGLang's sampling fields, under `sampling_params` in its native `POST /generate`, with SGLang's names
//! (`max_new_tokens`, `min_new_tokens`, `sampling_seed`, `no_stop_trim`). Nulls are accepted everywhere, as slime
//! sends them.

use std::num::NonZeroU32;

use serde::Deserialize;
use serde_json::Value;

use super::{SamplingPlan, SharedSampling, StopStrings, is_empty_collection, refuse_unless_neutral};
use crate::error::HttpError;

/// Where these fields sit in the body, for naming a refused one.
const AT: &str = "sampling_params";

/// SGLang's sampling fields. Constrained decoding and biases are refused unless neutral (unknown fields are refused
/// by the endpoint, which knows which fields it accepts without effect).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SglangSampling {
    /// Most tokens to generate; absent for "up to the context length" (SGLang's own default is 128).
    max_new_tokens: Option<u32>,
    /// No end-of-sequence, stop token or stop string before this many tokens.
    min_new_tokens: Option<u32>,
    /// Softmax temperature; absent means 1, 0 is greedy.
    temperature: Option<f32>,
    /// Nucleus mass.
    top_p: Option<f32>,
    /// Top-k; -1 disables it.
    top_k: Option<i32>,
    /// Min-p.
    min_p: Option<f32>,
    /// Strings that end a sequence.
    stop: Option<StopStrings>,
    /// Extra tokens that end a sequence.
    stop_token_ids: Option<Vec<u32>>,
    /// Keep going past the end-of-sequence token.
    ignore_eos: Option<bool>,
    /// Sequences per prompt.
    n: Option<NonZeroU32>,
    /// Sampler seed.
    sampling_seed: Option<u64>,
    /// Penalties.
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    /// Keep a matched stop string in the text.
    no_stop_trim: Option<bool>,
    json_schema: Option<Value>,
    regex: Option<Value>,
    ebnf: Option<Value>,
    structural_tag: Option<Value>,
    logit_bias: Option<Value>,
}

impl SglangSampling {
    /// The plan these fields describe.
    pub(crate) fn into_plan(self) -> Result<SamplingPlan, HttpError> {
        for (field, value) in [
            ("json_schema", &self.json_schema),
            ("regex", &self.regex),
            ("ebnf", &self.ebnf),
            ("structural_tag", &self.structural_tag),
        ] {
            refuse_unless_neutral(
                &format!("{AT}.{field}"),
                value.as_ref(),
                &[],
                "constrained decoding is not implemented",
            )?;
        }
        if let Some(bias) = self.logit_bias.as_ref().filter(|bias| !bias.is_null() && !is_empty_collection(bias)) {
            let reason = format!("{bias} is not supported: loragate applies no per-token biases");
            return Err(HttpError::invalid(format!("{AT}.logit_bias"), reason));
        }
        let shared = SharedSampling {
            max_tokens: self.max_new_tokens,
            min_tokens: self.min_new_tokens,
            seed: self.sampling_seed,
            include_stop_str: self.no_stop_trim,
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
        // SGLang's "no top-k" is -1.
        Ok(shared.into_plan(-1))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::json_body::parse_value;

    fn plan(json: Value) -> Result<SamplingPlan, HttpError> {
        parse_value::<SglangSampling>(&json, AT)?.into_plan()
    }

    #[test]
    fn slimes_fields_with_their_nulls_are_accepted() {
        let slime = json!({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 1024, "stop": null,
            "stop_token_ids": null, "skip_special_tokens": false, "no_stop_trim": true,
            "spaces_between_special_tokens": false, "sampling_seed": 3, "custom_params": {"return_top_p_token_ids": true}});
        let plan = plan(slime).expect("accepted");
        assert_eq!((plan.params.max_tokens, plan.params.top_k, plan.params.seed), (Some(1024), -1, Some(3)));
        assert!(plan.text.include_stop_str && plan.params.stop_token_ids.is_empty());
    }

    #[test]
    fn areals_fields_and_names_map_to_the_core() {
        let areal = json!({"top_p": 1.0, "top_k": 100000000, "max_new_tokens": 8, "temperature": 0.7,
            "stop_token_ids": [], "ignore_eos": false, "skip_special_tokens": true, "frequency_penalty": 0.0,
            "min_new_tokens": 2});
        let plan = plan(areal).expect("accepted");
        assert_eq!((plan.params.max_tokens, plan.params.min_tokens, plan.params.frequency_penalty), (Some(8), 2, 0.0));
        let defaults = plan_with(json!({}));
        assert_eq!((defaults.params.max_tokens, defaults.params.temperature, defaults.params.top_k), (None, 1.0, -1));
    }

    fn plan_with(json: Value) -> SamplingPlan {
        plan(json).expect("valid")
    }

    #[test]
    fn constrained_decoding_and_biases_are_refused_by_name() {
        for (json, field) in [
            (json!({"regex": "a+"}), "sampling_params.regex"),
            (json!({"json_schema": "{}"}), "sampling_params.json_schema"),
            (json!({"logit_bias": {"1": 5.0}}), "sampling_params.logit_bias"),
            (json!({"max_new_tokens": "8"}), "sampling_params.max_new_tokens"),
        ] {
            let err = plan(json.clone()).expect_err("refused");
            assert_eq!(err.param().as_deref(), Some(field), "{json}");
        }
        assert!(plan(json!({"regex": null, "logit_bias": {}})).is_ok(), "neutral values pass");
    }
}
