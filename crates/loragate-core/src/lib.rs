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
//! # Floors
//!
//! The crate is built in floors; a module imports only from its own floor or the ones below:
//!
//! 1. [`contract`] — the shared words: ids, errors and their classification, pause words, reports, outputs.
//! 2. Requests and policy — validated sampling requests, adapter sources, the keyring, the limits, deadlines.
//! 3. The seams to the backends — the [`Engine`] and [`StateStore`] traits, the fleet's control, metrics.
//! 4. The actors — one per adapter, their manager, and the sample streams that drive requests through them.
//! 5. The [`Coordinator`], the facade every front calls.
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
//! println!("kept {} requests across the swap to {}", swap.kept, swap.installed.version);
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

// Floor 1: the shared words.
pub mod contract;

// Floor 2: requests and policy.
mod adapter_source;
pub mod adapter_store;
mod auth;
mod gate_deadline;
mod limits;
mod request_facts;
mod sampling;

// Floor 3: the seams to the backends (engine, state stores, fleet) and metrics.
mod engine;
mod finished;
mod fleet;
mod metrics;
pub mod state;
mod version_fetch;

// Floor 4: the actors.
mod adapter;
mod manager;
mod sample_stream;

// Floor 5: the facade.
mod coordinator;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use contract::{
    AbortReport, Action, AdapterKey, AdapterName, AdapterStatus, AdapterVersion, CoreError, Ending, EngineError,
    ErrorClass, Field, FinishReason, GateState, KvPolicy, Limit, MAX_ADAPTER_NAME_LEN, MAX_LEASE, MAX_OWNER_LEN,
    MAX_REQUEST_ID_LEN, MAX_STALENESS_VALUE, MAX_WAIT_TIMEOUT, ModelInfo, PauseId, PauseInfo, PauseMode, PauseOwner,
    PauseReport, PauseRequest, RequestId, ResumeReport, Retirement, SampleOutput, Segment, SegmentsBuilder,
    SequenceOutput, Sha256, ShutdownReport, StalenessPolicy, StalenessStatus, StateError, StopCause, TopLogprobs,
    VersionInfo, VersionOrigin, VersionWanted, parse_timeout_s,
};

pub use adapter_source::{AdapterRoot, AdapterSource, CONFIG_FILE, PreparedLoad, WEIGHTS_FILE};
pub use adapter_store::{AdapterLayout, AdapterStore, Collection, GrowingFile, PushHeader, check_push_name};
pub use auth::{
    AdapterPattern, Key, KeyConfigError, Keyring, MAX_KEY_LEN, PathGrant, PathPattern, Principal, Tenant, TenantKeys,
    bearer_token,
};
pub use finished::{FINISHED_REQUESTS_KEPT, FinishedRequest, FinishedSequence};
pub use gate_deadline::GateDeadline;
pub use limits::{DEFAULT_MAX_HELD, DEFAULT_MAX_IN_FLIGHT, Limits, LoadSnapshot};
pub use request_facts::{Facts, RequestFacts};
pub use sampling::{
    MAX_CACHE_SALT_BYTES, MAX_NUM_SAMPLES, MAX_STOP_TOKEN_IDS, MAX_TOP_LOGPROBS, RawSampleRequest, SampleRequest,
    SamplingParams,
};

pub use engine::{Engine, EngineEvent, EngineStream, ParkSignal, ParkedKv, ParkedKvWatch, Parking};
pub use fleet::{FleetControl, FleetControlError, FleetSnapshot, MetricsSource, WorkerSnapshot, WorkerState};
pub use metrics::{AdapterLabels, AdapterVersionLabels, CoreMetrics};
pub use state::{MemoryStore, RemoteChange, ReplicaRecord, StateStore};
pub use version_fetch::{FetchError, FileChunks, VersionFetcher};

pub use adapter::{AdapterHandle, Admission};
pub use sample_stream::{CachedPromptTokens, SampleEvent, SampleStream};

pub use coordinator::{
    AbortsRequested, Coordinator, CoordinatorConfig, PushUpload, Reconciled, RestoreReport, StartError, SwapReport,
};
