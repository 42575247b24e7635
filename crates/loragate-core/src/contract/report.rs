//! What the control operations answer: an adapter's state (as `ListLoraAdapters` reports it), and what a pause, a
//! resume, an abort and a shutdown did.

use super::ids::{AdapterKey, AdapterVersion, RequestId};
use super::pause::{KvPolicy, PauseId, PauseInfo, PauseMode};
use super::staleness::StalenessStatus;
use super::version::VersionInfo;

/// One adapter's state at the moment of the snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterStatus {
    /// Which adapter.
    pub key: AdapterKey,
    /// Its current weights version.
    pub version: AdapterVersion,
    /// Whether its gate is closed.
    pub paused: bool,
    /// Admitted requests, queued or running.
    pub in_flight: u32,
    /// Of those, the ones producing tokens (the rest are queued in the engine or prefilling their prompt).
    pub running: u32,
    /// Sampling requests held at its gate.
    pub held: u32,
    /// `WaitLoraUnpaused` callers.
    pub waiting: u32,
    /// Requests stopped by a keep-mode pause, waiting in the core to continue when it reopens.
    pub kept: u32,
    /// The live pauses holding its gate, ordered by owner.
    pub pauses: Vec<PauseInfo>,
    /// Why it cannot serve, when its recorded weights could not be loaded at start (the path, the version and the
    /// engine's reason); its samples fail with [`crate::CoreError::WeightsMissing`] until a load gives it weights.
    pub weights_error: Option<String>,
    /// The servable versions, oldest first: the current one last, and the older ones kept for exact pins
    /// (`--retain-versions`). Empty for the base model.
    pub versions: Vec<VersionInfo>,
    /// Its staleness bound, if one is set.
    pub staleness: Option<StalenessStatus>,
}

/// What a pause did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PauseReport {
    /// The pause that holds the gate (the owner's existing pause if this call renewed it).
    pub pause_id: PauseId,
    /// The mode it was made in.
    pub mode: PauseMode,
    /// Requests handed back with `FINISH_REASON_ABORT` (abort mode).
    pub aborted: Vec<RequestId>,
    /// Requests stopped in the engine and kept by the core (keep mode, and abort mode for requests that asked the
    /// core to continue them).
    pub kept: Vec<RequestId>,
    /// Requests cancelled but not stopped within the acknowledgement timeout; they still end as the mode says.
    pub unacknowledged: Vec<RequestId>,
    /// The KV policy applied to the kept requests (RECOMPUTE for modes other than keep).
    pub kv_policy: KvPolicy,
}

/// What a resume did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumeReport {
    /// Whether the gate was closed before.
    pub was_paused: bool,
    /// Whether another pause still holds it closed.
    pub still_paused: bool,
}

/// What an abort did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AbortReport {
    /// Requests handed back with `FINISH_REASON_ABORT`.
    pub aborted: Vec<RequestId>,
    /// Requests stopped in the engine and kept by the core, to be continued when the adapter reopens.
    pub kept: Vec<RequestId>,
    /// Requests cancelled but not handed back within the acknowledgement timeout. They will still end as aborted.
    pub unacknowledged: Vec<RequestId>,
}

impl AbortReport {
    /// Adds `other`'s requests to this report's (the reports of several adapters, or of other replicas, as one).
    pub(crate) fn absorb(&mut self, other: AbortReport) {
        self.aborted.extend(other.aborted);
        self.kept.extend(other.kept);
        self.unacknowledged.extend(other.unacknowledged);
    }

    /// Logs the requests that were not handed back in time, once, for whichever operation cancelled them (the one
    /// place this warning is written; fronts only report the ids).
    pub(crate) fn warn_if_unacknowledged(&self, adapter: &AdapterKey, operation: &str) {
        if !self.unacknowledged.is_empty() {
            tracing::warn!(
                %adapter, operation, unacknowledged = ?self.unacknowledged,
                "requests were not handed back within the acknowledgement timeout; they will still end aborted"
            );
        }
    }
}

/// What a shutdown did to the requests it found (counts over every adapter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Sampling requests admitted (queued or running) when the shutdown began.
    pub in_flight: usize,
    /// Of those, the ones still running after the grace, handed back with `FINISH_REASON_ABORT`.
    pub aborted: usize,
    /// Requests cancelled but not handed back within the acknowledgement timeout (they still end as aborted).
    pub unacknowledged: usize,
    /// Requests held at a paused gate, waiting for an adapter to reopen or kept by a keep-mode pause when the grace
    /// ended: they fail with `UNAVAILABLE` (retry elsewhere).
    pub held: usize,
}
