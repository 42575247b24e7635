//! The worker's one error enum, and the one place it becomes a gRPC status (vLLM's codes for the same cases; the
//! core's errors get their class's code from the table every front shares, [`loragate_net::status::grpc_code`]).

use loragate_core::{CoreError, Field};
use loragate_net::status::grpc_code;
use tonic::Status;

/// Everything a worker request can fail with. None of these stops the worker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A request field is invalid or asks for something this worker does not do; `field` is its path in vLLM's
    /// proto (`stopping.max_new_tokens`).
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// `model` names no model this worker serves.
    #[error("model `{0}` not found")]
    ModelNotFound(String),
    /// `lora_name` names no loaded adapter.
    #[error("lora_name: LoRA adapter `{0}` is not loaded")]
    LoraNotLoaded(String),
    /// `LoadLora` under a name that is loaded or loading (vLLM never reloads a name in place over gRPC).
    #[error("lora_name: LoRA adapter `{0}` is already loaded")]
    LoraAlreadyLoaded(String),
    /// `LoadLora` while `--max-loras` adapters are loaded or loading.
    #[error("lora_name: {max_loras} LoRA adapters are loaded (--max-loras); unload one first")]
    TooManyLoras {
        /// The cap.
        max_loras: usize,
    },
    /// This worker loads no adapters by path (it has no adapter root).
    #[error("this worker loads no adapters (start it with --adapter-root DIR)")]
    LoraDisabled,
    /// `Shutdown` on a worker started without `--enable-shutdown-rpc`.
    #[error("Shutdown is disabled on this worker (start it with --enable-shutdown-rpc to allow it)")]
    ShutdownDisabled,
    /// An RPC this worker does not implement (weight transfer, sleep, KV events).
    #[error("{0} is not implemented by loragate worker")]
    Unimplemented(&'static str),
    /// The coordinator refused or failed the request (limits, gate deadlines, keys, the engine, shutting down).
    #[error(transparent)]
    Core(CoreError),
}

impl WorkerError {
    /// An [`WorkerError::InvalidArgument`] for `field`.
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument { field, reason: reason.into() }
    }

    /// The core's error in this protocol's terms: a field is renamed to its path in vLLM's proto, an unknown adapter
    /// is vLLM's unknown `lora_name`.
    pub(crate) fn from_core(err: CoreError) -> Self {
        match err {
            CoreError::InvalidArgument { field, reason } => Self::invalid(vllm_field(field), reason),
            CoreError::UnknownAdapter(key) => Self::LoraNotLoaded(key.as_wire_str().to_owned()),
            other => Self::Core(other),
        }
    }
}

impl From<CoreError> for WorkerError {
    fn from(err: CoreError) -> Self {
        Self::from_core(err)
    }
}

/// A core request field's path in vLLM's `GenerateRequest` (or `vllm.Control` request).
fn vllm_field(field: Field) -> &'static str {
    match field {
        Field::RequestId => "request_id",
        Field::LoraName => "lora_name",
        Field::PromptTokenIds => "prompt.token_ids",
        Field::MaxTokens => "stopping.max_new_tokens",
        Field::Temperature => "temperature",
        Field::TopP => "sampling.top_p",
        Field::TopK => "sampling.top_k",
        Field::MinP => "sampling.min_p",
        Field::RepetitionPenalty => "decoding.repetition_penalty",
        Field::PresencePenalty => "decoding.presence_penalty",
        Field::FrequencyPenalty => "decoding.frequency_penalty",
        Field::MinTokens => "stopping.min_new_tokens",
        Field::TopLogprobs => "response.output_candidates.top_n",
        Field::PromptTopLogprobs => "response.prompt_candidates.top_n",
        Field::StopTokenIds => "stopping.stop_token_ids",
        Field::NumSamples => "sampling.num_sequences",
        Field::Path => "source_path",
        // Fields vLLM's requests do not have (pause owners, leases): the core's own name.
        other => other.grpc_path(),
    }
}

impl From<WorkerError> for Status {
    fn from(err: WorkerError) -> Self {
        let message = err.to_string();
        match err {
            WorkerError::InvalidArgument { .. } => Status::invalid_argument(message),
            WorkerError::ModelNotFound(_) | WorkerError::LoraNotLoaded(_) => Status::not_found(message),
            WorkerError::LoraAlreadyLoaded(_) => Status::already_exists(message),
            WorkerError::TooManyLoras { .. } => Status::resource_exhausted(message),
            WorkerError::LoraDisabled | WorkerError::ShutdownDisabled => Status::failed_precondition(message),
            WorkerError::Unimplemented(_) => Status::unimplemented(message),
            // The table every front shares, as `loragate serve`'s gRPC front answers it.
            WorkerError::Core(core) => Status::new(grpc_code(core.class()), message),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use loragate_core::{Action, AdapterKey, AdapterName, EngineError, Limit};
    use tonic::Code;

    use super::*;

    #[test]
    fn each_error_gets_vllms_code_and_names_its_subject() {
        let woof = AdapterKey::Lora(AdapterName::parse("woof").expect("name"));
        let cases = [
            (CoreError::invalid(Field::MaxTokens, "too many").into(), Code::InvalidArgument, "stopping.max_new_tokens"),
            (WorkerError::ModelNotFound("gpt".into()), Code::NotFound, "gpt"),
            (WorkerError::LoraNotLoaded("meow@2".into()), Code::NotFound, "meow@2"),
            (WorkerError::LoraAlreadyLoaded("meow@1".into()), Code::AlreadyExists, "meow@1"),
            (WorkerError::TooManyLoras { max_loras: 4 }, Code::ResourceExhausted, "--max-loras"),
            (WorkerError::LoraDisabled, Code::FailedPrecondition, "--adapter-root"),
            (WorkerError::ShutdownDisabled, Code::FailedPrecondition, "--enable-shutdown-rpc"),
            (WorkerError::Unimplemented("Sleep"), Code::Unimplemented, "Sleep"),
            (
                CoreError::Engine(EngineError::AdapterFiles("no adapter_config.json".into())).into(),
                Code::InvalidArgument,
                "adapter_config",
            ),
            (
                CoreError::Engine(EngineError::AdapterIncompatible("q_proj".into())).into(),
                Code::FailedPrecondition,
                "q_proj",
            ),
            (CoreError::UnknownAdapter(woof.clone()).into(), Code::NotFound, "woof"),
            (
                CoreError::GateHoldExpired { adapter: woof.clone(), held_for: Duration::from_secs(1) }.into(),
                Code::Unavailable,
                "woof",
            ),
            (
                CoreError::Overloaded { limit: Limit::Held, cap: 8, adapter: woof.clone() }.into(),
                Code::ResourceExhausted,
                "--max-held",
            ),
            (CoreError::Unauthenticated("no API key was presented").into(), Code::Unauthenticated, "no API key"),
            (
                CoreError::PermissionDenied { action: Action::Admin, adapter: None }.into(),
                Code::PermissionDenied,
                "administer",
            ),
            (CoreError::ShuttingDown.into(), Code::Unavailable, "shutting down"),
        ];
        for (err, code, mentions) in cases {
            let err: WorkerError = err;
            let status = Status::from(err);
            assert_eq!(status.code(), code, "{}", status.message());
            assert!(status.message().contains(mentions), "{:?} should mention {mentions}", status.message());
        }
    }

    /// Every core error, renamed into vLLM's terms or not, gets its class's code, as on every other front.
    #[test]
    fn every_core_error_answers_its_classs_code() {
        for err in loragate_core::testing::every_core_error() {
            let (class, described) = (err.class(), err.to_string());
            let status = Status::from(WorkerError::from(err));
            assert_eq!(status.code(), grpc_code(class), "{described}");
        }
    }

    #[test]
    fn every_sampling_field_is_named_as_vllms_proto_names_it() {
        let cases = [
            (Field::MinP, "sampling.min_p"),
            (Field::RepetitionPenalty, "decoding.repetition_penalty"),
            (Field::PresencePenalty, "decoding.presence_penalty"),
            (Field::FrequencyPenalty, "decoding.frequency_penalty"),
            (Field::MinTokens, "stopping.min_new_tokens"),
            (Field::TopLogprobs, "response.output_candidates.top_n"),
            (Field::PromptTopLogprobs, "response.prompt_candidates.top_n"),
        ];
        for (field, path) in cases {
            let status = Status::from(WorkerError::from_core(CoreError::invalid(field, "is out of range")));
            assert!(status.message().starts_with(&format!("{path}: ")), "{field:?}: {:?}", status.message());
        }
    }
}
