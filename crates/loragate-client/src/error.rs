//! The client's one error enum.

use loragate_proto::v1::SampleResponse;

/// Why a sample (or a swap) did not finish.
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
}
