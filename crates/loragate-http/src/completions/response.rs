//! The JSON of completion responses: the unary body and the streamed chunks share one choice shape, OpenAI's plus
//! `token_ids` and `segments` (which adapter version produced which tokens).

use loragate_core::{FinishReason, Segment};
use serde::Serialize;

use super::choice::{ChoiceDelta, Logprobs};

/// What every response and chunk of one request repeats.
#[derive(Clone, Debug)]
pub(crate) struct CompletionHeader {
    /// `cmpl-<request id>`.
    pub(crate) id: String,
    /// Unix seconds when the request was received.
    pub(crate) created: u64,
    /// The `model` the request named.
    pub(crate) model: String,
}

/// A completion response, or one streamed chunk of it.
#[derive(Debug, Serialize)]
pub(crate) struct Completion {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

/// One choice (all of it in a unary response, a delta of it in a chunk).
#[derive(Debug, Serialize)]
pub(crate) struct CompletionChoice {
    index: u32,
    text: String,
    logprobs: Option<Logprobs>,
    finish_reason: Option<&'static str>,
    token_ids: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    segments: Option<Vec<SegmentJson>>,
}

/// A half-open run of tokens `[start, end)` produced by one adapter version.
#[derive(Debug, PartialEq, Serialize)]
struct SegmentJson {
    lora_version: u64,
    start: u32,
    end: u32,
}

/// OpenAI's token counts.
#[derive(Debug, Serialize)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
}

impl CompletionChoice {
    fn from_delta(delta: ChoiceDelta) -> Self {
        Self {
            index: delta.index,
            text: delta.text,
            logprobs: delta.logprobs,
            finish_reason: delta.finish_reason.map(FinishReason::as_str),
            token_ids: delta.token_ids,
            segments: delta.segments.map(|segments| segments.iter().map(segment_json).collect()),
        }
    }

    /// Appends a later delta of the same choice.
    fn absorb(&mut self, delta: ChoiceDelta) {
        self.text.push_str(&delta.text);
        self.token_ids.extend(delta.token_ids);
        if let (Some(all), Some(later)) = (&mut self.logprobs, delta.logprobs) {
            all.extend(later);
        }
        if let Some(reason) = delta.finish_reason {
            self.finish_reason = Some(reason.as_str());
        }
        if let Some(segments) = delta.segments {
            self.segments = Some(segments.iter().map(segment_json).collect());
        }
    }
}

fn segment_json(segment: &Segment) -> SegmentJson {
    SegmentJson { lora_version: segment.version.0, start: segment.start, end: segment.end }
}

impl CompletionHeader {
    /// One streamed chunk carrying `delta`.
    pub(crate) fn chunk(&self, delta: ChoiceDelta) -> Completion {
        self.completion(vec![CompletionChoice::from_delta(delta)], None)
    }

    fn completion(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }
}

/// Gathers the deltas of a unary response.
pub(crate) struct UnaryCompletion {
    header: CompletionHeader,
    prompt_tokens: usize,
    choices: Vec<CompletionChoice>,
}

impl UnaryCompletion {
    /// An empty response with `count` choices.
    pub(crate) fn new(header: CompletionHeader, prompt_tokens: usize, count: u32, with_logprobs: bool) -> Self {
        let choices = (0..count)
            .map(|index| CompletionChoice {
                index,
                text: String::new(),
                logprobs: with_logprobs.then(Logprobs::default),
                finish_reason: None,
                token_ids: Vec::new(),
                segments: None,
            })
            .collect();
        Self { header, prompt_tokens, choices }
    }

    /// Adds a delta to its choice.
    pub(crate) fn absorb(&mut self, delta: ChoiceDelta) {
        if let Some(choice) = self.choices.get_mut(delta.index as usize) {
            choice.absorb(delta);
        }
    }

    /// The finished response, with its usage.
    pub(crate) fn finish(self) -> Completion {
        let completion_tokens = self.choices.iter().map(|choice| choice.token_ids.len()).sum();
        let usage = Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens,
            total_tokens: self.prompt_tokens + completion_tokens,
        };
        self.header.completion(self.choices, Some(usage))
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::AdapterVersion;
    use serde_json::json;

    use super::*;

    fn header() -> CompletionHeader {
        CompletionHeader { id: "cmpl-r1".into(), created: 7, model: "meow".into() }
    }

    fn delta(text: &str, finish_reason: Option<FinishReason>) -> ChoiceDelta {
        ChoiceDelta {
            index: 0,
            text: text.into(),
            token_ids: text.bytes().map(u32::from).collect(),
            logprobs: None,
            finish_reason,
            segments: finish_reason.map(|_| vec![Segment { version: AdapterVersion(2), start: 0, end: 4 }]),
        }
    }

    #[test]
    fn a_unary_response_joins_deltas_and_counts_usage() {
        let mut unary = UnaryCompletion::new(header(), 5, 1, false);
        unary.absorb(delta("me", None));
        unary.absorb(delta("ow", Some(FinishReason::Abort)));
        let json = serde_json::to_value(unary.finish()).expect("json");
        assert_eq!(
            json,
            json!({
                "id": "cmpl-r1", "object": "text_completion", "created": 7, "model": "meow",
                "choices": [{
                    "index": 0, "text": "meow", "logprobs": null, "finish_reason": "abort",
                    "token_ids": [109, 101, 111, 119], "segments": [{"lora_version": 2, "start": 0, "end": 4}],
                }],
                "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
            })
        );
    }

    #[test]
    fn a_chunk_has_no_usage_and_a_null_finish_reason_until_the_end() {
        let json = serde_json::to_value(header().chunk(delta("me", None))).expect("json");
        assert_eq!(json["choices"][0]["finish_reason"], json!(null));
        assert_eq!(json["choices"][0]["token_ids"], json!([109, 101]));
        assert!(json.get("usage").is_none() && json["choices"][0].get("segments").is_none(), "{json}");
    }
}
