//! The loragate coordinator: swap a LoRA adapter's weights while rollouts keep sampling, safely and per adapter.
//!
//! Every adapter (and the base model) is a [ractor] actor that owns
//! - a **pause gate**: closed while any pause holds it (pauses have owners, modes — abort, wait, keep — and
//!   optional leases); while it is closed nothing of that adapter is admitted; held submissions and
//!   `WaitLoraUnpaused` callers wait on a `watch` receiver outside the actor, each with its own deadline;
//! - an **in-flight registry**: every admitted request with the `CancellationToken` that aborts it, entered through
//!   an RAII [`Admission`] guard, so completion, abort, client disconnect and panic all leave the same way;
//! - the adapter's **version**, bumped by every weight load and stamped (by the engine) on every token.
//!
//! A manager actor supervises them and is the single writer of the name → [`AdapterHandle`] map that request paths
//! read. A failed actor is restarted on the same durable cell, keeping its pause and version.
//!
//! The model itself sits behind the [`Engine`] trait, defined here so that this crate and the fronts are tested
//! without candle. Requests cross into this crate only as validated types ([`SampleRequest`], [`AdapterName`]);
//! errors leave it only as [`CoreError`], which each front maps to its transport in one place.
//!
//! ```no_run
//! # async fn demo(engine: std::sync::Arc<dyn loragate_core::Engine>) -> Result<(), Box<dyn std::error::Error>> {
//! use loragate_core::{AdapterName, Coordinator, CoordinatorConfig, KvPolicy, PauseMode, RawSampleRequest};
//!
//! let coordinator = Coordinator::start(engine, CoordinatorConfig::default()).await?;
//! let meow = AdapterName::parse("meow")?;
//!
//! // A trainer's swap: pause in keep mode (running requests stop and are kept by the core), load the new weights,
//! // reopen: each kept request continues on them, and its tokens say which version produced them.
//! # let new_weights = loragate_core::AdapterSource::trusted("/adapters/meow-step-2");
//! let swap = coordinator.swap_adapter(&meow, new_weights, PauseMode::Keep, KvPolicy::Recompute, None).await?;
//! println!("kept {} requests across the swap to {}", swap.kept, swap.version);
//!
//! // The same by hand, in abort mode: aborted requests are handed back with their partial tokens.
//! let pause = coordinator.abort(&meow).await?;
//! coordinator.resume(&meow, Some(pause.pause_id)).await?;
//!
//! // A rollout's sample.
//! let raw = RawSampleRequest { lora_name: "meow".into(), prompt_token_ids: vec![72, 105], ..Default::default() };
//! let request = coordinator.parse_sample(raw)?;
//! let output = coordinator.sample(request, coordinator.gate_deadline(None)).await?.collect_output().await?;
//! # let _ = output;
//! # Ok(())
//! # }
//! ```

mod adapter;
mod adapter_source;
mod auth;
mod coordinator;
mod engine;
mod error;
mod fleet;
mod gate_deadline;
mod ids;
mod limits;
mod manager;
mod metrics;
mod output;
mod request_facts;
mod sample_stream;
mod sampling;
pub mod state;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use adapter::{
    AbortReport, AdapterHandle, AdapterStatus, Admission, Ending, GateState, KvPolicy, MAX_LEASE, MAX_OWNER_LEN,
    MAX_WAIT_TIMEOUT, PauseId, PauseInfo, PauseMode, PauseOwner, PauseReport, PauseRequest, ResumeReport, Retirement,
    StopCause, parse_timeout_s,
};
pub use adapter_source::{AdapterRoot, AdapterSource};
pub use auth::{
    Action, AdapterPattern, Key, KeyConfigError, Keyring, MAX_KEY_LEN, Principal, Tenant, TenantKeys, bearer_token,
};
pub use coordinator::{
    AbortsRequested, Coordinator, CoordinatorConfig, Reconciled, RestoreReport, StartError, SwapReport,
};
pub use engine::{
    Engine, EngineError, EngineEvent, EngineStream, ModelInfo, ParkSignal, ParkedKv, ParkedKvWatch, Parking,
};
pub use error::{CoreError, ErrorClass, Field};
pub use fleet::{FleetControl, FleetControlError, FleetSnapshot, MetricsSource, WorkerSnapshot, WorkerState};
pub use gate_deadline::GateDeadline;
pub use ids::{AdapterKey, AdapterName, AdapterVersion, MAX_ADAPTER_NAME_LEN, MAX_REQUEST_ID_LEN, RequestId};
pub use limits::{DEFAULT_MAX_HELD, DEFAULT_MAX_IN_FLIGHT, Limit, Limits, LoadSnapshot};
pub use metrics::{AdapterLabels, AdapterVersionLabels, CoreMetrics};
pub use output::{FinishReason, SampleOutput, Segment, SegmentsBuilder, SequenceOutput, TopLogprobs};
pub use request_facts::{Facts, RequestFacts};
pub use sample_stream::{SampleEvent, SampleStream};
pub use sampling::{
    MAX_NUM_SAMPLES, MAX_STOP_TOKEN_IDS, MAX_TOP_LOGPROBS, RawSampleRequest, SampleRequest, SamplingParams,
};
pub use state::{MemoryStore, RemoteChange, ReplicaRecord, StateError, StateStore};
