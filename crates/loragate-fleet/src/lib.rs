//! The fleet: loragate's coordinator in front of N workers, each speaking the protocol its address's scheme names,
//! mixed in one fleet: vLLM's own gRPC (`grpc://`: `loragate worker`, vLLM's Rust frontend), vLLM's OpenAI HTTP
//! server (`vllm+http://`) or SGLang's HTTP server (`sglang+http://`), unchanged, so per-adapter pause and versioned
//! swaps work in front of the engines people already run.
//!
//! [`FleetEngine`] implements the core's [`Engine`](loragate_core::Engine), so the gate, the adapter actors, abort
//! hand-back, provenance and the retry client work over the fleet exactly as over the in-process engine:
//!
//! - **one trait per worker**: a `WorkerClient` per protocol (`worker/`) behind one trait; membership, staging and
//!   the sequences use nothing else.
//! - **generate**: each sequence runs as one streamed request on a READY worker holding the request's pinned adapter
//!   version, the one with the fewest sequences in flight; token-id prompts, every sampling field mapped, the real
//!   budget always sent, token ids and logprobs asked for; tokens are stamped with the pinned version.
//! - **abort**: a cancelled request's sequences are aborted by a call where the protocol has one (gRPC `Abort`,
//!   vLLM's `/inference/v1/abort_requests`, SGLang's `/abort_request`; batched per worker), acknowledged by their
//!   abort finish within a bound; else (vLLM's `/v1/completions`) by closing the stream. Every token received is
//!   kept.
//! - **a worker failing** mid-stream ends its sequences at once with `Abort` and every token received.
//! - **versions**: version V of adapter NAME is loaded on the workers as `NAME@V` ([`versioned_name`]), from the
//!   path as the workers see it. A load stages it on every READY worker in parallel and installs it only if all
//!   succeeded, else rolls back with a per-worker report. A replaced version is unloaded from every worker as soon as
//!   no running request is pinned to it.
//! - **membership**: JOINING (catching up with the fleet's adapter set), READY, UNHEALTHY, DRAINING; health checks
//!   with back-off and probation after repeated failures; canonical addresses (one process is one worker, whatever
//!   its spelling); an epoch that grows on every change; the core's [`loragate_core::FleetControl`] (the `Fleet`
//!   gRPC service) and [`loragate_core::MetricsSource`] (per-worker metrics).
//!
//! ```no_run
//! # async fn run(model: loragate_core::ModelInfo) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use loragate_fleet::{FleetConfig, FleetEngine, WorkerAddress};
//!
//! let workers = vec![WorkerAddress::parse("grpc://127.0.0.1:9001")?, WorkerAddress::parse("vllm+http://127.0.0.1:8000")?];
//! let fleet = Arc::new(FleetEngine::start(model, workers, FleetConfig::default()).await?);
//! fleet.wait_ready().await?;
//! let coordinator = loragate_core::Coordinator::start(fleet.clone(), Default::default()).await?;
//! # let _ = coordinator;
//! # Ok(())
//! # }
//! ```
//!
//! See `docs/fleet.md` for the architecture, the failure semantics and what each backend needs and cannot do.

mod address;
mod control;
mod delivery;
mod engine;
mod error;
mod generate;
mod link;
mod membership;
mod metrics;
mod staging;
mod versions;
mod worker;

pub use address::{Protocol, WorkerAddress, versioned_name};
pub use engine::{DEFAULT_FIRST_BYTE_TIMEOUT, DEFAULT_INTER_CHUNK_TIMEOUT, FleetConfig, FleetEngine};
pub use error::FleetError;
pub use metrics::FleetMetrics;
