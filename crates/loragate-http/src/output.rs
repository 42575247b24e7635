//! The response side every sampling endpoint shares: the core's events of one request (one prompt) become choice
//! deltas (text decoded incrementally, stop strings watched, logprobs with their alternatives, finish reason, version
//! segments), the deltas of all the prompts of an HTTP request are merged, and streamed responses are framed as
//! server-sent events. Each API family (OpenAI completions and chat, vLLM's generate, SGLang's generate) only
//! renders these deltas in its own JSON shape, so unary and streamed responses, and the families, never disagree on
//! what was generated.

mod choice;
mod drive;
mod logprobs;
mod sse;

pub(crate) use self::choice::{ChoiceDelta, Choices, Finish, Matched, PromptLogprobs, TextOptions, TokenLogprob};
pub(crate) use self::drive::Part;
pub(crate) use self::logprobs::{
    ContentLogprob, OrderedLogprobs, VllmPromptLogprobs, clamp_logprob, content_logprobs, token_label,
};
pub(crate) use self::sse::{ChunkRenderer, REQUEST_ID_HEADER, respond, to_json, to_value};

use loragate_core::CachedPromptTokens;
use serde::Deserialize;

/// OpenAI's `stream_options`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub(crate) struct StreamOptions {
    /// Send a last chunk with the usage of the whole request.
    pub(crate) include_usage: Option<bool>,
}

impl StreamOptions {
    /// Whether a usage chunk ends the stream.
    pub(crate) fn wants_usage(options: Option<Self>) -> bool {
        options.and_then(|options| options.include_usage).unwrap_or(false)
    }
}

/// OpenAI's token counts, with vLLM's `prompt_tokens_details`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Usage {
    /// Prompt tokens, over every prompt.
    pub(crate) prompt_tokens: usize,
    /// Generated tokens, over every choice.
    pub(crate) completion_tokens: usize,
    /// Their sum.
    pub(crate) total_tokens: usize,
    /// How many prompt tokens came from a cache.
    pub(crate) prompt_tokens_details: PromptTokensDetails,
}

/// vLLM's `usage.prompt_tokens_details` (`PromptTokenUsageInfo`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct PromptTokensDetails {
    /// Prompt tokens whose keys and values the engine took from its prefix cache rather than computed (vLLM reports
    /// the same field with `--enable-prompt-tokens-details`).
    pub(crate) cached_tokens: usize,
}

/// A request's prompt tokens over every prompt, and how many of them the engine found in its prefix cache — read
/// when the usage is rendered, once tokens came.
#[derive(Clone, Debug, Default)]
pub(crate) struct PromptTokens {
    count: usize,
    cached: Vec<CachedPromptTokens>,
}

impl PromptTokens {
    /// `count` tokens, of which each prompt's core request tells how many were cached.
    pub(crate) fn new(count: usize, cached: Vec<CachedPromptTokens>) -> Self {
        Self { count, cached }
    }

    /// The prompt tokens found in the prefix cache, over every prompt.
    pub(crate) fn cached(&self) -> usize {
        self.cached.iter().map(|cached| cached.get() as usize).sum()
    }
}

impl From<usize> for PromptTokens {
    fn from(count: usize) -> Self {
        Self { count, cached: Vec::new() }
    }
}

impl Usage {
    /// The usage of `prompt` and `completion_tokens`.
    pub(crate) fn new(prompt: &PromptTokens, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens: prompt.count,
            completion_tokens,
            total_tokens: prompt.count + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: prompt.cached() },
        }
    }
}

/// vLLM's `stop_reason`: the stop string or stop token id that ended a choice; `null` (`None`) when the
/// end-of-sequence token ended it, and for every other ending.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub(crate) enum StopReason {
    /// A stop token (of `stop_token_ids`).
    Token(u32),
    /// A stop string.
    Text(String),
}

/// The `stop_reason` of a choice that ended with `finish`; `eos_token_ids` are the model's end-of-sequence tokens.
pub(crate) fn stop_reason(finish: Option<&Finish>, eos_token_ids: &[u32]) -> Option<StopReason> {
    match finish?.matched.as_ref()? {
        Matched::Token(token) if eos_token_ids.contains(token) => None,
        Matched::Token(token) => Some(StopReason::Token(*token)),
        Matched::Text(text) => Some(StopReason::Text(text.clone())),
    }
}

/// What every response and chunk of one request repeats.
#[derive(Clone, Debug)]
pub(crate) struct ResponseHeader {
    /// The response's id (`cmpl-<request id>`, `chatcmpl-<request id>`, or the request id itself).
    pub(crate) id: String,
    /// Unix seconds when the request was received.
    pub(crate) created: u64,
    /// The `model` the request named (the served name when it named none).
    pub(crate) model: String,
}

/// The Unix time now, in seconds (responses' `created`).
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs())
}

/// The JSON of a finish reason (`"stop"`, `"length"`, `"abort"`).
pub(crate) fn finish_reason(finish: Option<&Finish>) -> Option<&'static str> {
    finish.map(|finish| finish.reason.as_str())
}

/// A version segment as every API family sends it: `{"lora_version", "start", "end", "kv_version"}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct SegmentJson {
    lora_version: u64,
    start: u32,
    end: u32,
    kv_version: u64,
}

/// The JSON of `segments`.
pub(crate) fn segments_json(segments: &[loragate_core::Segment]) -> Vec<SegmentJson> {
    segments
        .iter()
        .map(|segment| SegmentJson {
            lora_version: segment.version.0,
            start: segment.start,
            end: segment.end,
            kv_version: segment.kv_version.0,
        })
        .collect()
}
