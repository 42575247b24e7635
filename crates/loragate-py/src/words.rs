//! The words of the Python API (`"keep"`, `"recompute"`, `"stop"`, `"INVALID_ARGUMENT"`) and the wire's enums they
//! stand for.

use loragate_client::ClientError;
use loragate_proto::v1::{FinishReason, KvPolicy, PauseMode};
use tonic::Code;

/// `mode=`: `"abort"`, `"wait"` or `"keep"`.
pub(crate) fn pause_mode(mode: &str) -> Result<PauseMode, ClientError> {
    match mode {
        "abort" => Ok(PauseMode::Abort),
        "wait" => Ok(PauseMode::Wait),
        "keep" => Ok(PauseMode::Keep),
        other => Err(ClientError::InvalidArgument {
            field: "mode".into(),
            reason: format!("{other:?} is not \"abort\", \"wait\" or \"keep\""),
        }),
    }
}

/// `kv=`: `"recompute"` or `"reuse"`.
pub(crate) fn kv_policy(kv: &str) -> Result<KvPolicy, ClientError> {
    match kv {
        "recompute" => Ok(KvPolicy::Recompute),
        "reuse" => Ok(KvPolicy::Reuse),
        other => Err(ClientError::InvalidArgument {
            field: "kv".into(),
            reason: format!("{other:?} is not \"recompute\" or \"reuse\""),
        }),
    }
}

/// A pause mode as the Python API writes it.
pub(crate) fn pause_mode_name(mode: PauseMode) -> &'static str {
    match mode {
        PauseMode::Unspecified => "unspecified",
        PauseMode::Abort => "abort",
        PauseMode::Wait => "wait",
        PauseMode::Keep => "keep",
    }
}

/// A KV policy as the Python API writes it (unspecified is recompute, as on the wire).
pub(crate) fn kv_policy_name(kv: KvPolicy) -> &'static str {
    match kv {
        KvPolicy::Unspecified | KvPolicy::Recompute => "recompute",
        KvPolicy::Reuse => "reuse",
    }
}

/// A finish reason as the Python API writes it (vLLM's and OpenAI's words).
pub(crate) fn finish_reason_name(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Unspecified => "unspecified",
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
    }
}

/// A gRPC status code by its name in the gRPC specification (`INVALID_ARGUMENT`).
pub(crate) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_kv_policies_round_trip_and_others_are_refused_naming_the_argument() {
        for mode in ["abort", "wait", "keep"] {
            assert_eq!(pause_mode_name(pause_mode(mode).expect("a mode")), mode);
        }
        for kv in ["recompute", "reuse"] {
            assert_eq!(kv_policy_name(kv_policy(kv).expect("a policy")), kv);
        }
        assert!(matches!(pause_mode("Keep"), Err(ClientError::InvalidArgument { field, .. }) if field == "mode"));
        assert!(matches!(kv_policy(""), Err(ClientError::InvalidArgument { field, .. }) if field == "kv"));
    }

    #[test]
    fn codes_are_named_as_grpc_names_them() {
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(code_name(Code::Unauthenticated), "UNAUTHENTICATED");
        assert_eq!(code_name(Code::from_i32(14)), "UNAVAILABLE");
    }
}
