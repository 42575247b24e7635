//! The fleet's one error enum. The `Fleet` service sees it as the core's [`FleetControlError`] (mapped to gRPC in
//! the gRPC front); the engine paths speak the core's [`loragate_core::EngineError`]. No message carries a
//! credential: addresses are quoted canonical, or without their user-info when malformed.

use loragate_core::FleetControlError;

use crate::address::WorkerAddress;

/// What a fleet operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// A worker address is malformed.
    #[error("address: {address:?} {reason}")]
    InvalidAddress {
        /// The address as given, without user-info, query or fragment.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No worker has that address.
    #[error("no worker {0} in the fleet")]
    UnknownWorker(String),
    /// The worker is in the fleet already, maybe under another spelling or name of the same socket address.
    #[error("worker {address} is already in the fleet{}", if address == as_ { String::new() } else { format!(" as {as_}") })]
    WorkerExists {
        /// The address given.
        address: WorkerAddress,
        /// The address it is in the fleet as.
        as_: WorkerAddress,
    },
    /// The fleet holds as many workers as it may.
    #[error("the fleet already has {max} workers, its limit (--max-workers)")]
    TooManyWorkers {
        /// The limit.
        max: usize,
    },
    /// The membership actor could not start.
    #[error("starting the fleet's membership: {0}")]
    Spawn(#[from] ractor::SpawnErr),
    /// No worker became ready in time (every one is unreachable, unhealthy or unable to catch up).
    #[error("no worker became ready: {0}")]
    NoReadyWorker(String),
    /// The fleet has stopped.
    #[error("the fleet has stopped")]
    Stopped,
}

impl From<FleetError> for FleetControlError {
    fn from(err: FleetError) -> Self {
        match err {
            FleetError::InvalidAddress { .. } => Self::InvalidArgument {
                field: "address",
                reason: err.to_string().trim_start_matches("address: ").to_owned(),
            },
            FleetError::UnknownWorker(address) => Self::UnknownWorker(address),
            FleetError::WorkerExists { .. } => Self::WorkerExists(err.to_string()),
            FleetError::TooManyWorkers { max } => Self::TooManyWorkers { max },
            other => Self::Unavailable(other.to_string()),
        }
    }
}
