//! The worker's one error enum, and the one place it becomes a gRPC status (vLLM's codes for the same cases).

use loragate_core::{CoreError, EngineError, Field};
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
    #[error("LoRA adapter `{0}` is not loaded")]
    LoraNotLoaded(String),
    /// `LoadLora` under a name that is loaded (vLLM never reloads a name in place over gRPC).
    #[error("LoRA adapter `{0}` is already loaded")]
    LoraAlreadyLoaded(String),
    /// A request with this `request_id` is running (ids must be unique to be abortable).
    #[error("request_id: `{0}` is already running")]
    RequestIdInUse(String),
    /// This worker loads no adapters by path (it has no adapter root).
    #[error("this worker loads no adapters (start it with --adapter-root DIR)")]
    LoraDisabled,
    /// An RPC or mode this worker does not implement (weight transfer, sleep, KV events, `PAUSE_MODE_KEEP`).
    #[error("{0} is not implemented by loragate worker")]
    Unimplemented(&'static str),
    /// The engine refused or failed the operation.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The worker is stopping (its state actor is gone).
    #[error("the worker is shutting down")]
    ShuttingDown,
}

impl WorkerError {
    /// An [`WorkerError::InvalidArgument`] for `field`.
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument { field, reason: reason.into() }
    }

    /// The core's validation error in this protocol's terms: the field is renamed to its path in vLLM's proto.
    pub(crate) fn from_core(err: CoreError) -> Self {
        match err {
            CoreError::InvalidArgument { field, reason } => Self::invalid(vllm_field(field), reason),
            CoreError::UnknownAdapter(key) => Self::LoraNotLoaded(key.as_wire_str().to_owned()),
            CoreError::Engine(engine) => Self::Engine(engine),
            CoreError::ShuttingDown => Self::ShuttingDown,
            other => Self::Engine(EngineError::Internal(other.to_string())),
        }
    }
}

/// A core request field's path in vLLM's `GenerateRequest`.
fn vllm_field(field: Field) -> &'static str {
    match field {
        Field::RequestId => "request_id",
        Field::LoraName => "lora_name",
        Field::PromptTokenIds => "prompt.token_ids",
        Field::MaxTokens => "stopping.max_new_tokens",
        Field::Temperature => "temperature",
        Field::TopP => "sampling.top_p",
        Field::TopK => "sampling.top_k",
        Field::StopTokenIds => "stopping.stop_token_ids",
        Field::NumSamples => "sampling.num_sequences",
        Field::Path => "source_path",
        _ => "request",
    }
}

impl From<WorkerError> for Status {
    fn from(err: WorkerError) -> Self {
        let message = err.to_string();
        match &err {
            WorkerError::InvalidArgument { .. } => Status::invalid_argument(message),
            WorkerError::ModelNotFound(_) | WorkerError::LoraNotLoaded(_) => Status::not_found(message),
            WorkerError::LoraAlreadyLoaded(_) | WorkerError::RequestIdInUse(_) => Status::already_exists(message),
            WorkerError::LoraDisabled => Status::failed_precondition(message),
            WorkerError::Unimplemented(_) => Status::unimplemented(message),
            WorkerError::ShuttingDown => Status::unavailable(message),
            WorkerError::Engine(engine) => match engine {
                EngineError::AdapterFiles(_) => Status::invalid_argument(message),
                EngineError::AdapterIncompatible(_) => Status::failed_precondition(message),
                EngineError::AdapterNotLoaded(_) => Status::not_found(message),
                EngineError::Stopped => Status::unavailable(message),
                _ => Status::internal(message),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use loragate_core::{AdapterKey, AdapterName};
    use tonic::Code;

    use super::*;

    #[test]
    fn each_error_gets_vllms_code_and_names_its_subject() {
        let cases = [
            (
                WorkerError::from_core(CoreError::invalid(Field::MaxTokens, "too many")),
                Code::InvalidArgument,
                "stopping.max_new_tokens",
            ),
            (WorkerError::ModelNotFound("gpt".into()), Code::NotFound, "gpt"),
            (WorkerError::LoraNotLoaded("meow@2".into()), Code::NotFound, "meow@2"),
            (WorkerError::LoraAlreadyLoaded("meow@1".into()), Code::AlreadyExists, "meow@1"),
            (WorkerError::RequestIdInUse("r1".into()), Code::AlreadyExists, "r1"),
            (WorkerError::LoraDisabled, Code::FailedPrecondition, "--adapter-root"),
            (WorkerError::Unimplemented("Sleep"), Code::Unimplemented, "Sleep"),
            (
                EngineError::AdapterFiles("no adapter_config.json".into()).into(),
                Code::InvalidArgument,
                "adapter_config",
            ),
            (EngineError::AdapterIncompatible("q_proj".into()).into(), Code::FailedPrecondition, "q_proj"),
            (
                WorkerError::from_core(CoreError::UnknownAdapter(AdapterKey::Lora(
                    AdapterName::parse("woof").expect("name"),
                ))),
                Code::NotFound,
                "woof",
            ),
        ];
        for (err, code, mentions) in cases {
            let status = Status::from(err);
            assert_eq!(status.code(), code, "{}", status.message());
            assert!(status.message().contains(mentions), "{:?} should mention {mentions}", status.message());
        }
    }
}
