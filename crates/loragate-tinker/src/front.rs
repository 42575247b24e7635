//! The front's configuration, and [`TinkerFront`], which hands the routes to the HTTP listener.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use loragate_core::{Coordinator, StateError};
use loragate_net::json_body::DEFAULT_BODY_LIMIT;
use loragate_text::TextCodec;
use ractor::SpawnErr;
use tokio::time::Instant;

use crate::ids::{Epoch, IdMaker};
use crate::restore::{continue_samples, recover};
use crate::routes::routes;
use crate::state::{Shared, TinkerState};
use crate::store::{FutureStore, RetentionLimits};

/// How often expired results are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The Tinker front's settings.
#[derive(Clone, Debug)]
pub struct TinkerConfig {
    /// How long `retrieve_future` holds a poll for a future that is not final before answering `try_again` (below
    /// the SDK's 45 s timeout; the SDK polls again at once).
    pub poll_hold: Duration,
    /// The longest a sample waits for its paused adapter before its future fails (below the SDK's 120-minute stuck
    /// detection).
    pub max_pause_wait: Duration,
    /// How many futures and results are kept, and for how long.
    pub retention: RetentionLimits,
    /// The largest request body accepted, in bytes (413 past it).
    pub body_limit: usize,
}

impl Default for TinkerConfig {
    fn default() -> Self {
        Self {
            poll_hold: Duration::from_secs(25),
            max_pause_wait: Duration::from_secs(30 * 60),
            retention: RetentionLimits::default(),
            body_limit: DEFAULT_BODY_LIMIT,
        }
    }
}

/// Why the front could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The futures store's actor did not start.
    #[error("the Tinker futures store did not start: {0}")]
    Spawn(#[from] SpawnErr),
    /// The futures recorded before a restart could not be read.
    #[error("cannot read the recorded Tinker futures: {0}")]
    State(#[from] StateError),
}

/// The Tinker API front over a coordinator. Mount [`TinkerFront::routes`] on the HTTP listener (the binary hands
/// them to the HTTP front's `HttpFront::with_routes`).
#[derive(Clone)]
pub struct TinkerFront {
    state: TinkerState,
}

impl TinkerFront {
    /// Starts the front's futures store, recording into the coordinator's state store, and puts back the futures
    /// recorded there before a restart (pending samples are continued, results served until their retention ends).
    /// `served_model_name` is the base model's name (`base_model=`); `codec` decodes generated tokens to watch stop
    /// strings.
    pub async fn start(
        coordinator: Coordinator,
        served_model_name: impl Into<String>,
        codec: Arc<dyn TextCodec>,
        config: TinkerConfig,
    ) -> Result<Self, StartError> {
        let records = coordinator.config().state.clone();
        let recorded = records.recorded().await?;
        let recovered = recover(recorded.front_records, &config.retention, SystemTime::now(), Instant::now());
        if !recovered.forgotten.is_empty() {
            records.record(recovered.forgotten).await?;
        }
        let store = FutureStore::start(config.retention, SWEEP_EVERY, records, recovered.futures).await?;
        let served_model_name: String = served_model_name.into();
        let shared = Shared {
            coordinator,
            served_model_name: served_model_name.into(),
            codec,
            config,
            store,
            ids: IdMaker::new(Epoch::random()),
        };
        let state = TinkerState::new(shared);
        continue_samples(&state, recovered.to_continue);
        Ok(Self { state })
    }

    /// The `/api/v1/…` routes, with their state applied and no fallback (unknown `/api/v1/` paths get the Tinker
    /// "not supported" 404 from a catch-all route of their own).
    pub fn routes(&self) -> Router {
        routes(self.state.clone())
    }

    /// The shared state (tests observe the store through it).
    #[cfg(test)]
    pub(crate) fn state(&self) -> &TinkerState {
        &self.state
    }
}
