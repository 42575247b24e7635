//! The JSON of chat completions: OpenAI's `chat.completion` (each choice a `message {role, content}`, chat
//! `logprobs.content[] {token, logprob, bytes, top_logprobs}`, `finish_reason`) plus loragate's `token_ids` and
//! `segments` per choice, and vLLM's `stop_reason` per choice and `prompt_token_ids` and `prompt_logprobs` (`null`:
//! chat never returns them) at the top; streamed as `chat.completion.chunk`s whose choices carry a `delta` (`role`
//! on each choice's first).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::Serialize;

use crate::error::Api;
use crate::output::{
    ChoiceDelta, ChunkRenderer, ContentLogprob, PromptTokens, ResponseHeader, SegmentJson, StopReason, Usage,
    content_logprobs, finish_reason, segments_json, stop_reason, to_json,
};
use loragate_text::TextCodec;

/// A chat completion, or one streamed chunk of it.
#[derive(Debug, Serialize)]
pub(crate) struct ChatCompletion {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: Vec<ChatChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<Vec<u32>>,
    /// vLLM's key, always `null` in a unary response (chat takes no `prompt_logprobs`); absent from chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_logprobs: Option<()>,
}

/// A message (unary) or a delta (streamed).
#[derive(Debug, Default, Serialize)]
struct Message {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    content: String,
}

/// OpenAI's chat logprobs.
#[derive(Debug, Default, Serialize)]
struct Logprobs {
    content: Vec<ContentLogprob>,
}

/// One choice.
#[derive(Debug, Serialize)]
struct ChatChoice {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Message>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<Message>,
    logprobs: Option<Logprobs>,
    finish_reason: Option<&'static str>,
    stop_reason: Option<StopReason>,
    token_ids: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    segments: Option<Vec<SegmentJson>>,
    /// Streamed only: the adapter version that produced this chunk's tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    lora_version: Option<u64>,
}

/// What the request asked its chat completion to show.
#[derive(Debug, Default)]
pub(crate) struct ChatOptions {
    /// `logprobs: true`.
    pub(crate) with_logprobs: bool,
    /// `return_tokens_as_token_ids`.
    pub(crate) as_token_ids: bool,
    /// The rendered prompt, with `return_token_ids`.
    pub(crate) prompt_token_ids: Option<Vec<u32>>,
    /// With `stream`: end with a usage chunk.
    pub(crate) include_usage: bool,
    /// The model's end-of-sequence tokens (they are no `stop_reason`).
    pub(crate) eos_token_ids: Vec<u32>,
}

/// How a chat request's output is rendered.
pub(crate) struct ChatRender {
    header: ResponseHeader,
    codec: Arc<dyn TextCodec>,
    options: ChatOptions,
    prompt_tokens: PromptTokens,
    completion_tokens: usize,
    started: HashSet<u32>,
}

impl ChatRender {
    /// A renderer of a request whose prompt holds `prompt_tokens` tokens.
    pub(crate) fn new(
        header: ResponseHeader,
        codec: Arc<dyn TextCodec>,
        options: ChatOptions,
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

    fn completion(
        &self,
        object: &'static str,
        choices: Vec<ChatChoice>,
        usage: Option<Usage>,
        prompt_token_ids: Option<Vec<u32>>,
    ) -> ChatCompletion {
        ChatCompletion {
            id: self.header.id.clone(),
            object,
            created: self.header.created,
            model: self.header.model.clone(),
            choices,
            usage,
            prompt_token_ids,
            prompt_logprobs: None,
        }
    }

    /// The choice piece of one delta, as a streamed delta (`role` on a choice's first).
    fn choice(&mut self, delta: ChoiceDelta) -> ChatChoice {
        self.completion_tokens += delta.token_ids.len();
        let first = self.started.insert(delta.index);
        let logprobs = self
            .options
            .with_logprobs
            .then(|| Logprobs { content: content_logprobs(&*self.codec, &delta.logprobs, self.options.as_token_ids) });
        ChatChoice {
            index: delta.index,
            message: None,
            delta: Some(Message { role: first.then_some("assistant"), content: delta.text }),
            logprobs,
            finish_reason: finish_reason(delta.finish.as_ref()),
            stop_reason: stop_reason(delta.finish.as_ref(), &self.options.eos_token_ids),
            token_ids: delta.token_ids,
            segments: delta.segments.as_deref().map(segments_json),
            lora_version: None,
        }
    }
}

impl ChunkRenderer for ChatRender {
    type Unary = ChatCompletion;

    fn unary(mut self, deltas: Vec<ChoiceDelta>) -> ChatCompletion {
        let mut choices: BTreeMap<u32, ChatChoice> = BTreeMap::new();
        for delta in deltas {
            let mut piece = self.choice(delta);
            piece.message = piece.delta.take().map(|message| Message { role: Some("assistant"), ..message });
            match choices.get_mut(&piece.index) {
                Some(choice) => {
                    if let (Some(all), Some(more)) = (&mut choice.message, piece.message) {
                        all.content.push_str(&more.content);
                    }
                    choice.token_ids.extend(piece.token_ids);
                    if let (Some(all), Some(more)) = (&mut choice.logprobs, piece.logprobs) {
                        all.content.extend(more.content);
                    }
                    choice.finish_reason = piece.finish_reason.or(choice.finish_reason);
                    choice.stop_reason = piece.stop_reason.or(choice.stop_reason.take());
                    choice.segments = piece.segments.or(choice.segments.take());
                }
                None => {
                    choices.insert(piece.index, piece);
                }
            }
        }
        let usage = Usage::new(&self.prompt_tokens, self.completion_tokens);
        let prompt_token_ids = self.options.prompt_token_ids.take();
        let mut completion =
            self.completion("chat.completion", choices.into_values().collect(), Some(usage), prompt_token_ids);
        completion.prompt_logprobs = Some(());
        completion
    }

    fn api(&self) -> Api {
        Api::Chat
    }

    fn chunks(&mut self, delta: ChoiceDelta) -> Vec<String> {
        let first_ever = self.started.is_empty();
        let version = delta.version;
        let mut choice = self.choice(delta);
        choice.lora_version = version.map(|version| version.0);
        let prompt_token_ids = if first_ever { self.options.prompt_token_ids.clone() } else { None };
        vec![to_json(&self.completion("chat.completion.chunk", vec![choice], None, prompt_token_ids))]
    }

    fn finish(&mut self) -> Vec<String> {
        if !self.options.include_usage {
            return Vec::new();
        }
        let usage = Usage::new(&self.prompt_tokens, self.completion_tokens);
        vec![to_json(&self.completion("chat.completion.chunk", Vec::new(), Some(usage), None))]
    }
}
