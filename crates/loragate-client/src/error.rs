//! The client's one error enum.

use loragate_proto::v1::SampleResponse;

/// Why a sample, a swap or another control call did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server could not be reached at all.
    #[error("connecting to the loragate server: {0}")]
    Connect(#[from] tonic::transport::Error),
    /// The server refused the request for a reason retrying cannot fix (invalid argument, unknown adapter, …).
    #[error("the server refused the request: {0}")]
    Rejected(tonic::Status),
    /// The overall deadline passed. `partial` holds everything accumulated so far (finished and partial sequences,
    /// the latter with `FINISH_REASON_ABORT`).
    #[error("the sample's deadline passed before it finished ({} sequences, partial output kept)", partial.sequences.len())]
    DeadlineExceeded {
        /// What was produced before the deadline.
        partial: Box<SampleResponse>,
    },
    /// Too many attempts in a row were aborted without producing a token.
    #[error("{attempts} attempts in a row were aborted without producing a token")]
    NoProgress {
        /// The attempts counted.
        attempts: u32,
        /// What was produced before giving up.
        partial: Box<SampleResponse>,
    },
    /// The server answered something the contract does not allow (never papered over: logprobs are not invented).
    #[error("the server broke the contract: {0}")]
    Protocol(String),
    /// An argument was refused before anything was sent (a malformed endpoint or key, tensors that do not match
    /// their shape, …).
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The argument, as the caller named it (`endpoint`, `tensors["lora_A"]`, …).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A local file could not be read (an adapter directory to push).
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl ClientError {
    /// An [`ClientError::InvalidArgument`] naming `field`.
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument { field: field.into(), reason: reason.into() }
    }
}
