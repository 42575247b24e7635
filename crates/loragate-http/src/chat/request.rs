//! The body of `POST /v1/chat/completions` as it arrives, apart from the sampling fields shared with the other
//! vLLM-style endpoints ([`VllmSampling`](crate::sampling::VllmSampling), parsed from the same body). Keys neither
//! type knows are refused (see `chat.rs`).

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::output::StreamOptions;

/// A chat completion request's own fields.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChatBody {
    /// The base model's served name or an adapter's name; absent for the base model.
    pub(crate) model: Option<String>,
    /// The conversation (required).
    pub(crate) messages: Option<Vec<Value>>,
    /// OpenAI's newer name for `max_tokens`; it wins when both are given.
    pub(crate) max_completion_tokens: Option<u32>,
    /// Return each token's logprob.
    pub(crate) logprobs: Option<bool>,
    /// With `logprobs`: this many most likely tokens per position.
    pub(crate) top_logprobs: Option<u32>,
    /// Answer with server-sent events.
    pub(crate) stream: Option<bool>,
    /// With `stream`: `include_usage`.
    pub(crate) stream_options: Option<StreamOptions>,
    /// End the rendered prompt with the assistant's turn opening (default true).
    pub(crate) add_generation_prompt: Option<bool>,
    /// Extra variables for the chat template.
    pub(crate) chat_template_kwargs: Option<Map<String, Value>>,
    /// Tools, passed to the chat template (calls are not parsed out of the text).
    pub(crate) tools: Option<Value>,
    /// vLLM's: name tokens in `logprobs` as `"token_id:N"`.
    pub(crate) return_tokens_as_token_ids: Option<bool>,
    /// vLLM's: also return the rendered prompt's `prompt_token_ids`.
    pub(crate) return_token_ids: Option<bool>,
    /// vLLM's: add the tokenizer's special tokens to the rendered prompt (default false: the template writes them).
    pub(crate) add_special_tokens: Option<bool>,
    /// Refused unless `{"type": "text"}`: constrained decoding is not implemented.
    pub(crate) response_format: Option<Value>,
    /// Refused unless absent, `"none"` or `"auto"`: no tool call is forced.
    pub(crate) tool_choice: Option<Value>,
    /// Refused: this server renders the model's own template only.
    pub(crate) chat_template: Option<Value>,
    /// Refused unless false: the assistant's last message is not continued.
    pub(crate) continue_final_message: Option<Value>,
    /// vLLM's namespace of the request's cached prefixes: requests with other salts never share cached keys and
    /// values.
    pub(crate) cache_salt: Option<String>,
    /// loragate's: the oldest adapter version that may serve the request (0 or absent: any); held at the gate
    /// until the adapter reaches it.
    pub(crate) min_lora_version: Option<u64>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::json_body::parse_value;

    #[test]
    fn the_openai_sdks_chat_body_parses_and_wrong_types_name_their_field() {
        let body = json!({"model": "meow", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 4,
            "logprobs": true, "top_logprobs": 2, "stream": false, "n": 2, "seed": 1});
        let parsed: ChatBody = parse_value(&body, "").expect("parses");
        assert_eq!(
            (parsed.max_completion_tokens, parsed.logprobs, parsed.top_logprobs),
            (Some(4), Some(true), Some(2))
        );
        for (json, field) in [
            (json!({"messages": "hi"}), "messages"),
            (json!({"logprobs": 1}), "logprobs"),
            (json!({"top_logprobs": -1}), "top_logprobs"),
            (json!({"chat_template_kwargs": []}), "chat_template_kwargs"),
        ] {
            let err = parse_value::<ChatBody>(&json, "").expect_err("refused");
            assert_eq!(err.param().as_deref(), Some(field), "{json}");
        }
    }
}
