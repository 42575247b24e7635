//! The one place core errors become gRPC statuses: the code is the error's class's
//! ([`loragate_net::status::grpc_code`], the table every front shares), the message the error's own (it names the
//! field, the adapter or the worker).

use loragate_core::{CoreError, FleetControlError};
use loragate_net::status::grpc_code;
use tonic::Status;

/// Maps a core error to the gRPC status the contract names for it. Messages name the field or the adapter; a failed
/// swap answers as its load failed (bad files stay INVALID_ARGUMENT), with the swap's message.
pub fn status_from_core(err: CoreError) -> Status {
    Status::new(grpc_code(err.class()), err.to_string())
}

/// Maps a fleet membership error to its gRPC status. Messages name the field or the worker.
pub fn status_from_fleet(err: FleetControlError) -> Status {
    Status::new(grpc_code(err.class()), err.to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use loragate_core::{Action, AdapterKey, AdapterName, AdapterVersion, EngineError, Field, Limit, StateError};
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
            (
                CoreError::DrainTimedOut { adapter: meow.clone(), still_running: 2, waited: Duration::from_secs(5) },
                Code::DeadlineExceeded,
                "withdrawn",
            ),
            (CoreError::AbortedWhileKept(meow.clone()), Code::Aborted, "meow"),
            (CoreError::AdapterUnavailable(meow.clone()), Code::Unavailable, "meow"),
            (EngineError::Stopped.into(), Code::Unavailable, "stopped"),
            (EngineError::NonFiniteOutput("at step 3".into()).into(), Code::Internal, "non-finite"),
            (EngineError::AdapterNotLoaded(AdapterName::parse("meow").expect("name")).into(), Code::NotFound, "meow"),
            (
                CoreError::SwapFailed {
                    adapter: AdapterName::parse("meow").expect("name"),
                    serving: AdapterVersion(3),
                    source: Box::new(EngineError::AdapterFiles("no adapter_config.json".into()).into()),
                },
                Code::InvalidArgument,
                "keeps serving",
            ),
        ];
        for (err, code, mentions) in cases {
            let described = err.to_string();
            let status = status_from_core(err);
            assert_eq!(status.code(), code, "{described}");
            assert!(status.message().contains(mentions), "{:?} should mention {mentions}", status.message());
        }
    }

    /// Both services (`Sampler`, through its submission gate too, and `LoraControl`) answer core errors with
    /// [`status_from_core`]: every core error gets its class's code, as on every other front.
    #[test]
    fn every_core_error_answers_its_classs_code() {
        for err in loragate_core::testing::every_core_error() {
            let (class, described) = (err.class(), err.to_string());
            let status = status_from_core(err);
            assert_eq!(status.code(), grpc_code(class), "{described}");
            assert_eq!(status.message(), described);
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

    #[test]
    fn every_fleet_error_answers_its_classs_code() {
        for err in loragate_core::testing::every_fleet_error() {
            let class = err.class();
            assert_eq!(status_from_fleet(err).code(), grpc_code(class));
        }
    }
}
