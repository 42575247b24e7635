//! The body of SGLang's native `POST /generate` (`GenerateReqInput`), apart from `sampling_params`
//! ([`SglangSampling`](crate::sampling::SglangSampling)): the prompt as `input_ids` or `text` (one, or a batch),
//! `lora_path` (the adapter's name), `rid`, what logprobs to return, `stream`. Unknown fields are refused; the ones
//! loragate cannot honour (images, custom logit processors, hidden states) are refused unless neutral.

use serde::Deserialize;
use serde_json::Value;

/// SGLang's generate request's own fields.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SglangBody {
    /// The prompt as text, or a batch of texts.
    pub(crate) text: Option<OneOrMany<String>>,
    /// The prompt as token ids, or a batch of them.
    pub(crate) input_ids: Option<OneOrMany<Vec<u32>>>,
    /// Return logprobs (`meta_info.output_token_logprobs`, and the prompt's from `logprob_start_len`).
    pub(crate) return_logprob: Option<bool>,
    /// Where the prompt's logprobs start; -1 (the default) for none.
    pub(crate) logprob_start_len: Option<i64>,
    /// Alternatives per position.
    pub(crate) top_logprobs_num: Option<u32>,
    /// Put each token's text into the logprob triples (else `null`).
    pub(crate) return_text_in_logprobs: Option<bool>,
    /// The adapter (its name), or one per prompt of a batch; absent or null for the base model.
    pub(crate) lora_path: Option<OneOrMany<Option<String>>>,
    /// The request's id, or one per prompt of a batch.
    pub(crate) rid: Option<OneOrMany<String>>,
    /// Answer with server-sent events.
    pub(crate) stream: Option<bool>,
    pub(crate) image_data: Option<Value>,
    pub(crate) custom_logit_processor: Option<Value>,
    pub(crate) token_ids_logprob: Option<Value>,
    pub(crate) return_hidden_states: Option<Value>,
    pub(crate) return_routed_experts: Option<Value>,
    /// The namespace of the request's cached prefixes (vLLM's `cache_salt`, which loragate honours on every
    /// sampling API): requests with other salts never share cached keys and values.
    pub(crate) cache_salt: Option<String>,
    /// loragate's: the oldest adapter version that may serve the request (0 or absent: any); held at the gate
    /// until the adapter reaches it.
    pub(crate) min_lora_version: Option<u64>,
}

/// One value, or a list of them (a batch).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany<T> {
    /// A list: a batch.
    Many(Vec<T>),
    /// One value.
    One(T),
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::json_body::parse_value;

    #[test]
    fn single_and_batched_prompts_parse() {
        let single: SglangBody =
            parse_value(&json!({"input_ids": [1, 2], "lora_path": "meow", "rid": "r"}), "").expect("ok");
        assert_eq!(single.input_ids, Some(OneOrMany::One(vec![1, 2])));
        assert_eq!(single.lora_path, Some(OneOrMany::One(Some("meow".into()))));
        let batch: SglangBody = parse_value(&json!({"input_ids": [[1], [2, 3]], "text": ["a"]}), "").expect("ok");
        assert_eq!(batch.input_ids, Some(OneOrMany::Many(vec![vec![1], vec![2, 3]])));
        assert_eq!(batch.text, Some(OneOrMany::Many(vec!["a".to_owned()])));
        let err = parse_value::<SglangBody>(&json!({"input_ids": [1, -2]}), "").expect_err("negative");
        assert_eq!(err.param().as_deref(), Some("input_ids"));
    }
}
