//! The core's one error enum. Fronts map it to transport codes in exactly one place each (gRPC status, HTTP status).

use std::fmt;
use std::time::Duration;

use crate::engine::EngineError;
use crate::ids::{AdapterKey, AdapterName, AdapterVersion};

/// A request field that failed validation. Its [`Display`](fmt::Display) is the field's path in the gRPC contract
/// (`sampling_params.max_tokens`); fronts with other wire names (OpenAI's `max_tokens`, `prompt`) rename it where
/// they map errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// `request_id`.
    RequestId,
    /// `lora_name`.
    LoraName,
    /// `prompt_token_ids`.
    PromptTokenIds,
    /// `sampling_params.max_tokens`.
    MaxTokens,
    /// `sampling_params.temperature`.
    Temperature,
    /// `sampling_params.top_p`.
    TopP,
    /// `sampling_params.top_k`.
    TopK,
    /// `sampling_params.stop_token_ids`.
    StopTokenIds,
    /// `num_samples`.
    NumSamples,
    /// `timeout_s`.
    TimeoutS,
    /// `path` of an adapter to load.
    Path,
    /// `mode` of a pause.
    Mode,
    /// `owner` of a pause.
    Owner,
    /// `lease_s` of a pause.
    LeaseS,
    /// `pause_id` of a resume.
    PauseId,
}

impl Field {
    /// The field's path in the gRPC contract.
    pub fn grpc_path(self) -> &'static str {
        match self {
            Self::RequestId => "request_id",
            Self::LoraName => "lora_name",
            Self::PromptTokenIds => "prompt_token_ids",
            Self::MaxTokens => "sampling_params.max_tokens",
            Self::Temperature => "sampling_params.temperature",
            Self::TopP => "sampling_params.top_p",
            Self::TopK => "sampling_params.top_k",
            Self::StopTokenIds => "sampling_params.stop_token_ids",
            Self::NumSamples => "num_samples",
            Self::TimeoutS => "timeout_s",
            Self::Path => "path",
            Self::Mode => "mode",
            Self::Owner => "owner",
            Self::LeaseS => "lease_s",
            Self::PauseId => "pause_id",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.grpc_path())
    }
}

/// Everything that can go wrong in the coordinator, per request. None of these stops the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    /// A request field is invalid; `reason` says why in words a caller can act on.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The offending field.
        field: Field,
        /// What is wrong with it.
        reason: String,
    },
    /// No adapter of that name is loaded (or it was unloaded while the request waited).
    #[error("{0} is not loaded")]
    UnknownAdapter(AdapterKey),
    /// A sampling request was held at a paused adapter's gate for longer than its deadline allowed.
    #[error("{adapter} stayed paused for the {held_for:?} this request could be held at its gate")]
    GateHoldExpired {
        /// The paused adapter.
        adapter: AdapterKey,
        /// How long the request was held.
        held_for: Duration,
    },
    /// A pause in wait mode closed the gate, but requests were still running when the caller's deadline (or the
    /// server's longest drain) came; the pause was withdrawn, so nothing stays paused because of the failed call.
    #[error(
        "{adapter} still had {still_running} request(s) running after {waited:?}; the wait-mode pause was withdrawn"
    )]
    DrainTimedOut {
        /// The adapter being drained.
        adapter: AdapterKey,
        /// Requests still running at the deadline.
        still_running: usize,
        /// How long the pause waited.
        waited: Duration,
    },
    /// The load of a swap failed: the adapter still serves its previous version, it was reopened (unless another
    /// pause holds it) and the requests the swap kept continue on the previous weights.
    #[error("swapping {adapter} failed, it keeps serving {serving} and its kept requests continue on it: {source}")]
    SwapFailed {
        /// The adapter.
        adapter: AdapterName,
        /// The version it keeps serving.
        serving: AdapterVersion,
        /// Why the load failed.
        #[source]
        source: Box<CoreError>,
    },
    /// The adapter's actor did not answer (it is restarting or the coordinator is stopping); retrying may succeed.
    #[error("{0} is not answering right now (its actor is restarting or the server is stopping)")]
    AdapterUnavailable(AdapterKey),
    /// The coordinator is shutting down and admits nothing new.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The engine refused or failed the operation.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl CoreError {
    /// An [`CoreError::InvalidArgument`] for `field`.
    pub fn invalid(field: Field, reason: impl Into<String>) -> Self {
        Self::InvalidArgument { field, reason: reason.into() }
    }

    /// A stable, low-cardinality label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidArgument { .. } => "invalid_argument",
            Self::UnknownAdapter(_) => "unknown_adapter",
            Self::GateHoldExpired { .. } => "gate_hold_expired",
            Self::DrainTimedOut { .. } => "drain_timed_out",
            Self::SwapFailed { source, .. } => source.kind(),
            Self::AdapterUnavailable(_) => "adapter_unavailable",
            Self::ShuttingDown => "shutting_down",
            Self::Engine(engine) => engine.kind(),
        }
    }
}
