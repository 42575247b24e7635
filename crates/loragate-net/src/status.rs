//! The one table from an error's [`ErrorClass`] to each transport's code: [`http_status`] for the HTTP fronts (the
//! OpenAI, vLLM, SGLang and SkyRL endpoints, the Tinker API) and, with the `tonic` feature, [`grpc_code`] for the
//! gRPC fronts (`LoraControl`, `Sampler` and `Fleet`, and `loragate worker`'s vLLM protocol). The core classifies
//! its errors ([`loragate_core::CoreError::class`]); each front renders its own message and field names around the
//! code it finds here, so the same error answers the same way on every front.
//!
//! Both tables match every class without a wildcard: a new class does not compile until it has a code on each
//! transport.

use http::StatusCode;
use loragate_core::ErrorClass;

/// The HTTP status of an error of `class`.
pub fn http_status(class: ErrorClass) -> StatusCode {
    match class {
        ErrorClass::Invalid => StatusCode::BAD_REQUEST,
        ErrorClass::NotFound => StatusCode::NOT_FOUND,
        // The adapter is listed but has no weights until an operator loads it again: not served, for now.
        ErrorClass::Unavailable | ErrorClass::NotServing => StatusCode::SERVICE_UNAVAILABLE,
        ErrorClass::Timeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorClass::Conflict | ErrorClass::AlreadyExists => StatusCode::CONFLICT,
        ErrorClass::Overloaded => StatusCode::TOO_MANY_REQUESTS,
        ErrorClass::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorClass::Forbidden => StatusCode::FORBIDDEN,
        ErrorClass::Precondition => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorClass::Gone => StatusCode::GONE,
        ErrorClass::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorClass::UnsupportedFormat => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ErrorClass::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The gRPC status code of an error of `class`.
#[cfg(feature = "tonic")]
pub fn grpc_code(class: ErrorClass) -> tonic::Code {
    use tonic::Code;
    match class {
        ErrorClass::Invalid | ErrorClass::UnsupportedFormat => Code::InvalidArgument,
        ErrorClass::NotFound => Code::NotFound,
        ErrorClass::Unavailable => Code::Unavailable,
        ErrorClass::Timeout => Code::DeadlineExceeded,
        ErrorClass::Conflict => Code::Aborted,
        ErrorClass::AlreadyExists => Code::AlreadyExists,
        ErrorClass::Overloaded | ErrorClass::TooLarge => Code::ResourceExhausted,
        ErrorClass::Unauthenticated => Code::Unauthenticated,
        ErrorClass::Forbidden => Code::PermissionDenied,
        // Retrying cannot help: an operator must act (load the adapter again, start a fleet, fix the files).
        ErrorClass::Precondition | ErrorClass::NotServing | ErrorClass::Gone => Code::FailedPrecondition,
        ErrorClass::Internal => Code::Internal,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use loragate_core::{AdapterKey, AdapterName, CoreError, EngineError, Field};

    use super::*;

    /// The contract's error table (`contract.md`), row by row, on both transports.
    #[cfg(feature = "tonic")]
    #[test]
    fn the_contracts_error_table_holds_on_both_transports() {
        use tonic::Code;
        let meow = AdapterKey::Lora(AdapterName::parse("meow").expect("name"));
        let rows = [
            (
                CoreError::invalid(Field::MaxTokens, "must be at least 1"),
                Code::InvalidArgument,
                StatusCode::BAD_REQUEST,
            ),
            (CoreError::UnknownAdapter(meow.clone()), Code::NotFound, StatusCode::NOT_FOUND),
            (
                CoreError::GateHoldExpired { adapter: meow, held_for: Duration::from_secs(1) },
                Code::Unavailable,
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                EngineError::AdapterFiles("no adapter_config.json".into()).into(),
                Code::InvalidArgument,
                StatusCode::BAD_REQUEST,
            ),
            (
                EngineError::AdapterIncompatible("q_proj".into()).into(),
                Code::FailedPrecondition,
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
        ];
        for (error, code, status) in rows {
            assert_eq!((grpc_code(error.class()), http_status(error.class())), (code, status), "{error}");
        }
    }

    #[test]
    fn only_failures_of_the_server_are_5xx() {
        let server_side = [ErrorClass::Unavailable, ErrorClass::NotServing, ErrorClass::Timeout, ErrorClass::Internal];
        for error in loragate_core::testing::every_core_error() {
            let class = error.class();
            assert_eq!(http_status(class).is_server_error(), server_side.contains(&class), "{error}");
        }
    }
}
