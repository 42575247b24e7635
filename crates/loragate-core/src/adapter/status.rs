//! Snapshots of an adapter's state, as `ListLoraAdapters` reports them.

use crate::ids::{AdapterKey, AdapterVersion};

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
    /// Sampling requests held at its gate.
    pub held: u32,
    /// `WaitLoraUnpaused` callers.
    pub waiting: u32,
}
