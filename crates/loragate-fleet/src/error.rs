//! The fleet's one error enum. The `Fleet` service sees it as [`FleetControlError`] (mapped to gRPC in the gRPC
//! front); the engine paths speak the core's [`loragate_core::EngineError`].

use loragate_grpc::FleetControlError;

use crate::address::WorkerAddress;

/// What a fleet operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// A worker address is malformed.
    #[error("address: {address:?} {reason}")]
    InvalidAddress {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No worker has that address.
    #[error("no worker {0} in the fleet")]
    UnknownWorker(String),
    /// A worker with that address is in the fleet.
    #[error("worker {0} is already in the fleet")]
    WorkerExists(WorkerAddress),
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
            FleetError::WorkerExists(address) => Self::WorkerExists(address.to_string()),
            other => Self::Unavailable(other.to_string()),
        }
    }
}
