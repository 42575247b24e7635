//! Conversions between the `loragate.v1` wire messages and the core's types. Requests only become raw core
//! requests here; validation happens in the core.

use loragate_core::{
    AdapterStatus, CoreError, Field, FinishReason, KvPolicy, PauseInfo, PauseMode, RawSampleRequest, SampleEvent,
    SampleOutput, Segment, StalenessStatus, VersionInfo,
};
use loragate_proto::v1 as pb;

/// A wire sampling request as the core's raw request (not yet validated).
pub(crate) fn raw_sample_request(request: pb::SampleRequest) -> RawSampleRequest {
    let params = request.sampling_params.unwrap_or_default();
    RawSampleRequest {
        request_id: request.request_id,
        lora_name: request.lora_name,
        prompt_token_ids: request.prompt_token_ids,
        max_tokens: params.max_tokens,
        temperature: params.temperature,
        top_p: params.top_p,
        top_k: params.top_k,
        seed: params.seed,
        stop_token_ids: params.stop_token_ids,
        ignore_eos: params.ignore_eos,
        min_p: params.min_p,
        repetition_penalty: params.repetition_penalty,
        presence_penalty: params.presence_penalty,
        frequency_penalty: params.frequency_penalty,
        min_tokens: params.min_tokens,
        num_samples: request.num_samples,
        include_prompt_logprobs: request.include_prompt_logprobs,
        // This API reports no alternatives.
        top_logprobs: 0,
        prompt_top_logprobs: None,
        min_lora_version: request.min_lora_version,
        cache_salt: Some(request.cache_salt),
    }
}

fn finish_reason(reason: FinishReason) -> pb::FinishReason {
    match reason {
        FinishReason::Stop => pb::FinishReason::Stop,
        FinishReason::Length => pb::FinishReason::Length,
        FinishReason::Abort => pb::FinishReason::Abort,
    }
}

fn segments(segments: &[Segment]) -> Vec<pb::VersionSegment> {
    segments
        .iter()
        .map(|segment| pb::VersionSegment {
            lora_version: segment.version.0,
            start: segment.start,
            end: segment.end,
            kv_version: segment.kv_version.0,
        })
        .collect()
}

/// A finished request as the `Sample` response.
pub(crate) fn sample_response(output: SampleOutput) -> pb::SampleResponse {
    pb::SampleResponse {
        request_id: output.request_id.to_string(),
        sequences: output
            .sequences
            .into_iter()
            .map(|sequence| pb::SampledSequence {
                segments: segments(&sequence.segments),
                token_ids: sequence.token_ids,
                logprobs: sequence.logprobs,
                finish_reason: finish_reason(sequence.finish_reason).into(),
            })
            .collect(),
        prompt_logprobs: output.prompt_logprobs,
    }
}

/// One event of a running request as a `SampleStream` chunk (none for what this API never asks for: alternatives).
pub(crate) fn stream_chunk(request_id: &str, event: SampleEvent) -> Option<pb::SampleStreamResponse> {
    let chunk = pb::SampleStreamResponse { request_id: request_id.to_owned(), ..Default::default() };
    Some(match event {
        SampleEvent::PromptLogprobs(prompt_logprobs) => pb::SampleStreamResponse { prompt_logprobs, ..chunk },
        SampleEvent::PromptTopLogprobs(_) => return None,
        SampleEvent::Tokens { sequence, version, token_ids, logprobs, .. } => {
            pb::SampleStreamResponse { sequence_index: sequence, token_ids, logprobs, lora_version: version.0, ..chunk }
        }
        SampleEvent::Finished { sequence, reason, segments: finished } => pb::SampleStreamResponse {
            sequence_index: sequence,
            lora_version: finished.last().map_or(0, |segment| segment.version.0),
            finish_reason: finish_reason(reason).into(),
            segments: segments(&finished),
            ..chunk
        },
    })
}

/// An adapter's snapshot as listed by `ListLoraAdapters`.
pub(crate) fn adapter_status(status: AdapterStatus) -> pb::LoraAdapterStatus {
    pb::LoraAdapterStatus {
        lora_name: status.key.as_wire_str().to_owned(),
        version: status.version.0,
        paused: status.paused,
        in_flight: status.in_flight,
        held: status.held,
        waiting: status.waiting,
        kept: status.kept,
        pauses: status.pauses.into_iter().map(pause_info).collect(),
        weights_error: status.weights_error.unwrap_or_default(),
        sha256: status.versions.last().map(sha256).unwrap_or_default(),
        staleness: status.staleness.map(staleness),
        versions: status.versions.iter().map(version_info).collect(),
    }
}

/// The hex SHA-256 of a version's weights, empty where unknown.
pub(crate) fn sha256(version: &VersionInfo) -> String {
    version.sha256.map(|sha| sha.to_hex()).unwrap_or_default()
}

fn version_info(version: &VersionInfo) -> pb::LoraAdapterVersion {
    pb::LoraAdapterVersion {
        version: version.version.0,
        sha256: sha256(version),
        bytes: version.bytes.unwrap_or_default(),
        source: version.origin.to_string(),
    }
}

/// A staleness bound's state on the wire.
pub(crate) fn staleness(status: StalenessStatus) -> pb::LoraStaleness {
    pb::LoraStaleness {
        max_staleness: status.policy.max_staleness,
        batch_size: status.policy.batch_size,
        started: status.started,
        capacity: status.capacity,
        held: status.held,
    }
}

fn pause_info(pause: PauseInfo) -> pb::LoraPause {
    pb::LoraPause {
        pause_id: pause.pause_id.to_string(),
        owner: pause.owner.to_string(),
        mode: wire_pause_mode(pause.mode).into(),
        lease_left_s: pause.lease_left.map_or(0.0, |left| left.as_secs_f64()),
    }
}

fn wire_pause_mode(mode: PauseMode) -> pb::PauseMode {
    match mode {
        PauseMode::Abort => pb::PauseMode::Abort,
        PauseMode::Wait => pb::PauseMode::Wait,
        PauseMode::Keep => pb::PauseMode::Keep,
    }
}

/// A wire `mode` field: `unspecified` is the RPC's default; a value this server does not know is INVALID_ARGUMENT.
/// Parses a wire `kv_policy`: unspecified is RECOMPUTE.
pub(crate) fn kv_policy(raw: i32) -> Result<KvPolicy, CoreError> {
    match pb::KvPolicy::try_from(raw) {
        Ok(pb::KvPolicy::Unspecified | pb::KvPolicy::Recompute) => Ok(KvPolicy::Recompute),
        Ok(pb::KvPolicy::Reuse) => Ok(KvPolicy::Reuse),
        Err(_) => Err(CoreError::invalid(Field::KvPolicy, format!("{raw} is not a KvPolicy"))),
    }
}

/// The wire form of an applied KV policy.
pub(crate) fn wire_kv_policy(policy: KvPolicy) -> pb::KvPolicy {
    match policy {
        KvPolicy::Recompute => pb::KvPolicy::Recompute,
        KvPolicy::Reuse => pb::KvPolicy::Reuse,
    }
}

pub(crate) fn pause_mode(raw: i32, unspecified: PauseMode) -> Result<PauseMode, CoreError> {
    match pb::PauseMode::try_from(raw) {
        Ok(pb::PauseMode::Unspecified) => Ok(unspecified),
        Ok(pb::PauseMode::Abort) => Ok(PauseMode::Abort),
        Ok(pb::PauseMode::Wait) => Ok(PauseMode::Wait),
        Ok(pb::PauseMode::Keep) => Ok(PauseMode::Keep),
        Err(_) => Err(CoreError::invalid(Field::Mode, format!("{raw} is not a PauseMode"))),
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::{AdapterVersion, RequestId, SequenceOutput};

    use super::*;

    #[test]
    fn an_absent_sampling_params_message_means_the_defaults() {
        let raw = raw_sample_request(pb::SampleRequest { lora_name: "meow".into(), ..Default::default() });
        assert_eq!(raw.max_tokens, None);
        assert_eq!(raw.top_p, None);
        assert_eq!(raw.temperature, 0.0);
        assert_eq!(raw.lora_name, "meow");
    }

    #[test]
    fn the_extended_sampling_fields_reach_the_raw_request() {
        let params = pb::SamplingParams {
            min_p: 0.1,
            repetition_penalty: Some(1.3),
            presence_penalty: 0.4,
            frequency_penalty: -0.2,
            min_tokens: 3,
            ..Default::default()
        };
        let raw = raw_sample_request(pb::SampleRequest { sampling_params: Some(params), ..Default::default() });
        assert_eq!((raw.min_p, raw.repetition_penalty, raw.min_tokens), (0.1, Some(1.3), 3));
        assert_eq!((raw.presence_penalty, raw.frequency_penalty), (0.4, -0.2));
        let defaults = raw_sample_request(pb::SampleRequest::default());
        assert_eq!((defaults.min_p, defaults.repetition_penalty, defaults.min_tokens), (0.0, None, 0), "all off");
    }

    #[test]
    fn pause_modes_default_per_rpc_and_unknown_values_name_the_field() {
        assert_eq!(pause_mode(0, PauseMode::Abort).ok(), Some(PauseMode::Abort));
        assert_eq!(pause_mode(0, PauseMode::Keep).ok(), Some(PauseMode::Keep));
        assert_eq!(pause_mode(2, PauseMode::Keep).ok(), Some(PauseMode::Wait));
        match pause_mode(9, PauseMode::Abort) {
            Err(CoreError::InvalidArgument { field, .. }) => assert_eq!(field, Field::Mode),
            other => panic!("expected INVALID_ARGUMENT on mode, got {other:?}"),
        }
    }

    #[test]
    fn outputs_keep_tokens_reasons_and_segments() {
        let output = SampleOutput {
            request_id: RequestId::parse_or_generate("r").expect("id"),
            sequences: vec![SequenceOutput {
                token_ids: vec![1, 2, 3],
                logprobs: vec![-0.1, -0.2, -0.3],
                finish_reason: FinishReason::Abort,
                segments: vec![Segment { version: AdapterVersion(4), kv_version: AdapterVersion(4), start: 0, end: 3 }],
                top_logprobs: Vec::new(),
            }],
            prompt_logprobs: vec![f32::NAN, -1.0],
            prompt_top_logprobs: Vec::new(),
        };
        let response = sample_response(output);
        let sequence = &response.sequences[0];
        assert_eq!(response.request_id, "r");
        assert_eq!(sequence.token_ids, vec![1, 2, 3]);
        assert_eq!(sequence.finish_reason(), pb::FinishReason::Abort);
        assert_eq!(sequence.segments, vec![pb::VersionSegment { lora_version: 4, kv_version: 4, start: 0, end: 3 }]);
        assert!(response.prompt_logprobs[0].is_nan());
    }
}
