//! What a sample has produced across attempts: tokens, logprobs and version segments, merged so that every token
//! still says which adapter version produced it.

use loragate_proto::v1::{FinishReason, SampledSequence, VersionSegment};

use crate::error::ClientError;

/// One sequence's output across attempts.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SequenceAccumulator {
    token_ids: Vec<u32>,
    logprobs: Vec<f32>,
    segments: Vec<VersionSegment>,
}

impl SequenceAccumulator {
    /// Appends one attempt's output. The attempt's segments are relative to its own tokens; they are shifted past
    /// what was accumulated before and merged with the last segment when both the version and the KV version are
    /// the same. A `kv_version` of 0 on an adapter's segment (a server that predates the field) is its
    /// `lora_version`: an adapter's versions start at 1, so 0 is never a version its keys and values came from. Logprobs must
    /// match tokens one for one and segments must cover the attempt's tokens exactly: nothing is invented.
    pub(crate) fn append(&mut self, attempt: &SampledSequence) -> Result<(), ClientError> {
        let produced = attempt.token_ids.len();
        if attempt.logprobs.len() != produced {
            return Err(ClientError::Protocol(format!(
                "{produced} tokens came with {} logprobs",
                attempt.logprobs.len()
            )));
        }
        let mut expected_start = 0u32;
        for segment in &attempt.segments {
            if segment.start != expected_start || segment.end < segment.start {
                return Err(ClientError::Protocol(format!("segments do not tile the tokens: {:?}", attempt.segments)));
            }
            expected_start = segment.end;
        }
        if expected_start as usize != produced {
            return Err(ClientError::Protocol(format!(
                "segments cover {expected_start} of {produced} tokens: {:?}",
                attempt.segments
            )));
        }
        let offset = self.len();
        for segment in attempt.segments.iter().filter(|segment| segment.end > segment.start) {
            let kv_version = if segment.kv_version == 0 { segment.lora_version } else { segment.kv_version };
            let shifted = VersionSegment {
                lora_version: segment.lora_version,
                kv_version,
                start: segment.start + offset,
                end: segment.end + offset,
            };
            match self.segments.last_mut() {
                Some(last)
                    if last.lora_version == shifted.lora_version
                        && last.kv_version == shifted.kv_version
                        && last.end == shifted.start =>
                {
                    last.end = shifted.end;
                }
                _ => self.segments.push(shifted),
            }
        }
        self.token_ids.extend_from_slice(&attempt.token_ids);
        self.logprobs.extend_from_slice(&attempt.logprobs);
        Ok(())
    }

    /// Tokens accumulated so far.
    pub(crate) fn len(&self) -> u32 {
        u32::try_from(self.token_ids.len()).unwrap_or(u32::MAX)
    }

    /// The tokens accumulated so far.
    pub(crate) fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    /// The finished sequence.
    pub(crate) fn finish(self, reason: FinishReason) -> SampledSequence {
        SampledSequence {
            token_ids: self.token_ids,
            logprobs: self.logprobs,
            finish_reason: reason.into(),
            segments: self.segments,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(tokens: &[u32], segments: &[(u64, u32, u32)]) -> SampledSequence {
        SampledSequence {
            token_ids: tokens.to_vec(),
            logprobs: tokens.iter().map(|&t| -(t as f32)).collect(),
            finish_reason: FinishReason::Abort.into(),
            segments: segments
                .iter()
                .map(|&(v, s, e)| VersionSegment { lora_version: v, kv_version: v, start: s, end: e })
                .collect(),
        }
    }

    #[test]
    fn segments_are_shifted_past_earlier_attempts_and_merged_per_version() {
        let mut accumulated = SequenceAccumulator::default();
        accumulated.append(&attempt(&[1, 2, 3], &[(1, 0, 3)])).expect("first");
        accumulated.append(&attempt(&[4, 5], &[(1, 0, 2)])).expect("same version continues the segment");
        accumulated.append(&attempt(&[6, 7, 8, 9], &[(2, 0, 4)])).expect("new version");
        accumulated.append(&attempt(&[], &[])).expect("an empty attempt changes nothing");
        let sequence = accumulated.finish(FinishReason::Length);
        assert_eq!(sequence.token_ids, vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(sequence.logprobs.len(), 9);
        let segments: Vec<_> = sequence.segments.iter().map(|s| (s.lora_version, s.start, s.end)).collect();
        assert_eq!(segments, vec![(1, 0, 5), (2, 5, 9)]);
        assert_eq!(sequence.finish_reason(), FinishReason::Length);
    }

    #[test]
    fn kv_versions_are_carried_split_segments_and_default_to_the_lora_version() {
        let mut accumulated = SequenceAccumulator::default();
        accumulated.append(&attempt(&[1, 2], &[(1, 0, 2)])).expect("first");
        let mut reused = attempt(&[3, 4, 5], &[(2, 0, 3)]);
        reused.segments[0].kv_version = 1;
        accumulated.append(&reused).expect("resumed on the parked keys and values of v1");
        let mut recomputed = attempt(&[6], &[(2, 0, 1)]);
        recomputed.segments[0].kv_version = 0;
        accumulated.append(&recomputed).expect("a server that predates kv_version");
        let segments: Vec<_> =
            accumulated.segments.iter().map(|s| (s.lora_version, s.kv_version, s.start, s.end)).collect();
        assert_eq!(segments, vec![(1, 1, 0, 2), (2, 1, 2, 5), (2, 2, 5, 6)]);
    }

    #[test]
    fn missing_logprobs_or_broken_segments_are_errors_never_filled_in() {
        let mut accumulated = SequenceAccumulator::default();
        let mut short = attempt(&[1, 2], &[(1, 0, 2)]);
        short.logprobs.pop();
        assert!(matches!(accumulated.append(&short), Err(ClientError::Protocol(_))));
        assert!(matches!(accumulated.append(&attempt(&[1, 2], &[(1, 0, 1)])), Err(ClientError::Protocol(_))));
        assert!(matches!(accumulated.append(&attempt(&[1, 2], &[(1, 1, 2)])), Err(ClientError::Protocol(_))));
        assert_eq!(accumulated.len(), 0, "a rejected attempt leaves nothing behind");
    }
}
