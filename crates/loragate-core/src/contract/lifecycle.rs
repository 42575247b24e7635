//! How an adapter's gate stands and how its requests end: what observers of the gate see, and what an abort or a
//! hand-back reports for each request.

use super::ids::AdapterVersion;

/// What every observer of an adapter's gate sees. It outlives actor restarts: a restarted actor reads it back, so a
/// pause is never lost (a lost pause is a torn swap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateState {
    /// The gate is closed: nothing of this adapter is admitted.
    pub paused: bool,
    /// The adapter's current weights version.
    pub version: AdapterVersion,
    /// Set once the adapter stops serving (unloaded, or the server is shutting down); waiters give up.
    pub retired: Option<Retirement>,
    /// How many abort-mode pauses the adapter has had. A kept request waiting to continue gives up (it ends `abort`,
    /// with its tokens) when this grows: an abort-mode pause hands back every request of the adapter, kept ones too.
    pub abort_pauses: u64,
    /// Grows whenever the adapter's staleness bound may admit more than before (the policy was set, changed or
    /// cleared, or aborted sequences gave their places back; a new version is seen in `version`): requests held at the
    /// bound ask again.
    pub admission_epoch: u64,
}

/// Why an adapter stopped serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retirement {
    /// `UnloadLoraAdapter` removed it.
    Unloaded,
    /// The server is shutting down.
    ShuttingDown,
}

/// How an admitted request ended, as seen by whoever waits for it to be handed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Handed back finished (stop or length).
    Completed,
    /// Handed back with `FINISH_REASON_ABORT` and its partial output.
    Aborted,
    /// Stopped in the engine by a pause that keeps it: the core holds its tokens and continues it when the adapter
    /// reopens (its caller sees only a delay).
    Kept,
    /// Handed back as an error.
    Failed,
    /// The caller went away (or a task panicked) before anything was handed back.
    Abandoned,
}

/// Why an admitted request was cancelled: set once, by whoever cancels it first, before its token fires, so the
/// request's driver knows whether to hand an aborted sequence back or to keep and continue it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopCause {
    /// A pause in abort mode: handed back with `FINISH_REASON_ABORT` (continued by the core only for requests that
    /// asked for it).
    Paused,
    /// A pause in keep mode: kept by the core and continued when the adapter reopens.
    Kept,
    /// Aborted by request id (or all of an adapter's requests) without a pause: handed back, never continued.
    Targeted,
    /// The adapter stopped serving (unloaded, or the server is shutting down): handed back, never continued.
    Retired,
}
