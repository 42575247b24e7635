//! The failures of the layers below the coordinator: the engine's and the state store's errors, which reach callers
//! inside [`CoreError`](super::CoreError).

use super::error::ErrorClass;
use super::ids::AdapterName;

/// What an engine can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The adapter's files are missing, unreadable or malformed.
    #[error("bad adapter files: {0}")]
    AdapterFiles(String),
    /// The adapter's files are well-formed but do not fit the base model (unknown target modules, wrong shapes).
    #[error("adapter does not fit the base model: {0}")]
    AdapterIncompatible(String),
    /// The engine holds no weights of that name (it was unloaded meanwhile).
    #[error("adapter '{0}' is not loaded in the engine")]
    AdapterNotLoaded(AdapterName),
    /// The engine has stopped and serves nothing more.
    #[error("the engine has stopped")]
    Stopped,
    /// The engine cannot serve this now but may later (a remote engine with no healthy worker for the request);
    /// the reason says what is missing.
    #[error("the engine is unavailable: {0}")]
    Unavailable(String),
    /// A sequence's logits became NaN or infinite (an adapter's values overflowed the model's arithmetic): the
    /// sequence was stopped rather than sampled from garbage. Other sequences are unaffected.
    #[error("the model's output became non-finite (NaN or infinite logits) {0}; nothing was sampled from it")]
    NonFiniteOutput(String),
    /// The request can never run on this engine, even alone (its sequence would need more of the KV cache than the
    /// engine has); the reason names the limit.
    #[error("the request is too large for the engine: {0}")]
    TooLarge(String),
    /// Anything else (a model computation failed).
    #[error("engine failure: {0}")]
    Internal(String),
}

impl EngineError {
    /// What kind of failure this is (see [`CoreError::class`](crate::CoreError::class)).
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::AdapterFiles(_) | Self::TooLarge(_) => ErrorClass::Invalid,
            Self::AdapterIncompatible(_) => ErrorClass::Precondition,
            Self::AdapterNotLoaded(_) => ErrorClass::NotFound,
            Self::Stopped | Self::Unavailable(_) => ErrorClass::Unavailable,
            Self::NonFiniteOutput(_) | Self::Internal(_) => ErrorClass::Internal,
        }
    }

    /// A stable, low-cardinality label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::AdapterFiles(_) => "adapter_files",
            Self::AdapterIncompatible(_) => "adapter_incompatible",
            Self::AdapterNotLoaded(_) => "adapter_not_loaded",
            Self::Stopped => "engine_stopped",
            Self::Unavailable(_) => "engine_unavailable",
            Self::NonFiniteOutput(_) => "non_finite_output",
            Self::TooLarge(_) => "request_too_large",
            Self::Internal(_) => "engine_internal",
        }
    }
}

/// What a store can fail with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The store could not read or write its records (an I/O error, a damaged file).
    #[error("the state store failed: {0}")]
    Failed(String),
    /// The store is not reachable now (stopped, or, for a shared backend, its servers are unreachable); retrying
    /// later may succeed.
    #[error("the state store is unavailable: {0}")]
    Unavailable(String),
}

impl StateError {
    /// What kind of failure this is (see [`CoreError::class`](crate::CoreError::class)).
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Failed(_) => ErrorClass::Internal,
            Self::Unavailable(_) => ErrorClass::Unavailable,
        }
    }
}
