//! The JSON of completion responses: the unary body and the streamed chunks share one choice shape, OpenAI's plus
//! vLLM's `stop_reason`, `prompt_logprobs` (a `null` key in a unary response when not asked for, as vLLM sends it)
//! and `prompt_token_ids`, and loragate's `token_ids` and `segments` (which adapter version produced which tokens).
//!
//! `logprobs` is OpenAI's legacy object: per token its text (or `"token_id:N"`), its logprob, the sampled token
//! followed by the `k` most likely tokens (`k + 1` entries when the sampled one is not among them), and its
//! character offset in the choice's text. With `echo`, the prompt comes first, in `text` and in `logprobs` (the
//! first prompt token's logprob `null`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::Serialize;

use crate::error::Api;
use crate::output::{
    ChoiceDelta, ChunkRenderer, Finish, OrderedLogprobs, PromptLogprobs, PromptTokens, ResponseHeader, SegmentJson,
    StopReason, TokenLogprob, Usage, VllmPromptLogprobs, clamp_logprob, segments_json, stop_reason, to_json,
    token_label,
};
use loragate_text::{TextCodec, decode_with_offsets};

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
struct CompletionChoice {
    index: u32,
    text: String,
    logprobs: Option<LegacyLogprobs>,
    finish_reason: Option<&'static str>,
    stop_reason: Option<StopReason>,
    token_ids: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<Vec<u32>>,
    /// `Some(None)` (`null`) when asked for but not produced (a request aborted before its prompt was read).
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_logprobs: Option<Option<VllmPromptLogprobs>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    segments: Option<Vec<SegmentJson>>,
    /// Streamed only: the adapter version that produced this chunk's tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    lora_version: Option<u64>,
}

/// OpenAI's legacy completion logprobs object.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
struct LegacyLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<Option<f32>>,
    top_logprobs: Vec<Option<OrderedLogprobs>>,
    text_offset: Vec<usize>,
}

impl LegacyLogprobs {
    fn extend(&mut self, later: LegacyLogprobs) {
        self.tokens.extend(later.tokens);
        self.token_logprobs.extend(later.token_logprobs);
        self.top_logprobs.extend(later.top_logprobs);
        self.text_offset.extend(later.text_offset);
    }
}

impl CompletionChoice {
    fn absorb(&mut self, later: CompletionChoice) {
        self.text.push_str(&later.text);
        self.token_ids.extend(later.token_ids);
        match (&mut self.logprobs, later.logprobs) {
            (Some(all), Some(more)) => all.extend(more),
            (all @ None, more) => *all = more,
            (Some(_), None) => {}
        }
        self.finish_reason = later.finish_reason.or(self.finish_reason);
        self.stop_reason = later.stop_reason.or(self.stop_reason.take());
        self.prompt_token_ids = later.prompt_token_ids.or(self.prompt_token_ids.take());
        self.prompt_logprobs = later.prompt_logprobs.or(self.prompt_logprobs.take());
        self.segments = later.segments.or(self.segments.take());
    }
}

/// A prompt as `echo` shows it.
#[derive(Debug)]
pub(crate) struct EchoedPrompt {
    text: String,
    /// Its length in characters (the shift of the completion's text offsets).
    chars: usize,
    offsets: Vec<usize>,
}

impl EchoedPrompt {
    /// `prompt` decoded, with each token's offset.
    pub(crate) fn new(codec: &dyn TextCodec, prompt: &[u32]) -> Self {
        let (text, offsets) = decode_with_offsets(codec, prompt);
        Self { chars: text.chars().count(), text, offsets }
    }
}

/// What the request asked its completion to show.
#[derive(Debug, Default)]
pub(crate) struct CompletionOptions {
    /// Whether to build the `logprobs` object.
    pub(crate) with_logprobs: bool,
    /// `return_tokens_as_token_ids`.
    pub(crate) as_token_ids: bool,
    /// Per prompt, with `echo`.
    pub(crate) echo: Option<Vec<EchoedPrompt>>,
    /// Whether `prompt_logprobs` were asked for.
    pub(crate) prompt_logprobs: bool,
    /// Per prompt, with `return_token_ids` (and, streamed, with `echo`: on each choice's first chunk).
    pub(crate) prompt_token_ids: Option<Vec<Arc<[u32]>>>,
    /// The model's end-of-sequence tokens (they are no `stop_reason`).
    pub(crate) eos_token_ids: Vec<u32>,
    /// With `stream`: end with a usage chunk.
    pub(crate) include_usage: bool,
}

/// How a request's completion is rendered, unary or streamed.
pub(crate) struct CompletionRender {
    header: ResponseHeader,
    codec: Arc<dyn TextCodec>,
    options: CompletionOptions,
    /// Prompt tokens over every prompt.
    prompt_tokens: PromptTokens,
    completion_tokens: usize,
    started: HashSet<u32>,
}

impl CompletionRender {
    /// A renderer of a request whose prompts hold `prompt_tokens` tokens in all.
    pub(crate) fn new(
        header: ResponseHeader,
        codec: Arc<dyn TextCodec>,
        options: CompletionOptions,
        prompt_tokens: impl Into<PromptTokens>,
    ) -> Self {
        Self {
            header,
            codec,
            options,
            prompt_tokens: prompt_tokens.into(),
            completion_tokens: 0,
            started: HashSet::new(),
        }
    }

    fn completion(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> Completion {
        Completion {
            id: self.header.id.clone(),
            object: "text_completion",
            created: self.header.created,
            model: self.header.model.clone(),
            choices,
            usage,
        }
    }

    /// The choice piece of one delta (with the echoed prompt and the prompt's extras on a choice's first).
    fn choice(&mut self, delta: ChoiceDelta) -> CompletionChoice {
        self.completion_tokens += delta.token_ids.len();
        let first = self.started.insert(delta.index);
        let echoed = self.options.echo.as_ref().and_then(|echo| echo.get(delta.prompt_index));
        let shift = echoed.map_or(0, |echoed| echoed.chars);
        let echo = echoed.filter(|_| first);
        let mut text = String::new();
        let mut logprobs = self.options.with_logprobs.then(LegacyLogprobs::default);
        if let Some(echo) = echo {
            text.push_str(&echo.text);
            if let Some(logprobs) = &mut logprobs {
                logprobs.extend(self.echoed_logprobs(echo, delta.prompt.as_deref()));
            }
        }
        text.push_str(&delta.text);
        if let Some(logprobs) = &mut logprobs {
            logprobs.extend(self.generated_logprobs(&delta.logprobs, shift));
        }
        let prompt_logprobs = (first && self.options.prompt_logprobs).then(|| {
            let prompt = delta.prompt.clone()?;
            Some(VllmPromptLogprobs { prompt, codec: self.codec.clone(), as_token_ids: self.options.as_token_ids })
        });
        let prompt_token_ids = if first {
            self.options.prompt_token_ids.as_ref().and_then(|ids| ids.get(delta.prompt_index)).map(|ids| ids.to_vec())
        } else {
            None
        };
        CompletionChoice {
            index: delta.index,
            text,
            logprobs,
            finish_reason: delta.finish.as_ref().map(|finish: &Finish| finish.reason.as_str()),
            stop_reason: stop_reason(delta.finish.as_ref(), &self.options.eos_token_ids),
            token_ids: delta.token_ids,
            prompt_token_ids,
            prompt_logprobs,
            segments: delta.segments.as_deref().map(segments_json),
            lora_version: None,
        }
    }

    fn generated_logprobs(&self, entries: &[TokenLogprob], shift: usize) -> LegacyLogprobs {
        let mut logprobs = LegacyLogprobs::default();
        for entry in entries {
            let label = token_label(&*self.codec, entry.token, self.options.as_token_ids);
            let mut top = OrderedLogprobs::default();
            top.push(label.clone(), entry.logprob);
            for &(token, logprob) in entry.top.iter().flat_map(|top| &top.top) {
                top.push(token_label(&*self.codec, token, self.options.as_token_ids), logprob);
            }
            logprobs.tokens.push(label);
            logprobs.token_logprobs.push(Some(clamp_logprob(entry.logprob)));
            logprobs.top_logprobs.push(Some(top));
            logprobs.text_offset.push(entry.text_offset + shift);
        }
        logprobs
    }

    fn echoed_logprobs(&self, echo: &EchoedPrompt, prompt: Option<&PromptLogprobs>) -> LegacyLogprobs {
        let mut logprobs = LegacyLogprobs::default();
        let Some(prompt) = prompt else { return logprobs };
        for (position, &token) in prompt.token_ids.iter().enumerate() {
            let label = token_label(&*self.codec, token, self.options.as_token_ids);
            let logprob = prompt.logprobs.get(position).copied().filter(|logprob| position > 0 && !logprob.is_nan());
            let top = logprob.map(|logprob| {
                let mut top = OrderedLogprobs::default();
                top.push(label.clone(), logprob);
                let alternatives = prompt.top.as_ref().and_then(|top| top.get(position));
                for &(other, other_logprob) in alternatives.iter().flat_map(|top| &top.top) {
                    top.push(token_label(&*self.codec, other, self.options.as_token_ids), other_logprob);
                }
                top
            });
            logprobs.tokens.push(label);
            logprobs.token_logprobs.push(logprob.map(clamp_logprob));
            logprobs.top_logprobs.push(top);
            logprobs.text_offset.push(echo.offsets.get(position).copied().unwrap_or(0));
        }
        logprobs
    }
}

impl ChunkRenderer for CompletionRender {
    type Unary = Completion;

    fn unary(mut self, deltas: Vec<ChoiceDelta>) -> Completion {
        let mut choices: BTreeMap<u32, CompletionChoice> = BTreeMap::new();
        for delta in deltas {
            let piece = self.choice(delta);
            match choices.get_mut(&piece.index) {
                Some(choice) => choice.absorb(piece),
                None => {
                    choices.insert(piece.index, piece);
                }
            }
        }
        let usage = Usage::new(&self.prompt_tokens, self.completion_tokens);
        let mut choices: Vec<CompletionChoice> = choices.into_values().collect();
        for choice in &mut choices {
            // vLLM's unary choices always carry the key.
            choice.prompt_logprobs.get_or_insert(None);
        }
        self.completion(choices, Some(usage))
    }

    fn api(&self) -> Api {
        Api::Completions
    }

    fn chunks(&mut self, delta: ChoiceDelta) -> Vec<String> {
        let version = delta.version;
        let mut choice = self.choice(delta);
        choice.lora_version = version.map(|version| version.0);
        vec![to_json(&self.completion(vec![choice], None))]
    }

    fn finish(&mut self) -> Vec<String> {
        if !self.options.include_usage {
            return Vec::new();
        }
        let usage = Usage::new(&self.prompt_tokens, self.completion_tokens);
        vec![to_json(&self.completion(Vec::new(), Some(usage)))]
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::{AdapterVersion, FinishReason, Segment, TopLogprobs};
    use serde_json::{Value, json};

    use super::*;
    use crate::output::Matched;
    use loragate_text::testing::ByteCodec;

    fn render(with_logprobs: bool, echo: bool) -> CompletionRender {
        let codec: Arc<dyn TextCodec> = Arc::new(ByteCodec);
        let echo = echo.then(|| vec![EchoedPrompt::new(&*codec, b"Hi".map(u32::from).as_slice())]);
        let header = ResponseHeader { id: "cmpl-r1".into(), created: 7, model: "meow".into() };
        let options = CompletionOptions {
            with_logprobs,
            echo,
            include_usage: true,
            eos_token_ids: vec![257],
            ..CompletionOptions::default()
        };
        CompletionRender::new(header, codec, options, 2)
    }

    fn delta(text: &str, finish: Option<FinishReason>) -> ChoiceDelta {
        let token_ids: Vec<u32> = text.bytes().map(u32::from).collect();
        let logprobs = token_ids
            .iter()
            .enumerate()
            .map(|(i, &token)| TokenLogprob {
                token,
                logprob: -0.5,
                top: Some(TopLogprobs { rank: 2, top: vec![(120, -0.25)] }),
                text_offset: i,
            })
            .collect();
        ChoiceDelta {
            index: 0,
            prompt_index: 0,
            text: text.into(),
            token_ids,
            logprobs,
            prompt: None,
            finish: finish.map(|reason| Finish { reason, matched: None::<Matched> }),
            segments: finish
                .map(|_| vec![Segment { version: AdapterVersion(2), kv_version: AdapterVersion(2), start: 0, end: 4 }]),
            version: Some(AdapterVersion(2)),
        }
    }

    #[test]
    fn a_unary_response_joins_deltas_and_counts_usage() {
        let json = serde_json::to_value(
            render(false, false).unary(vec![delta("me", None), delta("ow", Some(FinishReason::Abort))]),
        )
        .expect("json");
        assert_eq!(
            json,
            json!({
                "id": "cmpl-r1", "object": "text_completion", "created": 7, "model": "meow",
                "choices": [{
                    "index": 0, "text": "meow", "logprobs": null, "finish_reason": "abort", "stop_reason": null,
                    "token_ids": [109, 101, 111, 119], "prompt_logprobs": null,
                    "segments": [{"lora_version": 2, "kv_version": 2, "start": 0, "end": 4}],
                }],
                "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6,
                          "prompt_tokens_details": {"cached_tokens": 0}},
            })
        );
    }

    #[test]
    fn logprobs_list_the_sampled_token_then_the_alternatives_and_echo_shifts_the_offsets() {
        let json = serde_json::to_value(render(true, true).unary(vec![delta("ab", Some(FinishReason::Length))]))
            .expect("json");
        let choice = &json["choices"][0];
        assert_eq!(choice["text"], "Hiab", "the echoed prompt comes first");
        let logprobs = &choice["logprobs"];
        assert_eq!(logprobs["tokens"], json!(["a", "b"]), "no prompt logprobs came, so no prompt entries");
        assert_eq!(logprobs["text_offset"], json!([2, 3]));
        assert_eq!(logprobs["top_logprobs"][0], json!({"a": -0.5, "x": -0.25}));
        assert_eq!(serde_json::to_string(&logprobs["top_logprobs"][1]).expect("json"), r#"{"b":-0.5,"x":-0.25}"#);
    }

    #[test]
    fn stop_reason_names_a_stop_token_or_string_but_not_the_end_of_sequence_token() {
        let stopped = |matched: Matched| {
            let mut last = delta("ab", Some(FinishReason::Stop));
            last.finish = Some(Finish { reason: FinishReason::Stop, matched: Some(matched) });
            serde_json::to_value(render(false, false).unary(vec![last])).expect("json")["choices"][0]["stop_reason"]
                .clone()
        };
        assert_eq!(stopped(Matched::Token(98)), json!(98));
        assert_eq!(stopped(Matched::Text("ow".into())), json!("ow"));
        assert_eq!(stopped(Matched::Token(257)), json!(null), "the end-of-sequence token is no stop_reason");
    }

    #[test]
    fn a_stream_ends_with_a_usage_chunk_when_asked() {
        let mut render = render(false, false);
        let chunk: Value = serde_json::from_str(&render.chunks(delta("me", None))[0]).expect("json");
        assert_eq!(chunk["choices"][0]["finish_reason"], json!(null));
        assert_eq!(chunk["choices"][0]["stop_reason"], json!(null), "vLLM's chunks carry the key");
        assert!(chunk.get("usage").is_none() && chunk["choices"][0].get("segments").is_none(), "{chunk}");
        let last: Value = serde_json::from_str(&render.finish()[0]).expect("json");
        assert_eq!((&last["choices"], &last["usage"]["completion_tokens"]), (&json!([]), &json!(2)));
    }
}
