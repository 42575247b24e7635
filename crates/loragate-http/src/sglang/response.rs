//! The JSON of SGLang's `POST /generate`: per sequence `text`, `output_ids` and `meta_info` (`id`, `finish_reason`
//! as `{"type": "length", "length"}`, `{"type": "stop", "matched"}` or `{"type": "abort", "message"}`,
//! `prompt_tokens`, `completion_tokens`, `cached_tokens`, and with `return_logprob` the `[logprob, token id, text]`
//! triples of `output_token_logprobs` (present even when empty) and `input_token_logprobs`, plus loragate's
//! `segments` and `weight_version` (the adapter version of the last token)). A single prompt with one sample answers
//! one object; a batch (or `n > 1`) answers a list, in order. Streamed as SGLang does by default: every chunk holds
//! the sequence's whole output so far.

use std::collections::BTreeMap;
use std::sync::Arc;

use loragate_core::{CachedPromptTokens, FinishReason, Segment};
use serde_json::{Value, json};

use crate::error::Api;
use crate::output::{
    ChoiceDelta, ChunkRenderer, Finish, Matched, PromptLogprobs, TokenLogprob, clamp_logprob, segments_json, to_json,
    to_value,
};
use loragate_text::TextCodec;

/// The message of an aborted sequence that produced nothing (AReaL counts such an attempt as zero tokens).
const ABORTED_BEFORE_PREFILL: &str = "Abort before prefill: the adapter was paused, unloaded, or the request aborted";
/// The message of an aborted sequence with partial output.
const ABORTED: &str =
    "Aborted: the adapter was paused, unloaded, or the request aborted; resubmit input_ids + output_ids";

/// What the caller asked the response to hold.
#[derive(Clone, Debug, Default)]
pub(crate) struct SglangOptions {
    /// `return_logprob`.
    pub(crate) return_logprob: bool,
    /// `logprob_start_len`, if the prompt's logprobs were asked for.
    pub(crate) logprob_start_len: Option<usize>,
    /// `top_logprobs_num`.
    pub(crate) top_logprobs_num: u32,
    /// `return_text_in_logprobs`.
    pub(crate) text_in_logprobs: bool,
    /// Answer a list (a batch, or `n > 1`).
    pub(crate) as_list: bool,
}

/// One sequence's output so far.
#[derive(Debug, Default)]
struct Sequence {
    prompt_index: usize,
    text: String,
    output_ids: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    prompt: Option<Arc<PromptLogprobs>>,
    finish: Option<Finish>,
    segments: Option<Vec<Segment>>,
}

/// How a generate request's output is rendered.
pub(crate) struct SglangRender {
    codec: Arc<dyn TextCodec>,
    options: SglangOptions,
    request_ids: Vec<String>,
    prompt_lengths: Vec<usize>,
    /// How many of each prompt's tokens the engine found in its prefix cache.
    cached: Vec<CachedPromptTokens>,
    sequences: BTreeMap<u32, Sequence>,
}

impl SglangRender {
    /// A renderer for prompts with `request_ids` and `prompt_lengths`, of which `cached` say how many tokens the
    /// engine found in its prefix cache.
    pub(crate) fn new(
        codec: Arc<dyn TextCodec>,
        options: SglangOptions,
        request_ids: Vec<String>,
        prompt_lengths: Vec<usize>,
        cached: Vec<CachedPromptTokens>,
    ) -> Self {
        Self { codec, options, request_ids, prompt_lengths, cached, sequences: BTreeMap::new() }
    }

    fn absorb(&mut self, delta: ChoiceDelta) -> u32 {
        let sequence = self.sequences.entry(delta.index).or_default();
        sequence.prompt_index = delta.prompt_index;
        sequence.text.push_str(&delta.text);
        sequence.output_ids.extend(delta.token_ids);
        sequence.logprobs.extend(delta.logprobs);
        sequence.prompt = delta.prompt.or(sequence.prompt.take());
        sequence.finish = delta.finish.or(sequence.finish.take());
        sequence.segments = delta.segments.or(sequence.segments.take());
        delta.index
    }

    fn triple(&self, logprob: Option<f32>, token: u32) -> Value {
        let text = self.options.text_in_logprobs.then(|| self.codec.decode(&[token]));
        to_value(&(logprob.map(clamp_logprob), token, text))
    }

    fn top(&self, top: &[(u32, f32)]) -> Value {
        Value::Array(top.iter().map(|&(token, logprob)| self.triple(Some(logprob), token)).collect())
    }

    fn output(&self, sequence: &Sequence, index: Option<u32>) -> Value {
        let completion_tokens = sequence.output_ids.len();
        let mut meta = json!({
            "id": self.request_ids.get(sequence.prompt_index).cloned().unwrap_or_default(),
            "finish_reason": sequence.finish.as_ref().map(|finish| finish_reason(finish, completion_tokens)),
            "prompt_tokens": self.prompt_lengths.get(sequence.prompt_index).copied().unwrap_or(0),
            "completion_tokens": completion_tokens,
            "cached_tokens": self.cached.get(sequence.prompt_index).map_or(0, CachedPromptTokens::get),
        });
        if let Some(segments) = &sequence.segments {
            meta["segments"] = json!(segments_json(segments));
            if let Some(last) = segments.last() {
                meta["weight_version"] = json!(last.version.0.to_string());
            }
        }
        if self.options.return_logprob {
            let output: Vec<Value> =
                sequence.logprobs.iter().map(|entry| self.triple(Some(entry.logprob), entry.token)).collect();
            meta["output_token_logprobs"] = Value::Array(output);
            if self.options.top_logprobs_num > 0 {
                let top =
                    sequence.logprobs.iter().map(|entry| self.top(entry.top.as_ref().map_or(&[][..], |top| &top.top)));
                meta["output_top_logprobs"] = Value::Array(top.collect());
            }
            if let (Some(start), Some(prompt)) = (self.options.logprob_start_len, &sequence.prompt) {
                self.input_logprobs(&mut meta, prompt, start);
            }
        }
        let mut output = json!({"text": sequence.text, "output_ids": sequence.output_ids, "meta_info": meta});
        if let Some(index) = index {
            output["index"] = json!(index);
        }
        output
    }

    fn input_logprobs(&self, meta: &mut Value, prompt: &PromptLogprobs, start: usize) {
        let positions = start.min(prompt.token_ids.len())..prompt.token_ids.len();
        let input: Vec<Value> = positions
            .clone()
            .map(|position| {
                let logprob = prompt.logprobs.get(position).copied().filter(|logprob| !logprob.is_nan());
                self.triple(logprob, prompt.token_ids[position])
            })
            .collect();
        meta["input_token_logprobs"] = Value::Array(input);
        if self.options.top_logprobs_num > 0 {
            let top = positions.map(|position| {
                let alternatives = prompt.top.as_ref().and_then(|top| top.get(position));
                self.top(alternatives.map_or(&[][..], |top| &top.top))
            });
            meta["input_top_logprobs"] = Value::Array(top.collect());
        }
    }
}

/// SGLang's finish reason object.
fn finish_reason(finish: &Finish, completion_tokens: usize) -> Value {
    match (finish.reason, &finish.matched) {
        (FinishReason::Stop, Some(Matched::Token(token))) => json!({"type": "stop", "matched": token}),
        (FinishReason::Stop, Some(Matched::Text(text))) => json!({"type": "stop", "matched": text}),
        (FinishReason::Stop, None) => json!({"type": "stop", "matched": null}),
        (FinishReason::Length, _) => json!({"type": "length", "length": completion_tokens}),
        (FinishReason::Abort, _) => {
            let message = if completion_tokens == 0 { ABORTED_BEFORE_PREFILL } else { ABORTED };
            json!({"type": "abort", "message": message})
        }
    }
}

impl ChunkRenderer for SglangRender {
    type Unary = Value;

    fn unary(mut self, deltas: Vec<ChoiceDelta>) -> Value {
        for delta in deltas {
            self.absorb(delta);
        }
        let outputs: Vec<Value> = self.sequences.values().map(|sequence| self.output(sequence, None)).collect();
        match <[Value; 1]>::try_from(outputs) {
            Ok([one]) if !self.options.as_list => one,
            Ok([one]) => Value::Array(vec![one]),
            Err(outputs) => Value::Array(outputs),
        }
    }

    fn api(&self) -> Api {
        Api::Sglang
    }

    fn chunks(&mut self, delta: ChoiceDelta) -> Vec<String> {
        let index = self.absorb(delta);
        let with_index = self.options.as_list.then_some(index);
        self.sequences.get(&index).map(|sequence| to_json(&self.output(sequence, with_index))).into_iter().collect()
    }

    fn finish(&mut self) -> Vec<String> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::{AdapterVersion, TopLogprobs};

    use super::*;
    use loragate_text::testing::ByteCodec;

    fn delta(index: u32, text: &str, finish: Option<Finish>) -> ChoiceDelta {
        let token_ids: Vec<u32> = text.bytes().map(u32::from).collect();
        let logprobs = token_ids
            .iter()
            .map(|&token| TokenLogprob {
                token,
                logprob: -0.5,
                top: Some(TopLogprobs { rank: 1, top: vec![(token, -0.5)] }),
                text_offset: 0,
            })
            .collect();
        ChoiceDelta {
            index,
            prompt_index: index as usize,
            text: text.into(),
            token_ids,
            logprobs,
            prompt: None,
            segments: finish
                .as_ref()
                .map(|_| vec![Segment { version: AdapterVersion(4), kv_version: AdapterVersion(4), start: 0, end: 2 }]),
            finish,
            version: Some(AdapterVersion(4)),
        }
    }

    fn render(as_list: bool) -> SglangRender {
        let options = SglangOptions {
            return_logprob: true,
            logprob_start_len: None,
            top_logprobs_num: 1,
            text_in_logprobs: false,
            as_list,
        };
        SglangRender::new(Arc::new(ByteCodec), options, vec!["r0".into(), "r1".into()], vec![3, 4], Vec::new())
    }

    #[test]
    fn a_single_prompt_answers_one_object_in_sglangs_shape() {
        let abort = Finish { reason: FinishReason::Abort, matched: None };
        let answer = render(false).unary(vec![delta(0, "m", None), delta(0, "e", Some(abort))]);
        assert_eq!(answer["text"], "me");
        assert_eq!(answer["output_ids"], json!([109, 101]));
        let meta = &answer["meta_info"];
        assert_eq!(
            (&meta["id"], &meta["prompt_tokens"], &meta["completion_tokens"]),
            (&json!("r0"), &json!(3), &json!(2))
        );
        assert_eq!(meta["finish_reason"]["type"], "abort");
        assert!(meta["finish_reason"]["message"].as_str().is_some_and(|m| !m.starts_with("Abort before prefill")));
        assert_eq!(meta["output_token_logprobs"], json!([[-0.5, 109, null], [-0.5, 101, null]]));
        assert_eq!(meta["output_top_logprobs"][0], json!([[-0.5, 109, null]]));
        assert_eq!((&meta["weight_version"], &meta["segments"][0]["lora_version"]), (&json!("4"), &json!(4)));
    }

    #[test]
    fn a_batch_answers_a_list_in_order_with_finish_reasons() {
        let stop = Finish { reason: FinishReason::Stop, matched: Some(Matched::Token(257)) };
        let length = Finish { reason: FinishReason::Length, matched: None };
        let answer = render(true).unary(vec![delta(1, "b", Some(length)), delta(0, "a", Some(stop))]);
        assert_eq!(answer[0]["meta_info"]["finish_reason"], json!({"type": "stop", "matched": 257}));
        assert_eq!(answer[1]["meta_info"]["finish_reason"], json!({"type": "length", "length": 1}));
        assert_eq!(answer[1]["meta_info"]["id"], "r1");
        let empty = Finish { reason: FinishReason::Abort, matched: None };
        let aborted = render(false).unary(vec![ChoiceDelta { logprobs: Vec::new(), ..delta(0, "", Some(empty)) }]);
        assert!(
            aborted["meta_info"]["finish_reason"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Abort before prefill"))
        );
        assert_eq!(aborted["meta_info"]["output_token_logprobs"], json!([]), "present even when empty");
    }
}
