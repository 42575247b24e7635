//! The core's validated request as vLLM's `GenerateRequest` for one sequence, and vLLM's responses back, with the
//! protocol's traps handled: the real budget is always sent (`max_new_tokens = 0` would mean 20), token ids and
//! logprobs are asked for explicitly (they default to off), `top_k = 0` disables it, the base model is the empty
//! `lora_name`, and every request id is unique so it can be aborted. Top logprobs travel as `top_n` candidates and
//! come back as each token's rank and candidate tokens.

use loragate_core::{FinishReason, SampleRequest, TopLogprobs};
use vllm_proto as pb;
use vllm_proto::finish_info::FinishReason as WireReason;

use crate::worker::{SequenceEvent, WorkerError};

/// What a sequence's responses are checked against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expected {
    /// The prompt's length (prompt logprobs and candidates come one per prompt token).
    pub(crate) prompt_len: usize,
    /// The prompt's logprobs were asked for.
    pub(crate) prompt_logprobs: bool,
    /// The prompt's candidates were asked for.
    pub(crate) prompt_candidates: bool,
    /// Output candidates were asked for.
    pub(crate) output_candidates: bool,
}

/// The events of one `GenerateResponse`: the prompt's logprobs (when asked for), new tokens, the finish.
pub(crate) fn events(response: pb::GenerateResponse, expected: Expected) -> Vec<Result<SequenceEvent, WorkerError>> {
    let mut events = Vec::new();
    if let Some(info) = response.prompt_info
        && expected.prompt_logprobs
    {
        let (ranks, candidates) = (info.ranks.clone(), info.candidate_tokens.clone());
        let top = match expected.prompt_candidates {
            true => top_logprobs(ranks, candidates, expected.prompt_len).map(Some),
            false => Some(None),
        };
        let (Some(logprobs), Some(top)) = (prompt_logprobs(info, expected.prompt_len), top) else {
            return vec![Err(WorkerError::Malformed("prompt logprobs that do not match the prompt".into()))];
        };
        events.push(Ok(SequenceEvent::PromptLogprobs { logprobs, top }));
    }
    let Some(output) = response.outputs else { return events };
    let count = output.token_ids.len();
    if count != output.num_tokens as usize || output.logprobs.len() != count {
        events.push(Err(WorkerError::Malformed(format!(
            "{} tokens with {count} ids and {} logprobs",
            output.num_tokens,
            output.logprobs.len()
        ))));
        return events;
    }
    let top = if expected.output_candidates {
        match top_logprobs(output.ranks, output.candidate_tokens, count) {
            Some(top) => top,
            None => {
                let why = format!("{count} tokens without a rank and candidates for each");
                events.push(Err(WorkerError::Malformed(why)));
                return events;
            }
        }
    } else {
        Vec::new()
    };
    if count > 0 {
        events.push(Ok(SequenceEvent::Tokens { token_ids: output.token_ids, logprobs: output.logprobs, top }));
    }
    if let Some(finish) = output.finish_info {
        events.push(Ok(SequenceEvent::Finished(finish_reason(&finish))));
    }
    events
}

/// The request for sequence `sequence` of `request`, as `worker_request_id` on adapter `engine_name` (`NAME@V`, or
/// empty for the base model). Only the sequence that reports the prompt's logprobs asks for them.
pub(crate) fn generate_request(
    request: &SampleRequest,
    sequence: u32,
    worker_request_id: String,
    engine_name: &str,
    with_prompt_logprobs: bool,
) -> pb::GenerateRequest {
    let params = request.params();
    let top_n = |n: u32| pb::CandidateTokens { select: Some(pb::candidate_tokens::Select::TopN(n)) };
    let prompt_top_n = request.prompt_top_logprobs().filter(|_| with_prompt_logprobs);
    pb::GenerateRequest {
        request_id: worker_request_id,
        prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids: request.prompt().to_vec() })),
        temperature: Some(params.temperature()),
        sampling: Some(pb::RandomSampling {
            num_sequences: 1,
            top_k: Some(params.top_k().unwrap_or(0)),
            top_p: Some(params.top_p()),
            min_p: Some(params.min_p()),
            // Sequence i of a seeded request uses seed + i, as the in-process engine does; the bits travel as int64.
            seed: params.seed().map(|seed| seed.wrapping_add(u64::from(sequence)) as i64),
        }),
        decoding: Some(pb::DecodingParameters {
            presence_penalty: params.presence_penalty(),
            frequency_penalty: params.frequency_penalty(),
            repetition_penalty: params.repetition_penalty(),
            ..Default::default()
        }),
        stopping: Some(pb::StoppingCriteria {
            max_new_tokens: params.max_tokens(),
            min_new_tokens: params.min_tokens(),
            stop_token_ids: params.stop_token_ids().to_vec(),
            ignore_eos: params.ignore_eos(),
            ..Default::default()
        }),
        response: Some(pb::ResponseOptions {
            prompt_logprobs: with_prompt_logprobs,
            prompt_candidates: prompt_top_n.map(top_n),
            output_text: Some(false),
            output_token_ids: true,
            output_logprobs: true,
            output_candidates: (params.top_logprobs() > 0).then(|| top_n(params.top_logprobs())),
            ..Default::default()
        }),
        lora_name: engine_name.to_owned(),
        ..Default::default()
    }
}

/// Why a sequence ended, from its `FinishInfo` (anything but a stop or the length is an abort).
fn finish_reason(info: &pb::FinishInfo) -> FinishReason {
    match info.finish_reason() {
        WireReason::Length => FinishReason::Length,
        WireReason::Stop => FinishReason::Stop,
        WireReason::Aborted | WireReason::NotFinished => FinishReason::Abort,
    }
}

/// The prompt logprobs in the core's convention (one per prompt token, the first NaN: nothing precedes it; vLLM
/// reports it as 0), or `None` if the worker sent a different count.
fn prompt_logprobs(info: pb::PromptInfo, prompt_len: usize) -> Option<Vec<f32>> {
    let mut logprobs = info.logprobs;
    if logprobs.len() != prompt_len {
        return None;
    }
    if let Some(first) = logprobs.first_mut() {
        *first = f32::NAN;
    }
    Some(logprobs)
}

/// The top logprobs of `count` positions from their `ranks` and candidate tokens (most likely first), or `None` if
/// the worker sent a different count.
fn top_logprobs(ranks: Vec<u32>, candidates: Vec<pb::CandidateTokenInfo>, count: usize) -> Option<Vec<TopLogprobs>> {
    if ranks.len() != count || candidates.len() != count {
        return None;
    }
    let top = ranks.into_iter().zip(candidates).map(|(rank, candidates)| {
        let mut tokens = candidates.tokens;
        tokens.sort_by_key(|token| token.rank);
        TopLogprobs { rank, top: tokens.into_iter().map(|token| (token.id, token.logprob)).collect() }
    });
    Some(top.collect())
}

#[cfg(test)]
mod tests {
    use loragate_core::{ModelInfo, RawSampleRequest};

    use super::*;

    fn parse(raw: RawSampleRequest) -> SampleRequest {
        let model = ModelInfo { vocab_size: 260, context_length: 4096, eos_token_ids: vec![257] };
        SampleRequest::parse(raw, &model).expect("valid")
    }

    #[test]
    fn the_traps_are_handled_and_every_sampling_field_is_mapped() {
        let request = parse(RawSampleRequest {
            prompt_token_ids: vec![1, 2, 3],
            max_tokens: None,
            temperature: 0.8,
            top_p: Some(0.9),
            top_k: 7,
            seed: Some(u64::MAX),
            stop_token_ids: vec![9],
            ignore_eos: true,
            num_samples: 2,
            min_p: 0.05,
            repetition_penalty: Some(1.1),
            presence_penalty: 0.5,
            frequency_penalty: -0.5,
            min_tokens: 2,
            top_logprobs: 4,
            prompt_top_logprobs: Some(3),
            ..Default::default()
        });
        let wire = generate_request(&request, 1, "id-1".into(), "meow@3", false);
        let stopping = wire.stopping.expect("stopping");
        assert_eq!(stopping.max_new_tokens, 4093, "unset max_tokens is the context left, never 0 (= vLLM's 20)");
        assert_eq!((stopping.stop_token_ids, stopping.ignore_eos), (vec![9], true));
        let response = wire.response.expect("response options");
        assert!(response.output_token_ids && response.output_logprobs, "both default to off in vLLM");
        assert!(!response.prompt_logprobs);
        let sampling = wire.sampling.expect("sampling");
        assert_eq!((sampling.num_sequences, sampling.top_k, sampling.top_p), (1, Some(7), Some(0.9)));
        assert_eq!(sampling.seed, Some(0), "sequence 1 of seed u64::MAX is seed + 1, wrapped, as int64 bits");
        assert_eq!(wire.temperature, Some(0.8));
        assert_eq!(sampling.min_p, Some(0.05));
        let decoding = wire.decoding.expect("decoding");
        assert_eq!(
            (decoding.repetition_penalty, decoding.presence_penalty, decoding.frequency_penalty),
            (1.1, 0.5, -0.5)
        );
        assert_eq!(stopping.min_new_tokens, 2);
        let top_n = |candidates: Option<pb::CandidateTokens>| candidates.and_then(|c| c.select);
        assert_eq!(top_n(response.output_candidates), Some(pb::candidate_tokens::Select::TopN(4)));
        assert_eq!(top_n(response.prompt_candidates), None, "only the sequence reporting the prompt asks for it");
        assert_eq!((wire.lora_name.as_str(), wire.request_id.as_str()), ("meow@3", "id-1"));
        assert!(matches!(wire.prompt, Some(pb::generate_request::Prompt::TokenIds(ids)) if ids.ids == [1, 2, 3]));

        let greedy = generate_request(
            &parse(RawSampleRequest { prompt_token_ids: vec![1], ..Default::default() }),
            0,
            "b".into(),
            "",
            true,
        );
        let sampling = greedy.sampling.expect("sampling");
        assert_eq!((sampling.top_k, sampling.seed, greedy.temperature), (Some(0), None, Some(0.0)), "0 disables top-k");
        assert_eq!(greedy.lora_name, "", "the base model");
        let response = greedy.response.expect("response");
        assert!(response.prompt_logprobs);
        assert_eq!(response.output_candidates, None, "no top logprobs asked for");
    }

    #[test]
    fn finishes_and_prompt_logprobs_come_back_in_the_cores_terms() {
        let info = |reason: WireReason| pb::FinishInfo { finish_reason: reason.into(), ..Default::default() };
        assert_eq!(finish_reason(&info(WireReason::Length)), FinishReason::Length);
        assert_eq!(finish_reason(&info(WireReason::Stop)), FinishReason::Stop);
        assert_eq!(finish_reason(&info(WireReason::Aborted)), FinishReason::Abort);
        let prompt = pb::PromptInfo { logprobs: vec![0.0, -1.0, -2.0], ..Default::default() };
        let logprobs = prompt_logprobs(prompt.clone(), 3).expect("one per prompt token");
        assert!(logprobs[0].is_nan());
        assert_eq!(&logprobs[1..], &[-1.0, -2.0]);
        assert_eq!(prompt_logprobs(prompt, 4), None, "a count that does not match the prompt is refused");
        let info = |id, rank| pb::candidate_token_info::TokenInfo { id, logprob: -(rank as f32), rank };
        let candidates = vec![pb::CandidateTokenInfo { tokens: vec![info(8, 2), info(3, 1)] }];
        let top = top_logprobs(vec![5], candidates.clone(), 1).expect("one position");
        assert_eq!(top, vec![TopLogprobs { rank: 5, top: vec![(3, -1.0), (8, -2.0)] }], "most likely first");
        assert_eq!(top_logprobs(vec![5, 1], candidates, 2), None, "a count that does not match is refused");
    }

    #[test]
    fn a_response_becomes_prompt_logprobs_tokens_and_the_finish_checked_against_what_was_asked() {
        let expected =
            Expected { prompt_len: 2, prompt_logprobs: true, prompt_candidates: false, output_candidates: false };
        let response = pb::GenerateResponse {
            prompt_info: Some(pb::PromptInfo { logprobs: vec![0.0, -1.5], ..Default::default() }),
            outputs: Some(pb::SequenceOutput {
                token_ids: vec![7, 8],
                num_tokens: 2,
                logprobs: vec![-0.1, -0.2],
                finish_info: Some(pb::FinishInfo { finish_reason: WireReason::Aborted.into(), ..Default::default() }),
                ..Default::default()
            }),
        };
        let parsed: Vec<SequenceEvent> = events(response.clone(), expected).into_iter().map(Result::unwrap).collect();
        let SequenceEvent::PromptLogprobs { logprobs, top: None } = &parsed[0] else { panic!("{parsed:?}") };
        assert!(logprobs[0].is_nan() && logprobs[1] == -1.5);
        assert_eq!(
            parsed[1..],
            [
                SequenceEvent::Tokens { token_ids: vec![7, 8], logprobs: vec![-0.1, -0.2], top: Vec::new() },
                SequenceEvent::Finished(FinishReason::Abort)
            ]
        );
        let unasked = Expected { prompt_logprobs: false, ..expected };
        assert_eq!(events(response.clone(), unasked).len(), 2, "prompt info not asked for is ignored");
        let mut short = response;
        short.outputs.as_mut().expect("outputs").logprobs.pop();
        assert!(matches!(events(short, unasked)[0], Err(WorkerError::Malformed(_))));
    }
}
