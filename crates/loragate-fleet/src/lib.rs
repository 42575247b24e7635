//! The fleet: loragate's coordinator in front of N workers that speak vLLM's own gRPC protocol (`loragate worker`,
//! or vLLM's Rust frontend), unchanged, so per-adapter pause and versioned swaps work for a vLLM fleet.
//!
//! [`FleetEngine`] implements the core's [`Engine`](loragate_core::Engine), so the gate, the adapter actors, abort
//! hand-back, provenance and the retry client work over the fleet exactly as over the in-process engine:
//!
//! - **generate**: each sequence runs as one `GenerateStream` on a READY worker holding the request's pinned adapter
//!   version, the one with the fewest sequences in flight; token-id prompts, every sampling field mapped, the
//!   protocol's traps handled (the real budget is always sent, token ids and logprobs are asked for); tokens are
//!   stamped with the pinned version.
//! - **abort**: a cancelled request sends `Control.Abort` (batched per worker); the `ABORTED` finish acknowledges
//!   it; without one within a bound the stream is dropped and what was received is handed back.
//! - **a worker failing** mid-stream ends its sequences at once with `Abort` and every token received.
//! - **versions**: version V of adapter NAME is loaded on the workers as `NAME@V` ([`versioned_name`]). A load stages
//!   it on every READY worker in parallel and installs it only if all succeeded, else rolls back with a per-worker
//!   report. A replaced version is unloaded from every worker as soon as no running request is pinned to it.
//! - **membership**: JOINING (catching up with the fleet's adapter set), READY, UNHEALTHY, DRAINING; health checks
//!   via `grpc.health.v1`; an epoch that grows on every change; the `Fleet` gRPC service
//!   ([`loragate_grpc::FleetControl`]) and per-worker metrics ([`loragate_http::MetricsSource`]).
//!
//! ```no_run
//! # async fn run(model: loragate_core::ModelInfo) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use loragate_fleet::{FleetConfig, FleetEngine, WorkerAddress};
//!
//! let workers = vec![WorkerAddress::parse("http://127.0.0.1:9001")?, WorkerAddress::parse("http://127.0.0.1:9002")?];
//! let fleet = Arc::new(FleetEngine::start(model, workers, FleetConfig::default()).await?);
//! fleet.wait_ready().await?;
//! let coordinator = loragate_core::Coordinator::start(fleet.clone(), Default::default()).await?;
//! # let _ = coordinator;
//! # Ok(())
//! # }
//! ```
//!
//! See `docs/fleet.md` for the architecture, the failure semantics and fronting real vLLM.

mod address;
mod control;
mod engine;
mod error;
mod generate;
mod link;
mod membership;
mod metrics;
mod staging;
mod versions;

pub use address::{WorkerAddress, versioned_name};
pub use engine::{FleetConfig, FleetEngine};
pub use error::FleetError;
pub use loragate_grpc::WorkerState;
pub use metrics::FleetMetrics;
