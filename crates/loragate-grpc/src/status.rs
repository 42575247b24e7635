//! The one place core errors become gRPC statuses (the contract's error table).

use loragate_core::{CoreError, EngineError, FleetControlError, StateError};
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
        CoreError::AbortedWhileKept(_) => Status::aborted(message),
        CoreError::Overloaded { .. } => Status::resource_exhausted(message),
        CoreError::Unauthenticated(_) => Status::unauthenticated(message),
        CoreError::PermissionDenied { .. } => Status::permission_denied(message),
        // Retrying cannot help: an operator must load the adapter again (or unload it).
        CoreError::WeightsMissing { .. } => Status::failed_precondition(message),
        CoreError::State(StateError::Unavailable(_)) => Status::unavailable(message),
        CoreError::Engine(engine) => match engine {
            EngineError::AdapterFiles(_) => Status::invalid_argument(message),
            EngineError::AdapterIncompatible(_) => Status::failed_precondition(message),
            EngineError::AdapterNotLoaded(_) => Status::not_found(message),
            EngineError::Stopped | EngineError::Unavailable(_) => Status::unavailable(message),
            EngineError::TooLarge(_) => Status::invalid_argument(message),
            _ => Status::internal(message),
        },
        _ => Status::internal(message),
    }
}

/// Maps a fleet membership error to its gRPC status. Messages name the field or the worker.
pub fn status_from_fleet(err: FleetControlError) -> Status {
    let message = err.to_string();
    match &err {
        FleetControlError::InvalidArgument { .. } => Status::invalid_argument(message),
        FleetControlError::UnknownWorker(_) => Status::not_found(message),
        FleetControlError::WorkerExists(_) => Status::already_exists(message),
        FleetControlError::TooManyWorkers { .. } => Status::resource_exhausted(message),
        FleetControlError::NoFleet => Status::failed_precondition(message),
        _ => Status::unavailable(message),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use loragate_core::{Action, AdapterKey, AdapterName, Field, Limit};
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
                CoreError::Overloaded { limit: Limit::InFlightPerAdapter, cap: 8, adapter: meow.clone() },
                Code::ResourceExhausted,
                "--max-in-flight-per-adapter",
            ),
            (CoreError::Unauthenticated("no API key was presented"), Code::Unauthenticated, "Bearer"),
            (
                CoreError::PermissionDenied { action: Action::Control, adapter: Some(meow.clone()) },
                Code::PermissionDenied,
                "meow",
            ),
            (
                EngineError::AdapterFiles("no adapter_config.json".into()).into(),
                Code::InvalidArgument,
                "adapter_config",
            ),
            (EngineError::AdapterIncompatible("q_proj shape".into()).into(), Code::FailedPrecondition, "q_proj"),
            (EngineError::Internal("boom".into()).into(), Code::Internal, "boom"),
            (EngineError::Unavailable("no READY worker holds meow@2".into()).into(), Code::Unavailable, "meow@2"),
            (
                CoreError::WeightsMissing { adapter: meow.clone(), reason: "/gone/meow is missing".into() },
                Code::FailedPrecondition,
                "/gone/meow",
            ),
            (StateError::Failed("disk full".into()).into(), Code::Internal, "disk full"),
            (StateError::Unavailable("etcd".into()).into(), Code::Unavailable, "etcd"),
        ];
        for (err, code, mentions) in cases {
            let described = err.to_string();
            let status = status_from_core(err);
            assert_eq!(status.code(), code, "{described}");
            assert!(status.message().contains(mentions), "{:?} should mention {mentions}", status.message());
        }
    }
}

#[cfg(test)]
mod fleet_tests {
    use tonic::Code;

    use super::*;

    #[test]
    fn each_fleet_error_gets_its_code_and_names_the_worker_or_field() {
        let cases = [
            (
                FleetControlError::InvalidArgument { field: "address", reason: "names no port".into() },
                Code::InvalidArgument,
                "address",
            ),
            (FleetControlError::UnknownWorker("http://w:1".into()), Code::NotFound, "http://w:1"),
            (FleetControlError::WorkerExists("http://w:2".into()), Code::AlreadyExists, "http://w:2"),
            (FleetControlError::Unavailable("stopping".into()), Code::Unavailable, "stopping"),
            (FleetControlError::TooManyWorkers { max: 256 }, Code::ResourceExhausted, "--max-workers"),
            (FleetControlError::NoFleet, Code::FailedPrecondition, "--worker"),
        ];
        for (err, code, mentions) in cases {
            let status = status_from_fleet(err);
            assert_eq!(status.code(), code);
            assert!(status.message().contains(mentions), "{:?}", status.message());
        }
    }
}
