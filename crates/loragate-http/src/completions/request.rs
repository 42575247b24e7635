//! The body of `POST /v1/completions` as it arrives, apart from the sampling fields every vLLM-style API shares
//! ([`VllmSampling`](crate::sampling::VllmSampling), parsed from the same body): the model, the prompts (one, or a
//! batch), and what the response shows (`logprobs`, `echo`, `return_tokens_as_token_ids`, streaming). Keys neither
//! type knows are refused (see `completions.rs`).

use serde::Deserialize;
use serde_json::Value;

use crate::output::StreamOptions;

/// An OpenAI completion request's own fields, parsed but not yet checked against the model (the core does that).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct CompletionBody {
    /// The base model's served name or an adapter's name; absent for the base model.
    pub(crate) model: Option<String>,
    /// One prompt, or a batch.
    pub(crate) prompt: Option<Prompts>,
    /// Put the prompt before the completion in `text` (and in `logprobs`).
    pub(crate) echo: Option<bool>,
    /// Return logprobs, with this many alternatives per token (0: the sampled token's only).
    pub(crate) logprobs: Option<u32>,
    /// Answer with server-sent events.
    pub(crate) stream: Option<bool>,
    /// With `stream`: `include_usage`.
    pub(crate) stream_options: Option<StreamOptions>,
    /// vLLM's: name tokens in `logprobs` as `"token_id:N"`.
    pub(crate) return_tokens_as_token_ids: Option<bool>,
    /// vLLM's: also return `prompt_token_ids` on each choice.
    pub(crate) return_token_ids: Option<bool>,
    /// vLLM's: add the tokenizer's special tokens to text prompts (default true).
    pub(crate) add_special_tokens: Option<bool>,
    /// OpenAI's text after the completion: refused unless empty (nothing is inserted).
    pub(crate) suffix: Option<Value>,
    /// vLLM's namespace of the request's cached prefixes: requests with other salts never share cached keys and
    /// values.
    pub(crate) cache_salt: Option<String>,
    /// loragate's: the oldest adapter version that may serve the request (0 or absent: any); held at the gate
    /// until the adapter reaches it.
    pub(crate) min_lora_version: Option<u64>,
}

/// One prompt, as text or as token ids.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Prompt {
    /// Text, encoded by the server's codec.
    Text(String),
    /// Token ids, used as they are.
    TokenIds(Vec<u32>),
}

/// The prompts of a request: a string, an array of token ids, or a batch (an array of strings and/or arrays of
/// token ids). Each prompt of a batch becomes its own core request.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(try_from = "Value")]
pub(crate) struct Prompts(pub(crate) Vec<Prompt>);

impl TryFrom<Value> for Prompts {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        match value {
            Value::Array(items)
                if !items.is_empty() && items.iter().all(|item| item.is_string() || item.is_array()) =>
            {
                items.into_iter().map(single_prompt).collect::<Result<_, _>>().map(Self)
            }
            other => single_prompt(other).map(|prompt| Self(vec![prompt])),
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
        other => Err(format!("must be a string or an array of token ids, or a batch of them, got {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::HttpError;
    use crate::json_body::parse_json;

    fn body(json: &str) -> Result<CompletionBody, HttpError> {
        Ok(parse_json(json.as_bytes())?)
    }

    fn prompts(json: &str) -> Vec<Prompt> {
        body(&format!(r#"{{"prompt": {json}}}"#)).expect(json).prompt.expect("prompt").0
    }

    #[test]
    fn prompts_are_text_or_token_ids_alone_or_in_a_batch() {
        assert_eq!(prompts(r#""Hi""#), vec![Prompt::Text("Hi".into())]);
        assert_eq!(prompts("[72, 105]"), vec![Prompt::TokenIds(vec![72, 105])]);
        assert_eq!(prompts(r#"["Hi"]"#), vec![Prompt::Text("Hi".into())]);
        assert_eq!(prompts("[[72, 105], [33]]"), vec![Prompt::TokenIds(vec![72, 105]), Prompt::TokenIds(vec![33])]);
        assert_eq!(prompts(r#"["a", [98]]"#), vec![Prompt::Text("a".into()), Prompt::TokenIds(vec![98])]);
        assert_eq!(prompts("[]"), vec![Prompt::TokenIds(vec![])], "the core refuses the empty prompt, naming it");
    }

    #[test]
    fn malformed_prompts_are_refused_naming_prompt() {
        for json in ["[1, -2]", "[1, 4294967296]", "[1.5]", r#"[1, "a"]"#, "[[1, [2]]]", "{}", "7", "true", "[[1], 2]"]
        {
            let err = body(&format!(r#"{{"prompt": {json}}}"#)).map(|_| ()).expect_err(json);
            assert_eq!(err.param().as_deref(), Some("prompt"), "{json}: {err}");
        }
    }

    #[test]
    fn wrong_types_name_their_field() {
        for (json, field) in [
            (r#"{"logprobs": true}"#, "logprobs"),
            (r#"{"echo": "yes"}"#, "echo"),
            (r#"{"stream": "yes"}"#, "stream"),
            (r#"{"stream_options": {"include_usage": 1}}"#, "stream_options.include_usage"),
        ] {
            assert_eq!(body(json).map(|_| ()).expect_err(json).param().as_deref(), Some(field), "{json}");
        }
    }
}
