//! Every failure of the clients becomes an exception of `loragate.errors` here, and only here: the gRPC status code
//! by its name (`.code`, `"INVALID_ARGUMENT"`), the server's or the client's message naming the field (`.message`),
//! and for a sample that could not finish what it produced (`.partial`). The class follows the code, so callers can
//! catch a family (`InvalidArgumentError` is also a `ValueError`, `DeadlineExceededError` a `TimeoutError`, …) or
//! every failure (`LoragateError`).

use loragate_client::ClientError;
use loragate_proto::v1::SampleResponse;
use pyo3::prelude::*;

use crate::results::SampleResult;
use crate::words::code_name;

/// What a failure is in Python's terms.
#[derive(Debug, PartialEq)]
struct Described {
    /// The exception class in `loragate.errors`.
    class: &'static str,
    /// The gRPC status code's name.
    code: &'static str,
    message: String,
    /// What a sample produced before it failed.
    partial: Option<SampleResponse>,
}

/// The exception `error` raises.
pub(crate) fn to_py_err(py: Python<'_>, error: ClientError) -> PyErr {
    let described = describe(error);
    instantiate(py, described).unwrap_or_else(|failure| failure)
}

fn instantiate(py: Python<'_>, described: Described) -> PyResult<PyErr> {
    let class = py.import("loragate.errors")?.getattr(described.class)?;
    let partial = described.partial.map(|partial| SampleResult::from_response(partial, false));
    let exception = class.call1((described.code, described.message, partial))?;
    Ok(PyErr::from_value(exception))
}

fn describe(error: ClientError) -> Described {
    let plain =
        |code: &'static str, message: String| Described { class: class_for(code), code, message, partial: None };
    match error {
        ClientError::Rejected(status) => plain(code_name(status.code()), status.message().to_owned()),
        ClientError::Connect(err) => plain("UNAVAILABLE", with_sources(&err)),
        ClientError::DeadlineExceeded { partial } => Described {
            class: "DeadlineExceededError",
            code: "DEADLINE_EXCEEDED",
            message: format!(
                "the sample's deadline (timeout_s) passed before it finished; `partial` holds the {} sequences produced so far",
                partial.sequences.len()
            ),
            partial: Some(*partial),
        },
        ClientError::NoProgress { attempts, partial } => Described {
            class: "NoProgressError",
            code: "ABORTED",
            message: format!(
                "{attempts} attempts in a row were aborted without producing a token; `partial` holds what was produced"
            ),
            partial: Some(*partial),
        },
        ClientError::Protocol(message) => plain("INTERNAL", format!("the server broke the contract: {message}")),
        ClientError::InvalidArgument { field, reason } => plain("INVALID_ARGUMENT", format!("{field}: {reason}")),
        ClientError::Io { path, source } => {
            plain("INVALID_ARGUMENT", format!("path: cannot read {}: {source}", path.display()))
        }
        other => plain("UNKNOWN", other.to_string()),
    }
}

/// The class of `loragate.errors` for a code.
fn class_for(code: &str) -> &'static str {
    match code {
        "INVALID_ARGUMENT" | "OUT_OF_RANGE" => "InvalidArgumentError",
        "NOT_FOUND" => "NotFoundError",
        "UNAUTHENTICATED" | "PERMISSION_DENIED" => "AuthError",
        "UNAVAILABLE" => "UnavailableError",
        "DEADLINE_EXCEEDED" => "DeadlineExceededError",
        "RESOURCE_EXHAUSTED" => "ResourceExhaustedError",
        "FAILED_PRECONDITION" => "FailedPreconditionError",
        "UNIMPLEMENTED" => "UnimplementedError",
        _ => "LoragateError",
    }
}

/// An error's message followed by its causes' (a transport error's own message says little).
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use loragate_proto::v1::{FinishReason, SampledSequence};
    use tonic::Status;

    use super::*;

    #[test]
    fn a_refusal_keeps_the_servers_code_and_message_naming_the_field() {
        let described = describe(ClientError::Rejected(Status::invalid_argument("sampling_params.max_tokens: 0")));
        assert_eq!(described.class, "InvalidArgumentError");
        assert_eq!(described.code, "INVALID_ARGUMENT");
        assert_eq!(described.message, "sampling_params.max_tokens: 0");
        for (status, class) in [
            (Status::not_found("adapter `x`"), "NotFoundError"),
            (Status::unauthenticated("no key"), "AuthError"),
            (Status::permission_denied("not yours"), "AuthError"),
            (Status::unavailable("version_not_reached"), "UnavailableError"),
            (Status::resource_exhausted("--max-held"), "ResourceExhaustedError"),
            (Status::failed_precondition("version_retired"), "FailedPreconditionError"),
            (Status::unimplemented("PushLoraAdapter"), "UnimplementedError"),
            (Status::internal("boom"), "LoragateError"),
        ] {
            assert_eq!(describe(ClientError::Rejected(status.clone())).class, class, "{status:?}");
        }
    }

    #[test]
    fn an_unfinished_sample_carries_what_it_produced() {
        let partial = SampleResponse {
            request_id: "r".into(),
            sequences: vec![SampledSequence {
                token_ids: vec![1, 2],
                logprobs: vec![-0.5, -0.25],
                finish_reason: FinishReason::Abort.into(),
                segments: vec![],
            }],
            prompt_logprobs: vec![],
        };
        let described = describe(ClientError::DeadlineExceeded { partial: Box::new(partial.clone()) });
        assert_eq!((described.class, described.code), ("DeadlineExceededError", "DEADLINE_EXCEEDED"));
        assert_eq!(described.partial, Some(partial.clone()));
        let described = describe(ClientError::NoProgress { attempts: 8, partial: Box::new(partial.clone()) });
        assert_eq!((described.class, described.code), ("NoProgressError", "ABORTED"));
        assert!(described.message.contains('8'), "{}", described.message);
        assert_eq!(described.partial, Some(partial));
    }

    #[test]
    fn local_refusals_name_the_argument() {
        let described =
            describe(ClientError::InvalidArgument { field: "tensors[\"w\"]".into(), reason: "3 bytes".into() });
        assert_eq!((described.class, described.code), ("InvalidArgumentError", "INVALID_ARGUMENT"));
        assert_eq!(described.message, "tensors[\"w\"]: 3 bytes");
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let described = describe(ClientError::Io { path: "/x/adapter_config.json".into(), source: io });
        assert!(described.message.starts_with("path: cannot read /x/adapter_config.json"), "{}", described.message);
    }
}
