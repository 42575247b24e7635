//! The ground floor: the words the coordinator, its backends and its fronts share — ids, errors and their one
//! classification, what a pause is, what the control operations report, how requests end, what a sample outputs.
//!
//! Nothing here imports anything else of the core, so every other floor (and every other crate) can name these
//! words without reaching into the actors that act on them.

mod action;
mod backend_error;
mod error;
mod ids;
mod lifecycle;
mod limit;
mod model;
mod output;
mod pause;
mod report;
mod staleness;
mod version;

pub use self::action::Action;
pub use self::backend_error::{EngineError, StateError};
pub use self::error::{CoreError, ErrorClass, Field};
pub use self::ids::{AdapterKey, AdapterName, AdapterVersion, MAX_ADAPTER_NAME_LEN, MAX_REQUEST_ID_LEN, RequestId};
pub use self::lifecycle::{Ending, GateState, Retirement, StopCause};
pub use self::limit::Limit;
pub use self::model::ModelInfo;
pub use self::output::{FinishReason, SampleOutput, Segment, SegmentsBuilder, SequenceOutput, TopLogprobs};
pub use self::pause::{
    KvPolicy, MAX_LEASE, MAX_OWNER_LEN, MAX_WAIT_TIMEOUT, PauseId, PauseInfo, PauseMode, PauseOwner, PauseRequest,
    parse_timeout_s,
};
pub use self::report::{AbortReport, AdapterStatus, PauseReport, ResumeReport, ShutdownReport};
pub use self::staleness::{MAX_STALENESS_VALUE, StalenessPolicy, StalenessStatus};
pub use self::version::{Sha256, VersionInfo, VersionOrigin, VersionWanted};
