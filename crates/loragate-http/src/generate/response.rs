//! The JSON of `POST /inference/v1/generate` (vLLM's `GenerateResponse`): `request_id`, `choices[]` with `index`,
//! `token_ids`, `logprobs.content[] {token: "token_id:N", logprob, bytes: null, top_logprobs}`, `finish_reason`
//! (`stop`, `length` or `abort`) and loragate's `segments`, the top-level `prompt_logprobs` in vLLM's shape, and
//! `usage`. Streamed, each chunk carries one choice's new tokens.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::error::Api;
use crate::output::{
    ChoiceDelta, ChunkRenderer, ContentLogprob, PromptLogprobs, PromptTokens, ResponseHeader, SegmentJson, Usage,
    VllmPromptLogprobs, content_logprobs, finish_reason, segments_json, to_json,
};
use loragate_text::TextCodec;

/// A generate response, or one streamed chunk of it.
#[derive(Debug, Serialize)]
pub(crate) struct GenerateResponse {
    request_id: String,
    created: u64,
    model: String,
    choices: Vec<GenerateChoice>,
    /// `Some(None)` (`null`) when asked for but not produced.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_logprobs: Option<Option<VllmPromptLogprobs>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

/// vLLM's `{"content": [...]}`.
#[derive(Debug, Default, Serialize)]
struct Logprobs {
    content: Vec<ContentLogprob>,
}

/// One choice (all of it, or a delta of it in a chunk).
#[derive(Debug, Serialize)]
struct GenerateChoice {
    index: u32,
    token_ids: Vec<u32>,
    logprobs: Option<Logprobs>,
    finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    segments: Option<Vec<SegmentJson>>,
    /// Streamed only: the adapter version that produced this chunk's tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    lora_version: Option<u64>,
}

/// What the request asked its response to show.
#[derive(Debug, Default)]
pub(crate) struct GenerateOptions {
    /// `sampling_params.logprobs` was given.
    pub(crate) with_logprobs: bool,
    /// `sampling_params.prompt_logprobs` was given.
    pub(crate) prompt_logprobs: bool,
    /// With `stream`: end with a usage chunk.
    pub(crate) include_usage: bool,
}

/// How a generate request's output is rendered.
pub(crate) struct GenerateRender {
    header: ResponseHeader,
    codec: Arc<dyn TextCodec>,
    options: GenerateOptions,
    prompt_tokens: PromptTokens,
    completion_tokens: usize,
    /// Whether a chunk already carried the prompt's logprobs.
    sent_prompt: bool,
}

impl GenerateRender {
    /// A renderer of a request whose prompt holds `prompt_tokens` tokens; the header's id is the request id.
    pub(crate) fn new(
        header: ResponseHeader,
        codec: Arc<dyn TextCodec>,
        options: GenerateOptions,
        prompt_tokens: impl Into<PromptTokens>,
    ) -> Self {
        Self { header, codec, options, prompt_tokens: prompt_tokens.into(), completion_tokens: 0, sent_prompt: false }
    }

    fn prompt_json(&self, prompt: Option<Arc<PromptLogprobs>>) -> Option<VllmPromptLogprobs> {
        Some(VllmPromptLogprobs { prompt: prompt?, codec: self.codec.clone(), as_token_ids: false })
    }

    fn response(
        &self,
        choices: Vec<GenerateChoice>,
        prompt_logprobs: Option<Option<VllmPromptLogprobs>>,
        usage: Option<Usage>,
    ) -> GenerateResponse {
        GenerateResponse {
            request_id: self.header.id.clone(),
            created: self.header.created,
            model: self.header.model.clone(),
            choices,
            prompt_logprobs,
            usage,
        }
    }

    fn choice(&mut self, delta: ChoiceDelta) -> GenerateChoice {
        self.completion_tokens += delta.token_ids.len();
        let logprobs = self
            .options
            .with_logprobs
            .then(|| Logprobs { content: content_logprobs(&*self.codec, &delta.logprobs, true) });
        GenerateChoice {
            index: delta.index,
            finish_reason: finish_reason(delta.finish.as_ref()),
            token_ids: delta.token_ids,
            logprobs,
            segments: delta.segments.as_deref().map(segments_json),
            lora_version: None,
        }
    }
}

impl ChunkRenderer for GenerateRender {
    type Unary = GenerateResponse;

    fn unary(mut self, deltas: Vec<ChoiceDelta>) -> GenerateResponse {
        let mut choices: BTreeMap<u32, GenerateChoice> = BTreeMap::new();
        let mut prompt: Option<Arc<PromptLogprobs>> = None;
        for mut delta in deltas {
            prompt = prompt.or(delta.prompt.take());
            let piece = self.choice(delta);
            match choices.get_mut(&piece.index) {
                Some(choice) => {
                    choice.token_ids.extend(piece.token_ids);
                    if let (Some(all), Some(more)) = (&mut choice.logprobs, piece.logprobs) {
                        all.content.extend(more.content);
                    }
                    choice.finish_reason = piece.finish_reason.or(choice.finish_reason);
                    choice.segments = piece.segments.or(choice.segments.take());
                }
                None => {
                    choices.insert(piece.index, piece);
                }
            }
        }
        let prompt_logprobs = self.options.prompt_logprobs.then(|| self.prompt_json(prompt));
        let usage = Usage::new(&self.prompt_tokens, self.completion_tokens);
        self.response(choices.into_values().collect(), prompt_logprobs, Some(usage))
    }

    fn api(&self) -> Api {
        Api::Generate
    }

    fn chunks(&mut self, mut delta: ChoiceDelta) -> Vec<String> {
        let prompt = delta.prompt.take().filter(|_| self.options.prompt_logprobs && !self.sent_prompt);
        self.sent_prompt |= prompt.is_some();
        let prompt_logprobs = prompt.map(|prompt| self.prompt_json(Some(prompt)));
        let version = delta.version;
        let mut choice = self.choice(delta);
        choice.lora_version = version.map(|version| version.0);
        vec![to_json(&self.response(vec![choice], prompt_logprobs, None))]
    }

    fn finish(&mut self) -> Vec<String> {
        if !self.options.include_usage {
            return Vec::new();
        }
        let usage = Usage::new(&self.prompt_tokens, self.completion_tokens);
        vec![to_json(&self.response(Vec::new(), None, Some(usage)))]
    }
}
