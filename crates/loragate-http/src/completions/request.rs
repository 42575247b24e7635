//! The body of `POST /v1/completions` as it arrives: OpenAI's fields plus vLLM's `ignore_eos`, `stop_token_ids`
//! and `top_k`. Fields this front does not know are ignored, as OpenAI and vLLM do. The two fields with several
//! JSON forms, `prompt` and `stop`, are parsed here into one form each.

use std::num::NonZeroU32;

use serde::Deserialize;
use serde_json::Value;

/// An OpenAI completion request, parsed but not yet checked against the model (the core does that).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct CompletionBody {
    /// The base model's served name or an adapter's name.
    pub(crate) model: Option<String>,
    /// Text or token ids.
    pub(crate) prompt: Option<Prompt>,
    /// Most tokens to generate; absent or null for "up to the context length".
    pub(crate) max_tokens: Option<u32>,
    /// Softmax temperature; absent means 1, as in OpenAI's API.
    pub(crate) temperature: Option<f32>,
    /// Nucleus mass.
    pub(crate) top_p: Option<f32>,
    /// vLLM's top-k (0 or -1 disables it).
    pub(crate) top_k: Option<i32>,
    /// Sampler seed.
    pub(crate) seed: Option<u64>,
    /// Strings that end a choice (watched in the decoded text by this front).
    pub(crate) stop: Option<StopStrings>,
    /// vLLM's extra tokens that end a choice.
    pub(crate) stop_token_ids: Option<Vec<u32>>,
    /// vLLM's: keep going past the end-of-sequence token.
    pub(crate) ignore_eos: Option<bool>,
    /// Choices to sample.
    pub(crate) n: Option<NonZeroU32>,
    /// Return the sampled tokens' logprobs (any value; only the sampled token's logprob is known).
    pub(crate) logprobs: Option<u32>,
    /// Answer with server-sent events.
    pub(crate) stream: Option<bool>,
}

/// One prompt, as text or as token ids. A batch of exactly one prompt (`["text"]`, `[[1, 2]]`) is accepted as that
/// prompt; larger batches are refused (one request per prompt keeps one request id per sample, which aborts report).
#[derive(Debug, PartialEq, Deserialize)]
#[serde(try_from = "Value")]
pub(crate) enum Prompt {
    /// Text, encoded by the server's codec.
    Text(String),
    /// Token ids, used as they are.
    TokenIds(Vec<u32>),
}

impl TryFrom<Value> for Prompt {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        match value {
            Value::Array(items)
                if !items.is_empty() && items.iter().all(|item| item.is_string() || item.is_array()) =>
            {
                match <[Value; 1]>::try_from(items) {
                    Ok([only]) => single_prompt(only),
                    Err(items) => Err(format!(
                        "is a batch of {} prompts; loragate serves one prompt per request, so send one request each",
                        items.len()
                    )),
                }
            }
            other => single_prompt(other),
        }
    }
}

fn single_prompt(value: Value) -> Result<Prompt, String> {
    match value {
        Value::String(text) => Ok(Prompt::Text(text)),
        Value::Array(items) => items
            .into_iter()
            .map(|item| {
                item.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| format!("token ids must be integers from 0 to {}, got {item}", u32::MAX))
            })
            .collect::<Result<Vec<u32>, String>>()
            .map(Prompt::TokenIds),
        other => Err(format!("must be a string or an array of token ids, got {other}")),
    }
}

/// The stop strings of a request: `"stop": "x"` or `"stop": ["x", "y"]`; none may be empty, and their count and
/// length are capped (see `stop.rs`).
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(try_from = "Value")]
pub(crate) struct StopStrings(pub(crate) Vec<String>);

impl TryFrom<Value> for StopStrings {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        let strings = match value {
            Value::String(one) => vec![one],
            Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(text) => Ok(text),
                    other => Err(format!("must be a string or an array of strings, got {other} in the array")),
                })
                .collect::<Result<_, _>>()?,
            other => return Err(format!("must be a string or an array of strings, got {other}")),
        };
        super::stop::check_stop_strings(&strings)?;
        Ok(Self(strings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::HttpError;
    use crate::json_body::parse_json;

    fn body(json: &str) -> Result<CompletionBody, HttpError> {
        parse_json(json.as_bytes())
    }

    fn prompt(json: &str) -> Prompt {
        body(&format!(r#"{{"prompt": {json}}}"#)).expect(json).prompt.expect("prompt")
    }

    fn rejected_param(json: &str) -> Option<String> {
        body(json).map(|_| ()).expect_err(json).param()
    }

    #[test]
    fn prompts_are_text_or_token_ids_alone_or_in_a_batch_of_one() {
        assert_eq!(prompt(r#""Hi""#), Prompt::Text("Hi".into()));
        assert_eq!(prompt("[72, 105]"), Prompt::TokenIds(vec![72, 105]));
        assert_eq!(prompt(r#"["Hi"]"#), Prompt::Text("Hi".into()));
        assert_eq!(prompt("[[72, 105]]"), Prompt::TokenIds(vec![72, 105]));
        assert_eq!(prompt("[]"), Prompt::TokenIds(vec![]), "the core refuses the empty prompt, naming it");
    }

    #[test]
    fn batches_and_malformed_prompts_are_refused_naming_prompt() {
        for json in [
            r#"["a", "b"]"#,
            "[[1], [2]]",
            "[1, -2]",
            "[1, 4294967296]",
            "[1.5]",
            r#"[1, "a"]"#,
            "[[1, [2]]]",
            "{}",
            "7",
            "true",
        ] {
            let err = body(&format!(r#"{{"prompt": {json}}}"#)).map(|_| ()).expect_err(json);
            assert_eq!(err.param().as_deref(), Some("prompt"), "{json}: {err}");
        }
    }

    #[test]
    fn stop_is_one_string_or_a_list_of_non_empty_strings() {
        let stop = |json: &str| body(&format!(r#"{{"stop": {json}}}"#)).expect(json).stop.expect("stop").0;
        assert_eq!(stop(r#""\n""#), vec!["\n".to_owned()]);
        assert_eq!(stop(r#"["a", "bc"]"#), vec!["a".to_owned(), "bc".to_owned()]);
        assert!(stop("[]").is_empty());
        assert_eq!(body(r#"{"stop": null}"#).expect("null").stop, None);
        let too_many = serde_json::to_string(&vec!["x"; super::super::stop::MAX_STOP_STRINGS + 1]).expect("json");
        let too_long = serde_json::to_string(&"x".repeat(super::super::stop::MAX_STOP_STRING_BYTES + 1)).expect("json");
        for json in [
            r#"{"stop": ""}"#.to_owned(),
            r#"{"stop": ["a", ""]}"#.to_owned(),
            r#"{"stop": [1]}"#.to_owned(),
            r#"{"stop": 1}"#.to_owned(),
            format!(r#"{{"stop": {too_many}}}"#),
            format!(r#"{{"stop": {too_long}}}"#),
        ] {
            let json = json.as_str();
            assert_eq!(rejected_param(json).as_deref(), Some("stop"), "{json}");
        }
    }

    #[test]
    fn wrong_types_name_their_field_and_unknown_fields_are_ignored() {
        for (json, field) in [
            (r#"{"max_tokens": "10"}"#, "max_tokens"),
            (r#"{"max_tokens": 1.5}"#, "max_tokens"),
            (r#"{"n": 0}"#, "n"),
            (r#"{"logprobs": true}"#, "logprobs"),
            (r#"{"seed": -1}"#, "seed"),
            (r#"{"stream": "yes"}"#, "stream"),
            (r#"{"temperature": "hot"}"#, "temperature"),
            (r#"{"stop_token_ids": [-1]}"#, "stop_token_ids"),
        ] {
            assert_eq!(rejected_param(json).as_deref(), Some(field), "{json}");
        }
        let parsed = body(r#"{"model": "m", "echo": false, "best_of": 1, "user": "u"}"#).expect("unknown fields");
        assert_eq!(parsed.model.as_deref(), Some("m"));
    }
}
