//! Logprob pieces several API families render the same way: token labels (the token's text, or vLLM's
//! `"token_id:N"`), the clamp of `-inf` to OpenAI's `-9999.0`, ordered `{token: logprob}` maps, and vLLM's
//! `prompt_logprobs` list.

use std::sync::Arc;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use super::choice::{PromptLogprobs, TokenLogprob};
use loragate_text::TextCodec;

/// The logprob OpenAI and vLLM send for an impossible token (JSON has no `-Infinity`).
const FLOOR: f32 = -9999.0;

/// `logprob`, with `-inf` (and anything below) raised to `-9999.0` as vLLM does.
pub(crate) fn clamp_logprob(logprob: f32) -> f32 {
    if logprob.is_nan() { logprob } else { logprob.max(FLOOR) }
}

/// How a token is named in logprobs: its own text, or `"token_id:N"` (vLLM's `return_tokens_as_token_ids`).
pub(crate) fn token_label(codec: &dyn TextCodec, token: u32, as_token_ids: bool) -> String {
    if as_token_ids { format!("token_id:{token}") } else { codec.decode(&[token]) }
}

/// A `{label: logprob}` object in a given order, each label once (the first occurrence wins).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct OrderedLogprobs(pub(crate) Vec<(String, f32)>);

impl OrderedLogprobs {
    /// Adds `label` unless it is already there.
    pub(crate) fn push(&mut self, label: String, logprob: f32) {
        if !self.0.iter().any(|(existing, _)| *existing == label) {
            self.0.push((label, clamp_logprob(logprob)));
        }
    }
}

impl Serialize for OrderedLogprobs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (label, logprob) in &self.0 {
            map.serialize_entry(label, logprob)?;
        }
        map.end()
    }
}

/// One token of OpenAI's chat `logprobs.content` (also vLLM's generate's): the token's label, its logprob, its
/// label's UTF-8 bytes (`null` for `"token_id:N"` labels), and the most likely tokens at its position.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ContentLogprob {
    token: String,
    logprob: f32,
    bytes: Option<Vec<u8>>,
    top_logprobs: Vec<TopContentLogprob>,
}

/// One alternative of a [`ContentLogprob`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct TopContentLogprob {
    token: String,
    logprob: f32,
    bytes: Option<Vec<u8>>,
}

/// The content entries of `entries`: per token its label and logprob, and its alternatives (as many as were asked
/// for: the `k` most likely tokens, OpenAI's meaning of `top_logprobs`).
pub(crate) fn content_logprobs(
    codec: &dyn TextCodec,
    entries: &[TokenLogprob],
    as_token_ids: bool,
) -> Vec<ContentLogprob> {
    let bytes = |label: &str| (!as_token_ids).then(|| label.as_bytes().to_vec());
    entries
        .iter()
        .map(|entry| {
            let token = token_label(codec, entry.token, as_token_ids);
            let top_logprobs = entry
                .top
                .iter()
                .flat_map(|top| &top.top)
                .map(|&(other, logprob)| {
                    let token = token_label(codec, other, as_token_ids);
                    TopContentLogprob { bytes: bytes(&token), token, logprob: clamp_logprob(logprob) }
                })
                .collect();
            ContentLogprob { bytes: bytes(&token), token, logprob: clamp_logprob(entry.logprob), top_logprobs }
        })
        .collect()
}

/// vLLM's `prompt_logprobs`: one entry per prompt token, the first `null`, each other an object keyed by token id
/// (as a string), the prompt token's own entry first (clients take the first value), then the most likely tokens,
/// each `{"logprob", "rank", "decoded_token"}`. Serialized directly, so the order of the keys is kept.
#[derive(Clone)]
pub(crate) struct VllmPromptLogprobs {
    /// What the engine reported.
    pub(crate) prompt: Arc<PromptLogprobs>,
    /// For `decoded_token`.
    pub(crate) codec: Arc<dyn TextCodec>,
    /// `decoded_token` as `"token_id:N"`.
    pub(crate) as_token_ids: bool,
}

impl std::fmt::Debug for VllmPromptLogprobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VllmPromptLogprobs").field("prompt", &self.prompt).finish()
    }
}

/// One `{"logprob", "rank", "decoded_token"}`.
#[derive(Serialize)]
struct VllmLogprob {
    logprob: f32,
    rank: Option<u32>,
    decoded_token: String,
}

/// One position's object.
struct Position {
    entries: Vec<(u32, VllmLogprob)>,
}

impl Serialize for Position {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.entries.len()))?;
        for (token, entry) in &self.entries {
            map.serialize_entry(&token.to_string(), entry)?;
        }
        map.end()
    }
}

impl VllmPromptLogprobs {
    fn position(&self, index: usize) -> Option<Position> {
        let token = *self.prompt.token_ids.get(index)?;
        let logprob = *self.prompt.logprobs.get(index)?;
        if index == 0 || logprob.is_nan() {
            return None;
        }
        let label = |token| token_label(&*self.codec, token, self.as_token_ids);
        let alternatives = self.prompt.top.as_ref().and_then(|top| top.get(index));
        let own = VllmLogprob {
            logprob: clamp_logprob(logprob),
            rank: alternatives.map(|top| top.rank),
            decoded_token: label(token),
        };
        let mut entries = vec![(token, own)];
        let others = alternatives.map(|top| top.top.as_slice()).unwrap_or_default();
        for (rank, &(other, other_logprob)) in (1u32..).zip(others) {
            if other != token {
                let entry = VllmLogprob {
                    logprob: clamp_logprob(other_logprob),
                    rank: Some(rank),
                    decoded_token: label(other),
                };
                entries.push((other, entry));
            }
        }
        Some(Position { entries })
    }
}

impl Serialize for VllmPromptLogprobs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = self.prompt.token_ids.len();
        let mut seq = serializer.serialize_seq(Some(len))?;
        for index in 0..len {
            seq.serialize_element(&self.position(index))?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::TopLogprobs;
    use serde_json::json;

    use super::*;
    use loragate_text::testing::ByteCodec;

    #[test]
    fn prompt_logprobs_put_the_prompt_token_first_even_outside_the_top() {
        let prompt = Arc::new(PromptLogprobs {
            token_ids: Arc::from(vec![104, 105, 33]),
            logprobs: vec![f32::NAN, -2.0, f32::NEG_INFINITY],
            top: Some(vec![
                TopLogprobs::default(),
                TopLogprobs { rank: 3, top: vec![(97, -0.1)] },
                TopLogprobs { rank: 1, top: vec![(33, -0.5), (98, -1.5)] },
            ]),
        });
        let codec: Arc<dyn TextCodec> = Arc::new(ByteCodec);
        let rendered = VllmPromptLogprobs { prompt: prompt.clone(), codec: codec.clone(), as_token_ids: false };
        let text = serde_json::to_string(&rendered).expect("json");
        assert!(text.find("\"105\"") < text.find("\"97\""), "the prompt token's own entry comes first: {text}");
        let value: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(
            value,
            json!([
                null,
                {"105": {"logprob": -2.0, "rank": 3, "decoded_token": "i"}, "97": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}},
                {"33": {"logprob": -9999.0, "rank": 1, "decoded_token": "!"}, "98": {"logprob": -1.5, "rank": 2, "decoded_token": "b"}},
            ])
        );
        let as_ids = VllmPromptLogprobs { prompt, codec, as_token_ids: true };
        assert_eq!(serde_json::to_value(&as_ids).expect("json")[1]["105"]["decoded_token"], "token_id:105");
    }

    #[test]
    fn content_entries_carry_labels_bytes_and_the_alternatives() {
        let entries = [TokenLogprob {
            token: 104,
            logprob: -0.5,
            top: Some(TopLogprobs { rank: 2, top: vec![(105, -0.25), (104, -0.5)] }),
            text_offset: 0,
        }];
        let text = serde_json::to_value(content_logprobs(&ByteCodec, &entries, false)).expect("json");
        assert_eq!(
            text,
            json!([{"token": "h", "logprob": -0.5, "bytes": [104], "top_logprobs": [
                {"token": "i", "logprob": -0.25, "bytes": [105]}, {"token": "h", "logprob": -0.5, "bytes": [104]}]}])
        );
        let ids = serde_json::to_value(content_logprobs(&ByteCodec, &entries, true)).expect("json");
        assert_eq!((&ids[0]["token"], &ids[0]["bytes"]), (&json!("token_id:104"), &json!(null)));
        assert_eq!(ids[0]["top_logprobs"][0]["token"], "token_id:105");
    }

    #[test]
    fn ordered_logprobs_keep_their_order_and_each_label_once() {
        let mut map = OrderedLogprobs::default();
        map.push("z".into(), -1.0);
        map.push("a".into(), f32::NEG_INFINITY);
        map.push("z".into(), -0.5);
        assert_eq!(serde_json::to_string(&map).expect("json"), r#"{"z":-1.0,"a":-9999.0}"#);
    }
}
