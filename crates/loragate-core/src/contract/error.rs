//! The core's one error enum and its one classification. Each error says its [`ErrorClass`] here, in one place;
//! each transport maps a class to its code in one small table (gRPC status, HTTP status).

use std::fmt;
use std::time::Duration;

use super::action::Action;
use super::backend_error::{EngineError, StateError};
use super::ids::{AdapterKey, AdapterName, AdapterVersion};
use super::limit::Limit;

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
    /// `sampling_params.min_p`.
    MinP,
    /// `sampling_params.repetition_penalty`.
    RepetitionPenalty,
    /// `sampling_params.presence_penalty`.
    PresencePenalty,
    /// `sampling_params.frequency_penalty`.
    FrequencyPenalty,
    /// `sampling_params.min_tokens`.
    MinTokens,
    /// The number of alternatives per generated token (not on the gRPC API; HTTP's `logprobs`/`top_logprobs`).
    TopLogprobs,
    /// The number of alternatives per prompt token (not on the gRPC API; HTTP's `prompt_logprobs`).
    PromptTopLogprobs,
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
    /// `kv_policy` of a keep-mode pause.
    KvPolicy,
    /// `min_lora_version` of a sampling request.
    MinLoraVersion,
    /// `sha256` of pushed adapter weights.
    Sha256,
    /// `adapter_config_json` of a pushed adapter.
    AdapterConfig,
    /// `total_bytes` of a pushed adapter.
    TotalBytes,
    /// The bytes of a pushed adapter's `adapter_model.safetensors` (gRPC `chunk`s, the HTTP part of that name).
    Weights,
    /// `max_staleness` of a staleness bound.
    MaxStaleness,
    /// `batch_size` of a staleness bound.
    BatchSize,
    /// `cache_salt`: the namespace of the request's cached prefixes.
    CacheSalt,
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
            Self::MinP => "sampling_params.min_p",
            Self::RepetitionPenalty => "sampling_params.repetition_penalty",
            Self::PresencePenalty => "sampling_params.presence_penalty",
            Self::FrequencyPenalty => "sampling_params.frequency_penalty",
            Self::MinTokens => "sampling_params.min_tokens",
            Self::TopLogprobs => "top_logprobs",
            Self::PromptTopLogprobs => "prompt_top_logprobs",
            Self::NumSamples => "num_samples",
            Self::TimeoutS => "timeout_s",
            Self::Path => "path",
            Self::Mode => "mode",
            Self::Owner => "owner",
            Self::LeaseS => "lease_s",
            Self::PauseId => "pause_id",
            Self::KvPolicy => "kv_policy",
            Self::MinLoraVersion => "min_lora_version",
            Self::Sha256 => "sha256",
            Self::AdapterConfig => "adapter_config_json",
            Self::TotalBytes => "total_bytes",
            Self::Weights => "adapter_model.safetensors",
            Self::MaxStaleness => "max_staleness",
            Self::BatchSize => "batch_size",
            Self::CacheSalt => "cache_salt",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.grpc_path())
    }
}

/// What kind of failure an error is: the one classification of the core's errors. Every front maps a class to its
/// transport's code in one small table, so the same error answers the same way on every front.
///
/// Not `#[non_exhaustive]`: the fronts' tables match it without a wildcard, so a new class does not compile until
/// every transport says its code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The request itself is wrong (a field, or files the caller named); retrying it unchanged cannot succeed.
    Invalid,
    /// What the request names does not exist (an adapter, a worker).
    NotFound,
    /// The server cannot do it now (a gate held too long, an actor restarting, shutting down, a store or engine
    /// out of reach); retrying later may succeed.
    Unavailable,
    /// The operation's own deadline passed before it could finish (a wait-mode pause's drain).
    Timeout,
    /// Another operation ended this one (a kept request ended by an abort-mode pause).
    Conflict,
    /// What the request would create exists already (a worker of that address).
    AlreadyExists,
    /// A resource limit is reached: refused at once, nothing kept; retrying later may succeed.
    Overloaded,
    /// No key was presented, or an unknown one.
    Unauthenticated,
    /// The caller's key does not allow this.
    Forbidden,
    /// Well-formed, but it does not fit the server (adapter files that do not fit the base model, a fleet call to
    /// a server with no fleet); retrying cannot help.
    Precondition,
    /// The adapter exists but cannot serve until an operator acts: the weights recorded for it could not be loaded.
    NotServing,
    /// What the request names existed but is gone for good (a released adapter version); retrying cannot help.
    Gone,
    /// What the request carries is over a size limit (pushed adapter weights over `--max-adapter-bytes`): refused
    /// the moment the limit is passed; the same request cannot succeed.
    TooLarge,
    /// What the request carries is not in a format the server takes (pushed weights that are not safetensors: a
    /// pickle, a zip, anything else).
    UnsupportedFormat,
    /// The server failed.
    Internal,
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
    /// A request wanted a newer version of its adapter (`min_lora_version`, or a pin `NAME@V`) than the adapter
    /// reached within the time the request could be held at its gate.
    #[error(
        "{adapter} is at version {current}; this request wanted version {requested} and was held at its gate for \
         {held_for:?} without it arriving"
    )]
    VersionNotReached {
        /// The adapter.
        adapter: AdapterKey,
        /// Its current version.
        current: AdapterVersion,
        /// The version the request wanted (at least, or exactly).
        requested: AdapterVersion,
        /// How long the request was held.
        held_for: Duration,
    },
    /// A request pinned a version (`NAME@V`) that this server no longer holds: it was replaced and released
    /// (`--retain-versions` says how many are kept).
    #[error("{adapter}@{requested} was released; the versions of {adapter} served now are {}", versions(.retained))]
    VersionRetired {
        /// The adapter.
        adapter: AdapterName,
        /// The version the request pinned.
        requested: AdapterVersion,
        /// The versions still served, oldest first.
        retained: Vec<AdapterVersion>,
    },
    /// A request was held at its adapter's staleness bound (see `SetLoraStaleness`) for longer than its deadline
    /// allowed: the trainer did not publish a new version in time.
    #[error(
        "{adapter}'s staleness bound admits {capacity} sequences until its next version, all of them started; this \
         request was held for {held_for:?} without a new version arriving"
    )]
    StalenessHoldExpired {
        /// The adapter.
        adapter: AdapterKey,
        /// How many sequences the bound admits at the adapter's current version.
        capacity: u64,
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
    /// A request a keep-mode pause held was waiting to continue when an abort-mode pause came: it ends `abort`
    /// with the tokens it has (only its driver sees this error; the caller gets the abort).
    #[error("{0} was paused in abort mode while this request was kept; it ends aborted")]
    AbortedWhileKept(AdapterKey),
    /// The adapter's actor did not answer (it is restarting or the coordinator is stopping); retrying may succeed.
    #[error("{0} is not answering right now (its actor is restarting or the server is stopping)")]
    AdapterUnavailable(AdapterKey),
    /// The coordinator is shutting down and admits nothing new.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// A resource limit is reached: the request was refused at once, nothing of it was kept; retrying later may
    /// succeed.
    #[error("{adapter} cannot take this request now: {} ({cap} {}) is reached; retry later", .limit.flag(), .limit.counts())]
    Overloaded {
        /// The limit that is reached.
        limit: Limit,
        /// Its value.
        cap: u32,
        /// The adapter (or base model) the request was for.
        adapter: AdapterKey,
    },
    /// A load under a new name while `--max-loras` adapters are loaded or loading: refused at once; unloading one
    /// frees a place.
    #[error("--max-loras {max_loras} adapters are loaded or loading; unload one before loading another name")]
    TooManyAdapters {
        /// The cap.
        max_loras: usize,
    },
    /// Authentication is on and the caller presented no key, or an unknown one (the reason never contains the
    /// key).
    #[error("unauthenticated: {0} (send `Authorization: Bearer <key>`)")]
    Unauthenticated(&'static str),
    /// The caller's key does not allow this.
    #[error("{}", permission_denied(*.action, .adapter.as_ref()))]
    PermissionDenied {
        /// What the caller wanted to do.
        action: Action,
        /// The adapter it wanted to do it on, if the request named one.
        adapter: Option<AdapterKey>,
    },
    /// The caller's key may not load adapters from this path: a tenant key loads only from its own directories under
    /// the adapter root. Said the same whether or not the path exists.
    #[error(
        "{field}: {requested:?} is outside the directories this key may load adapters from ({allowed}, under the adapter root)"
    )]
    PathNotPermitted {
        /// The path field of the request.
        field: Field,
        /// The path as requested.
        requested: String,
        /// The directories the key may load from (its own grant).
        allowed: String,
    },
    /// The engine refused or failed the operation.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The adapter is recorded (listed, pausable) but has no weights: the ones recorded for it could not be loaded
    /// when the server started (`reason` names the path, the version and why). A load gives it weights again; an
    /// unload removes it.
    #[error("{adapter} has no weights: {reason}; load it again or unload it")]
    WeightsMissing {
        /// The adapter.
        adapter: AdapterKey,
        /// Why (the recorded path and version, and the engine's error).
        reason: String,
    },
    /// Pushed adapter weights are larger than `--max-adapter-bytes`: refused as soon as that was known (declared,
    /// read from the safetensors header, or received), before the rest was read; nothing was kept.
    #[error("adapter_model.safetensors: {size} bytes are over the limit of {limit} bytes (--max-adapter-bytes)")]
    AdapterTooLarge {
        /// The size declared, announced by the header, or received so far.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Pushed adapter weights are not a safetensors file (`reason` says what they look like instead); nothing was
    /// kept.
    #[error("adapter_model.safetensors: {0}; only safetensors files are accepted")]
    UnsupportedFormat(String),
    /// The state store could not record a change. A pause is withdrawn and a load issued no version; a resume, an
    /// unload or an installed load took effect here but may be undone by a restart (see `docs/state.md`).
    #[error("{0}")]
    State(#[from] StateError),
}

impl CoreError {
    /// An [`CoreError::InvalidArgument`] for `field`.
    pub fn invalid(field: Field, reason: impl Into<String>) -> Self {
        Self::InvalidArgument { field, reason: reason.into() }
    }

    /// What kind of failure this is: the one place a core error is classified. A failed swap is classified as its
    /// load's failure.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::InvalidArgument { .. } => ErrorClass::Invalid,
            Self::UnknownAdapter(_) => ErrorClass::NotFound,
            Self::GateHoldExpired { .. }
            | Self::VersionNotReached { .. }
            | Self::StalenessHoldExpired { .. }
            | Self::AdapterUnavailable(_)
            | Self::ShuttingDown => ErrorClass::Unavailable,
            Self::VersionRetired { .. } => ErrorClass::Gone,
            Self::DrainTimedOut { .. } => ErrorClass::Timeout,
            Self::SwapFailed { source, .. } => source.class(),
            Self::AbortedWhileKept(_) => ErrorClass::Conflict,
            Self::Overloaded { .. } | Self::TooManyAdapters { .. } => ErrorClass::Overloaded,
            Self::Unauthenticated(_) => ErrorClass::Unauthenticated,
            Self::PermissionDenied { .. } | Self::PathNotPermitted { .. } => ErrorClass::Forbidden,
            Self::Engine(engine) => engine.class(),
            Self::WeightsMissing { .. } => ErrorClass::NotServing,
            Self::AdapterTooLarge { .. } => ErrorClass::TooLarge,
            Self::UnsupportedFormat(_) => ErrorClass::UnsupportedFormat,
            Self::State(state) => state.class(),
        }
    }

    /// A stable, low-cardinality label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidArgument { .. } => "invalid_argument",
            Self::UnknownAdapter(_) => "unknown_adapter",
            Self::GateHoldExpired { .. } => "gate_hold_expired",
            Self::VersionNotReached { .. } => "version_not_reached",
            Self::VersionRetired { .. } => "version_retired",
            Self::StalenessHoldExpired { .. } => "staleness_hold_expired",
            Self::DrainTimedOut { .. } => "drain_timed_out",
            Self::SwapFailed { source, .. } => source.kind(),
            Self::AbortedWhileKept(_) => "aborted_while_kept",
            Self::AdapterUnavailable(_) => "adapter_unavailable",
            Self::ShuttingDown => "shutting_down",
            Self::Overloaded { .. } => "overloaded",
            Self::TooManyAdapters { .. } => "too_many_adapters",
            Self::Unauthenticated(_) => "unauthenticated",
            Self::PermissionDenied { .. } => "permission_denied",
            Self::PathNotPermitted { .. } => "path_not_permitted",
            Self::Engine(engine) => engine.kind(),
            Self::WeightsMissing { .. } => "weights_missing",
            Self::AdapterTooLarge { .. } => "adapter_too_large",
            Self::UnsupportedFormat(_) => "unsupported_format",
            Self::State(_) => "state_store",
        }
    }
}

fn versions(retained: &[AdapterVersion]) -> String {
    let listed: Vec<String> = retained.iter().map(ToString::to_string).collect();
    if listed.is_empty() { "none".to_owned() } else { listed.join(", ") }
}

fn permission_denied(action: Action, adapter: Option<&AdapterKey>) -> String {
    match adapter {
        Some(adapter) => format!("permission denied: this key may not {action} on {adapter}"),
        None => format!("permission denied: this key may not {action}"),
    }
}
