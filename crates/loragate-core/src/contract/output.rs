//! What a sampling request produces: finish reasons, version segments (token provenance), finished sequences.

use super::ids::{AdapterVersion, RequestId};

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// An end-of-sequence or stop token was sampled (it is the sequence's last token).
    Stop,
    /// The token budget or the context length was reached.
    Length,
    /// The request was aborted; the sequence holds what was produced until then.
    Abort,
}

impl FinishReason {
    /// The lowercase name used by OpenAI-style APIs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

/// The most likely tokens at one position (of a sequence or of its prompt) under the model's raw distribution,
/// and where the token actually there ranked among all tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopLogprobs {
    /// The actual token's rank: 1 + how many other tokens were at least as likely (1 = the most likely). 0 where
    /// nothing predicts the token (the first prompt token), or where it is unknown: a fleet worker whose protocol
    /// reports no ranks (vLLM's or SGLang's HTTP server) produced a token outside the `top` candidates.
    pub rank: u32,
    /// The most likely tokens with their logprobs, most likely first (as many as the request asked for).
    pub top: Vec<(u32, f32)>,
}

/// A half-open run of tokens `[start, end)` produced by one adapter version, attending to keys and values that
/// go back to one adapter version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The adapter version that produced the run.
    pub version: AdapterVersion,
    /// The oldest adapter version whose keys and values the run's tokens attended to: `version`, unless the
    /// sequence was kept with [`crate::KvPolicy::Reuse`] across a swap and resumed from the keys and values the
    /// older version had computed.
    pub kv_version: AdapterVersion,
    /// First token index.
    pub start: u32,
    /// One past the last token index.
    pub end: u32,
}

/// Builds the segments of a sequence as its tokens arrive, merging consecutive runs of the same version and the
/// same KV version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentsBuilder {
    segments: Vec<Segment>,
}

impl SegmentsBuilder {
    /// Records `count` more tokens produced by `version` over keys and values going back to `kv_version`.
    pub fn push(&mut self, version: AdapterVersion, kv_version: AdapterVersion, count: u32) {
        if count == 0 {
            return;
        }
        match self.segments.last_mut() {
            Some(last) if last.version == version && last.kv_version == kv_version => last.end += count,
            last => {
                let start = last.map_or(0, |segment| segment.end);
                self.segments.push(Segment { version, kv_version, start, end: start + count });
            }
        }
    }

    /// The segments so far, covering every token pushed.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The segments, consuming the builder.
    pub fn finish(self) -> Vec<Segment> {
        self.segments
    }
}

/// One finished sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct SequenceOutput {
    /// Generated tokens.
    pub token_ids: Vec<u32>,
    /// One logprob per generated token.
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Which adapter version produced which tokens.
    pub segments: Vec<Segment>,
    /// With `top_logprobs` asked for: one entry per generated token. Empty otherwise.
    pub top_logprobs: Vec<TopLogprobs>,
}

/// A finished sampling request.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleOutput {
    /// The request's id.
    pub request_id: RequestId,
    /// One entry per requested sample, in order.
    pub sequences: Vec<SequenceOutput>,
    /// With prompt logprobs requested: one per prompt token, the first NaN. Empty otherwise.
    pub prompt_logprobs: Vec<f32>,
    /// With prompt alternatives requested: one per prompt token (the first with rank 0 and none). Empty otherwise.
    pub prompt_top_logprobs: Vec<TopLogprobs>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_merge_runs_and_cover_every_token() {
        let (v1, v2) = (AdapterVersion(1), AdapterVersion(2));
        let mut builder = SegmentsBuilder::default();
        builder.push(v1, v1, 3);
        builder.push(v1, v1, 2);
        builder.push(v2, v2, 0);
        builder.push(v2, v1, 4);
        builder.push(v2, v1, 1);
        builder.push(v2, v2, 2);
        assert_eq!(
            builder.finish(),
            vec![
                Segment { version: v1, kv_version: v1, start: 0, end: 5 },
                Segment { version: v2, kv_version: v1, start: 5, end: 10 },
                Segment { version: v2, kv_version: v2, start: 10, end: 12 },
            ]
        );
    }
}
