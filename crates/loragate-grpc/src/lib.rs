//! The loragate gRPC front: the `loragate.v1` services of the contract over a [`loragate_core::Coordinator`].
//!
//! Data flow: a call arrives → the [`SubmissionGateLayer`] (on the `Sampler` service only) holds it while its
//! adapter is paused → [`SamplerService`] validates it into a core request and samples through the coordinator →
//! tokens stream back with their adapter versions. [`LoraControlService`] routes control calls to the adapter's
//! actor. Every core error becomes a gRPC status in one place, [`status_from_core`]. `Fleet` ([`FleetService`]) drives a fleet of
//! workers through the core's [`loragate_core::FleetControl`] trait, which the fleet crate implements; a server
//! without a fleet answers its calls `FAILED_PRECONDITION`.
//!
//! ```no_run
//! # async fn run(coordinator: loragate_core::Coordinator) -> Result<(), Box<dyn std::error::Error>> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:50051").await?;
//! loragate_grpc::serve_grpc(listener, coordinator, std::future::pending(), std::future::pending()).await?;
//! # Ok(())
//! # }
//! ```

mod auth;
mod control_service;
mod convert;
mod fleet_service;
mod grpc_timeout;
mod sampler_service;
mod server;
mod status;
mod submission_gate;

pub use auth::{AuthFuture, AuthLayer, Authenticated};
pub use control_service::LoraControlService;
pub use fleet_service::FleetService;
pub use sampler_service::{SampleChunks, SamplerService};
pub use server::{GrpcServeError, serve_grpc, serve_grpc_with};
pub use status::{status_from_core, status_from_fleet};
pub use submission_gate::{SubmissionGate, SubmissionGateLayer};
