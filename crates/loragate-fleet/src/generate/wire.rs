//! The core's validated request as vLLM's `GenerateRequest` for one sequence, and vLLM's responses back, with the
//! protocol's traps handled: the real budget is always sent (`max_new_tokens = 0` would mean 20), token ids and
//! logprobs are asked for explicitly (they default to off), `top_k = 0` disables it, the base model is the empty
//! `lora_name`, and every request id is unique so it can be aborted.

use loragate_core::{FinishReason, SampleRequest};
use vllm_proto as pb;
use vllm_proto::finish_info::FinishReason as WireReason;

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
    pb::GenerateRequest {
        request_id: worker_request_id,
        prompt: Some(pb::generate_request::Prompt::TokenIds(pb::TokenIds { ids: request.prompt().to_vec() })),
        temperature: Some(params.temperature()),
        sampling: Some(pb::RandomSampling {
            num_sequences: 1,
            top_k: Some(params.top_k().unwrap_or(0)),
            top_p: Some(params.top_p()),
            min_p: None,
            // Sequence i of a seeded request uses seed + i, as the in-process engine does; the bits travel as int64.
            seed: params.seed().map(|seed| seed.wrapping_add(u64::from(sequence)) as i64),
        }),
        stopping: Some(pb::StoppingCriteria {
            max_new_tokens: params.max_tokens(),
            stop_token_ids: params.stop_token_ids().to_vec(),
            ignore_eos: params.ignore_eos(),
            ..Default::default()
        }),
        response: Some(pb::ResponseOptions {
            prompt_logprobs: with_prompt_logprobs,
            output_text: Some(false),
            output_token_ids: true,
            output_logprobs: true,
            ..Default::default()
        }),
        lora_name: engine_name.to_owned(),
        ..Default::default()
    }
}

/// Why a sequence ended, from its `FinishInfo` (anything but a stop or the length is an abort).
pub(crate) fn finish_reason(info: &pb::FinishInfo) -> FinishReason {
    match info.finish_reason() {
        WireReason::Length => FinishReason::Length,
        WireReason::Stop => FinishReason::Stop,
        WireReason::Aborted | WireReason::NotFinished => FinishReason::Abort,
    }
}

/// The prompt logprobs in the core's convention (one per prompt token, the first NaN: nothing precedes it; vLLM
/// reports it as 0), or `None` if the worker sent a different count.
pub(crate) fn prompt_logprobs(info: pb::PromptInfo, prompt_len: usize) -> Option<Vec<f32>> {
    let mut logprobs = info.logprobs;
    if logprobs.len() != prompt_len {
        return None;
    }
    if let Some(first) = logprobs.first_mut() {
        *first = f32::NAN;
    }
    Some(logprobs)
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
        assert!(greedy.response.expect("response").prompt_logprobs);
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
    }
}
