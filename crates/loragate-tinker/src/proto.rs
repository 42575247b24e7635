//! The finished sample on the wire: `tinker_public.SampleResponse` (protobuf, generated at build time from
//! `proto/tinker_public/sample_response.proto`), which is what SDK 0.38 accepts from `retrieve_future`. Tokens are
//! int32 and logprobs float32, both little-endian and packed in `bytes` fields.

use bytes::Bytes;
use prost::Message;

/// Generated code of the `tinker_public` package (sampling messages only).
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod tinker_public {
    include!(concat!(env!("OUT_DIR"), "/tinker_public.rs"));
}

use self::tinker_public::{SampleResponse, SampledSequence, StopReason};

/// How a finished sequence ended, in the SDK's terms (it has no "abort").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// End-of-sequence, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
}

/// One finished sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct FinishedSequence {
    /// The generated tokens.
    pub(crate) tokens: Vec<u32>,
    /// One logprob per token.
    pub(crate) logprobs: Vec<f32>,
    /// Why it ended (`None` until it did).
    pub(crate) ending: Option<Ending>,
}

/// Encodes a finished sample. `prompt_logprobs` is `Some` only when the request asked for them: one per prompt token,
/// the first NaN, and NaN before the last `last_n` when that is set.
pub(crate) fn encode_sample_response(
    sequences: Vec<FinishedSequence>,
    prompt_logprobs: Option<Vec<f32>>,
    last_n: Option<usize>,
) -> Bytes {
    let prompt_logprobs = prompt_logprobs.map(|mut logprobs| {
        if let Some(keep) = last_n {
            let masked = logprobs.len().saturating_sub(keep);
            logprobs[..masked].fill(f32::NAN);
        }
        if let Some(first) = logprobs.first_mut() {
            *first = f32::NAN;
        }
        float32_le(&logprobs)
    });
    let response = SampleResponse {
        sequences: sequences
            .into_iter()
            .map(|sequence| SampledSequence {
                stop_reason: match sequence.ending {
                    Some(Ending::Length) => StopReason::Length,
                    Some(Ending::Stop) | None => StopReason::Stop,
                } as i32,
                tokens: sequence.tokens.iter().flat_map(|&token| (token as i32).to_le_bytes()).collect(),
                logprobs: Some(float32_le(&sequence.logprobs)),
                topk_sampled_logprobs: None,
            })
            .collect(),
        prompt_logprobs,
        topk_prompt_logprobs: None,
        prompt_cache_hit_tokens: 0,
        target_prompt_logprobs: None,
        prompt_alt_tokens: None,
    };
    response.encode_to_vec().into()
}

fn float32_le(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|value| value.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int32s(bytes: &[u8]) -> Vec<i32> {
        bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }

    fn float32s(bytes: &[u8]) -> Vec<f32> {
        bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }

    #[test]
    fn sequences_are_packed_little_endian_with_the_sdks_stop_reasons() {
        let sequences = vec![
            FinishedSequence { tokens: vec![109, 257], logprobs: vec![-0.5, -1.25], ending: Some(Ending::Stop) },
            FinishedSequence { tokens: vec![1, 2, 3], logprobs: vec![0.0, -0.1, -0.2], ending: Some(Ending::Length) },
        ];
        let bytes = encode_sample_response(sequences, None, None);
        let decoded = SampleResponse::decode(bytes).expect("decodes");
        assert_eq!(decoded.sequences.len(), 2);
        let (first, second) = (&decoded.sequences[0], &decoded.sequences[1]);
        assert_eq!(first.tokens, [109, 0, 0, 0, 1, 1, 0, 0], "int32 little-endian, 4 bytes per token");
        assert_eq!(float32s(first.logprobs.as_deref().expect("logprobs")), [-0.5, -1.25]);
        assert_eq!(first.stop_reason(), StopReason::Stop);
        assert_eq!(int32s(&second.tokens), [1, 2, 3]);
        assert_eq!(second.stop_reason(), StopReason::Length);
        assert_eq!(decoded.prompt_logprobs, None, "absent unless asked for");
        assert_eq!(decoded.prompt_cache_hit_tokens, 0);
    }

    #[test]
    fn the_wire_bytes_are_the_sdks_schema() {
        let one = vec![FinishedSequence { tokens: vec![7], logprobs: vec![-1.0], ending: Some(Ending::Length) }];
        let bytes = encode_sample_response(one, Some(vec![0.0, -2.0]), None);
        let expected: Vec<u8> = [
            &[0x0a, 14][..],                             // field 1 (sequences), length-delimited, 14 bytes
            &[0x08, 1],                                  // SampledSequence.stop_reason = LENGTH
            &[0x12, 4, 7, 0, 0, 0],                      // .tokens = int32 LE [7]
            &[0x1a, 4, 0, 0, 0x80, 0xbf],                // .logprobs = float32 LE [-1.0]
            &[0x12, 8, 0, 0, 0xc0, 0x7f, 0, 0, 0, 0xc0], // prompt_logprobs = [NaN, -2.0]
        ]
        .concat();
        assert_eq!(bytes.as_ref(), expected.as_slice());
    }

    #[test]
    fn prompt_logprobs_start_with_nan_and_hide_all_but_the_last_n() {
        let decode = |last_n| {
            let bytes = encode_sample_response(Vec::new(), Some(vec![-9.0, -1.0, -2.0, -3.0]), last_n);
            float32s(&SampleResponse::decode(bytes).expect("decodes").prompt_logprobs.expect("asked for"))
        };
        let all = decode(None);
        assert!(all[0].is_nan());
        assert_eq!(&all[1..], [-1.0, -2.0, -3.0]);
        let last_two = decode(Some(2));
        assert!(last_two[0].is_nan() && last_two[1].is_nan());
        assert_eq!(&last_two[2..], [-2.0, -3.0]);
    }
}
