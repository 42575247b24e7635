//! What the calls answer, as frozen Python objects with the wire's field names (lists are copied out on access).

use loragate_proto::v1 as pb;
use pyo3::prelude::*;

use crate::words::{finish_reason_name, kv_policy_name, pause_mode_name};

/// Which adapter version produced the tokens `start..end` of a sequence.
#[pyclass(frozen, get_all, eq, module = "loragate")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    /// The adapter version (0 for the base model).
    lora_version: u64,
    /// First token index of the run.
    start: u32,
    /// One past the last token index of the run.
    end: u32,
    /// The oldest version whose keys and values the run attended to (differs only under `kv="reuse"`).
    kv_version: u64,
}

#[pymethods]
impl Segment {
    fn __repr__(&self) -> String {
        format!(
            "Segment(lora_version={}, start={}, end={}, kv_version={})",
            self.lora_version, self.start, self.end, self.kv_version
        )
    }
}

/// One finished sequence: its tokens, their logprobs, why it ended and which versions produced it.
#[pyclass(frozen, get_all, eq, module = "loragate")]
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sequence {
    /// The generated tokens (the prompt is not repeated).
    token_ids: Vec<u32>,
    /// One logprob per token, of the sampled token.
    logprobs: Vec<f32>,
    /// `"stop"`, `"length"`, or `"abort"` in a failed sample's `partial`.
    finish_reason: &'static str,
    /// Half-open runs of tokens with the version that produced them, covering every token.
    segments: Vec<Segment>,
}

#[pymethods]
impl Sequence {
    fn __repr__(&self) -> String {
        format!(
            "Sequence(token_ids=<{} tokens>, finish_reason={:?}, segments={:?})",
            self.token_ids.len(),
            self.finish_reason,
            self.segments.iter().map(|s| (s.lora_version, s.start, s.end)).collect::<Vec<_>>()
        )
    }

    fn __len__(&self) -> usize {
        self.token_ids.len()
    }
}

/// The answer of `sample`: `num_samples` finished sequences.
#[pyclass(frozen, get_all, module = "loragate")]
#[derive(Clone, Debug)]
pub(crate) struct SampleResult {
    /// The request's id (the caller's, or the one the server made).
    request_id: String,
    /// The sequences, in order.
    sequences: Vec<Sequence>,
    /// With `include_prompt_logprobs=True`: one per prompt token, the first NaN. `None` otherwise.
    prompt_logprobs: Option<Vec<f32>>,
}

impl SampleResult {
    /// The result of a response; `prompt_logprobs` only when they were asked for.
    pub(crate) fn from_response(response: pb::SampleResponse, with_prompt_logprobs: bool) -> Self {
        let sequences = response
            .sequences
            .into_iter()
            .map(|sequence| Sequence {
                finish_reason: finish_reason_name(sequence.finish_reason()),
                token_ids: sequence.token_ids,
                logprobs: sequence.logprobs,
                segments: sequence
                    .segments
                    .into_iter()
                    .map(|segment| Segment {
                        lora_version: segment.lora_version,
                        start: segment.start,
                        end: segment.end,
                        kv_version: segment.kv_version,
                    })
                    .collect(),
            })
            .collect();
        Self {
            request_id: response.request_id,
            sequences,
            prompt_logprobs: with_prompt_logprobs.then_some(response.prompt_logprobs),
        }
    }
}

#[pymethods]
impl SampleResult {
    fn __repr__(&self) -> String {
        format!("SampleResult(request_id={:?}, sequences={})", self.request_id, self.sequences.len())
    }
}

/// What a swap or a push did.
#[pyclass(frozen, get_all, module = "loragate")]
#[derive(Clone, Debug)]
pub(crate) struct SwapResult {
    /// The adapter's version after it.
    version: u64,
    /// Hex SHA-256 of the new version's `adapter_model.safetensors` (empty where the server cannot read the files).
    sha256: String,
    /// Requests its pause handed back aborted (`mode="abort"`).
    aborted_count: u32,
    /// Requests its pause kept; they continue on the new weights.
    kept_count: u32,
    /// The KV policy applied to the kept requests: `"recompute"` or `"reuse"`.
    kv: &'static str,
}

impl From<pb::SwapLoraAdapterResponse> for SwapResult {
    fn from(answer: pb::SwapLoraAdapterResponse) -> Self {
        Self {
            kv: kv_policy_name(answer.kv_policy()),
            version: answer.version,
            sha256: answer.sha256,
            aborted_count: answer.aborted_count,
            kept_count: answer.kept_count,
        }
    }
}

impl From<pb::PushLoraAdapterResponse> for SwapResult {
    fn from(answer: pb::PushLoraAdapterResponse) -> Self {
        Self {
            kv: kv_policy_name(answer.kv_policy()),
            version: answer.version,
            sha256: answer.sha256,
            aborted_count: answer.aborted_count,
            kept_count: answer.kept_count,
        }
    }
}

#[pymethods]
impl SwapResult {
    fn __repr__(&self) -> String {
        format!(
            "SwapResult(version={}, sha256={:?}, aborted_count={}, kept_count={}, kv={:?})",
            self.version, self.sha256, self.aborted_count, self.kept_count, self.kv
        )
    }
}

/// What a pause did.
#[pyclass(frozen, get_all, module = "loragate")]
#[derive(Clone, Debug)]
pub(crate) struct PauseResult {
    /// The pause now holding the adapter (pass it to `resume` to release just this one).
    pause_id: String,
    /// Requests aborted and handed back.
    aborted_count: u32,
    /// Their ids.
    aborted_request_ids: Vec<String>,
    /// Requests stopped and kept (`mode="keep"`).
    kept_count: u32,
    /// The KV policy applied: `"recompute"` or `"reuse"`.
    kv: &'static str,
    /// Requests cancelled but not handed back within the server's acknowledgement timeout.
    unacknowledged_request_ids: Vec<String>,
}

impl From<pb::AbortLoraRequestsResponse> for PauseResult {
    fn from(answer: pb::AbortLoraRequestsResponse) -> Self {
        Self {
            kv: kv_policy_name(answer.kv_policy()),
            pause_id: answer.pause_id,
            aborted_count: answer.aborted_count,
            aborted_request_ids: answer.aborted_request_ids,
            kept_count: answer.kept_count,
            unacknowledged_request_ids: answer.unacknowledged_request_ids,
        }
    }
}

#[pymethods]
impl PauseResult {
    fn __repr__(&self) -> String {
        format!(
            "PauseResult(pause_id={:?}, aborted_count={}, kept_count={}, kv={:?})",
            self.pause_id, self.aborted_count, self.kept_count, self.kv
        )
    }
}

/// What a resume did.
#[pyclass(frozen, get_all, module = "loragate")]
#[derive(Clone, Debug)]
pub(crate) struct ResumeResult {
    /// Whether the adapter was paused before.
    was_paused: bool,
    /// Whether another pause still holds it closed.
    still_paused: bool,
}

impl From<pb::ResumeLoraRequestsResponse> for ResumeResult {
    fn from(answer: pb::ResumeLoraRequestsResponse) -> Self {
        Self { was_paused: answer.was_paused, still_paused: answer.still_paused }
    }
}

#[pymethods]
impl ResumeResult {
    fn __repr__(&self) -> String {
        format!("ResumeResult(was_paused={}, still_paused={})", py_bool(self.was_paused), py_bool(self.still_paused))
    }
}

/// An adapter's staleness bound and where it stands.
#[pyclass(frozen, get_all, eq, module = "loragate")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Staleness {
    /// How many versions older than the newest a consumed sample may be.
    max_staleness: u32,
    /// Sequences the trainer consumes per version.
    batch_size: u32,
    /// Sequences admitted since the policy was set.
    started: u64,
    /// How many may have started by now.
    capacity: u64,
    /// Sampling requests held because the capacity is reached.
    held: u32,
}

impl From<pb::LoraStaleness> for Staleness {
    fn from(staleness: pb::LoraStaleness) -> Self {
        Self {
            max_staleness: staleness.max_staleness,
            batch_size: staleness.batch_size,
            started: staleness.started,
            capacity: staleness.capacity,
            held: staleness.held,
        }
    }
}

#[pymethods]
impl Staleness {
    fn __repr__(&self) -> String {
        format!(
            "Staleness(max_staleness={}, batch_size={}, started={}, capacity={}, held={})",
            self.max_staleness, self.batch_size, self.started, self.capacity, self.held
        )
    }
}

/// One live pause of an adapter.
#[pyclass(frozen, get_all, module = "loragate")]
#[derive(Clone, Debug)]
pub(crate) struct AdapterPause {
    /// Its id.
    pause_id: String,
    /// Who holds it.
    owner: String,
    /// `"abort"`, `"wait"` or `"keep"`.
    mode: &'static str,
    /// Seconds left on its lease; 0 without one.
    lease_left_s: f64,
}

/// One retained version of an adapter.
#[pyclass(frozen, get_all, module = "loragate")]
#[derive(Clone, Debug)]
pub(crate) struct AdapterVersion {
    /// The version.
    version: u64,
    /// Hex SHA-256 of its safetensors (empty where unknown).
    sha256: String,
    /// Size of its safetensors in bytes (0 where unknown).
    bytes: u64,
    /// The directory it was loaded from, or `"push"`.
    source: String,
}

/// One adapter in `list_adapters`.
#[pyclass(frozen, get_all, module = "loragate")]
#[derive(Clone, Debug)]
pub(crate) struct AdapterStatus {
    /// Its name.
    lora_name: String,
    /// Its current version.
    version: u64,
    /// Whether its gate is closed.
    paused: bool,
    /// Admitted requests, queued or running.
    in_flight: u32,
    /// Sampling requests held at the gate.
    held: u32,
    /// `wait_unpaused` callers.
    waiting: u32,
    /// Requests a keep-mode pause holds.
    kept: u32,
    /// The live pauses, by owner.
    pauses: Vec<AdapterPause>,
    /// Why it cannot serve (empty when it serves).
    weights_error: String,
    /// Hex SHA-256 of the current version's safetensors (empty where unknown).
    sha256: String,
    /// Its staleness bound, if one is set.
    staleness: Option<Staleness>,
    /// The versions kept loaded, oldest first.
    versions: Vec<AdapterVersion>,
}

impl From<pb::LoraAdapterStatus> for AdapterStatus {
    fn from(status: pb::LoraAdapterStatus) -> Self {
        Self {
            pauses: status
                .pauses
                .iter()
                .map(|pause| AdapterPause {
                    pause_id: pause.pause_id.clone(),
                    owner: pause.owner.clone(),
                    mode: pause_mode_name(pause.mode()),
                    lease_left_s: pause.lease_left_s,
                })
                .collect(),
            versions: status
                .versions
                .into_iter()
                .map(|version| AdapterVersion {
                    version: version.version,
                    sha256: version.sha256,
                    bytes: version.bytes,
                    source: version.source,
                })
                .collect(),
            staleness: status.staleness.map(Staleness::from),
            lora_name: status.lora_name,
            version: status.version,
            paused: status.paused,
            in_flight: status.in_flight,
            held: status.held,
            waiting: status.waiting,
            kept: status.kept,
            weights_error: status.weights_error,
            sha256: status.sha256,
        }
    }
}

#[pymethods]
impl AdapterStatus {
    fn __repr__(&self) -> String {
        format!(
            "AdapterStatus(lora_name={:?}, version={}, paused={}, in_flight={}, held={})",
            self.lora_name,
            self.version,
            py_bool(self.paused),
            self.in_flight,
            self.held
        )
    }
}

fn py_bool(value: bool) -> &'static str {
    if value { "True" } else { "False" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_keeps_every_token_logprob_and_segment_and_names_the_finish_reason() {
        let response = pb::SampleResponse {
            request_id: "r-1".into(),
            sequences: vec![pb::SampledSequence {
                token_ids: vec![1, 2, 3],
                logprobs: vec![-0.1, -0.2, -0.3],
                finish_reason: pb::FinishReason::Length.into(),
                segments: vec![
                    pb::VersionSegment { lora_version: 1, start: 0, end: 2, kv_version: 1 },
                    pb::VersionSegment { lora_version: 2, start: 2, end: 3, kv_version: 1 },
                ],
            }],
            prompt_logprobs: vec![f32::NAN, -1.0],
        };
        let result = SampleResult::from_response(response.clone(), true);
        let sequence = &result.sequences[0];
        assert_eq!(sequence.token_ids, vec![1, 2, 3]);
        assert_eq!(sequence.logprobs, vec![-0.1, -0.2, -0.3]);
        assert_eq!(sequence.finish_reason, "length");
        assert_eq!(sequence.segments[1], Segment { lora_version: 2, start: 2, end: 3, kv_version: 1 });
        assert_eq!(result.prompt_logprobs.as_ref().map(Vec::len), Some(2));
        assert_eq!(SampleResult::from_response(response, false).prompt_logprobs, None, "only when asked for");
    }
}
