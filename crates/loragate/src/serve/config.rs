//! Everything `loragate serve` needs, in the setting groups it shares with `worker`.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use loragate_core::{Engine, Limits};
use loragate_engine::EngineConfig;
use loragate_net::ConnectionLimits;
use loragate_tinker::TinkerConfig;

use crate::model::ModelSource;
use crate::settings::{AdapterSettings, Authentication, FleetSettings, GateDeadlines};
use crate::state_dir::StateLocation;

/// Everything `loragate serve` needs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// gRPC address (port 0 picks a free port).
    pub grpc_addr: SocketAddr,
    /// HTTP address (port 0 picks a free port).
    pub http_addr: SocketAddr,
    /// The model.
    pub model: ModelSource,
    /// The base model's name over HTTP (default: the directory's name or the GGUF file's stem, or `loragate-demo`).
    pub served_model_name: Option<String>,
    /// The adapters to load at start, where loads by path may read from, and how many versions stay servable.
    pub adapters: AdapterSettings,
    /// The longest hold at a paused adapter's gate, and how long pauses wait for running requests.
    pub deadlines: GateDeadlines,
    /// How long running requests may finish on shutdown before the rest are aborted.
    pub shutdown_grace: Duration,
    /// Caps on admitted and held sampling requests.
    pub limits: Limits,
    /// The connection cap and timeouts, both fronts together. Clones share the cap: servers started from clones of
    /// one configuration count their connections against one cap, as the listeners of one server do.
    pub connections: ConnectionLimits,
    /// Who may do what (off unless some key is given).
    pub authentication: Authentication,
    /// How the engine runs.
    pub engine: EngineConfig,
    /// Workers to front instead of running the engine in-process (`--worker`); none for the in-process engine.
    pub fleet: FleetSettings,
    /// Where adapters, versions and pauses are recorded to survive a restart (`--state-dir`), or shared with other
    /// replicas (`--state etcd://…`).
    pub state: StateLocation,
    /// With a shared state: the TTL of this replica's registration (`--replica-lease`), how long after its death
    /// pauses stop waiting for it.
    pub replica_lease: Duration,
    /// The Tinker API front's settings (its routes share the HTTP listener).
    pub tinker: TinkerConfig,
    /// How often the stats line is logged (`--log-stats-interval`); `None` for never.
    pub log_stats_interval: Option<Duration>,
    /// What wraps the engine (in-process or the fleet) before the coordinator drives it; `None` (every flag-built
    /// configuration) drives it as started. For embedders that shape every request at the engine seam.
    pub engine_layer: Option<EngineLayer>,
}

/// A wrapper around the engine the coordinator drives ([`ServeConfig::engine_layer`]): it gets the started engine
/// and returns the one the coordinator uses, which delegates to it. The cross-crate tests stall requests at a known
/// token with one, so that a pause is certain to find them running.
#[derive(Clone)]
pub struct EngineLayer(Arc<WrapEngine>);

/// What an [`EngineLayer`] does to the started engine.
type WrapEngine = dyn Fn(Arc<dyn Engine>) -> Arc<dyn Engine> + Send + Sync;

impl EngineLayer {
    /// The layer that wraps an engine with `wrap`.
    pub fn new(wrap: impl Fn(Arc<dyn Engine>) -> Arc<dyn Engine> + Send + Sync + 'static) -> Self {
        Self(Arc::new(wrap))
    }

    /// `engine`, wrapped.
    pub(crate) fn wrap(&self, engine: Arc<dyn Engine>) -> Arc<dyn Engine> {
        (self.0)(engine)
    }
}

impl fmt::Debug for EngineLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EngineLayer(..)")
    }
}

impl ServeConfig {
    /// The demo model on the contract's default addresses, with its state in memory only.
    pub fn demo(cache_dir: PathBuf) -> Self {
        Self {
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 50051)),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            model: ModelSource::Demo { cache_dir },
            served_model_name: None,
            adapters: AdapterSettings::default(),
            deadlines: GateDeadlines::default(),
            shutdown_grace: Duration::from_secs(10),
            limits: Limits::default(),
            connections: ConnectionLimits::default(),
            authentication: Authentication::default(),
            engine: EngineConfig::default(),
            fleet: FleetSettings::default(),
            state: StateLocation::Memory,
            replica_lease: Duration::from_secs(5),
            tinker: TinkerConfig::default(),
            log_stats_interval: None,
            engine_layer: None,
        }
    }
}
