//! The one place core errors become gRPC statuses (the contract's error table).

use loragate_core::{CoreError, EngineError};
use tonic::Status;

/// Maps a core error to the gRPC status the contract names for it. Messages name the field or the adapter.
pub fn status_from_core(err: CoreError) -> Status {
    let message = err.to_string();
    let code_of = match &err {
        // A failed swap answers as its load failed (bad files stay INVALID_ARGUMENT), with the swap's message.
        CoreError::SwapFailed { source, .. } => source.as_ref(),
        other => other,
    };
    match code_of {
        CoreError::InvalidArgument { .. } => Status::invalid_argument(message),
        CoreError::UnknownAdapter(_) => Status::not_found(message),
        CoreError::GateHoldExpired { .. } | CoreError::AdapterUnavailable(_) | CoreError::ShuttingDown => {
            Status::unavailable(message)
        }
        CoreError::DrainTimedOut { .. } => Status::deadline_exceeded(message),
        CoreError::Engine(engine) => match engine {
            EngineError::AdapterFiles(_) => Status::invalid_argument(message),
            EngineError::AdapterIncompatible(_) => Status::failed_precondition(message),
            EngineError::AdapterNotLoaded(_) => Status::not_found(message),
            EngineError::Stopped => Status::unavailable(message),
            _ => Status::internal(message),
        },
        _ => Status::internal(message),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use loragate_core::{AdapterKey, AdapterName, Field};
    use tonic::Code;

    use super::*;

    #[test]
    fn each_core_error_gets_the_contracts_code_and_a_message_naming_the_subject() {
        let meow = AdapterKey::Lora(AdapterName::parse("meow").expect("name"));
        let cases = [
            (
                CoreError::invalid(Field::MaxTokens, "must be at least 1"),
                Code::InvalidArgument,
                "sampling_params.max_tokens",
            ),
            (CoreError::UnknownAdapter(meow.clone()), Code::NotFound, "meow"),
            (
                CoreError::GateHoldExpired { adapter: meow.clone(), held_for: Duration::from_secs(1) },
                Code::Unavailable,
                "meow",
            ),
            (CoreError::ShuttingDown, Code::Unavailable, "shutting down"),
            (
                EngineError::AdapterFiles("no adapter_config.json".into()).into(),
                Code::InvalidArgument,
                "adapter_config",
            ),
            (EngineError::AdapterIncompatible("q_proj shape".into()).into(), Code::FailedPrecondition, "q_proj"),
            (EngineError::Internal("boom".into()).into(), Code::Internal, "boom"),
        ];
        for (err, code, mentions) in cases {
            let described = err.to_string();
            let status = status_from_core(err);
            assert_eq!(status.code(), code, "{described}");
            assert!(status.message().contains(mentions), "{:?} should mention {mentions}", status.message());
        }
    }
}
