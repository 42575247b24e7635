//! Why `serve` or `worker` could not start or run: one error for the binary.

use std::net::SocketAddr;
use std::path::PathBuf;

use loragate_core::{AdapterName, CoreError, KeyConfigError, StartError, StateError};
use loragate_engine::{DemoError, EngineLoadError};
use loragate_fleet::FleetError;

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The demo model could not be generated.
    #[error(transparent)]
    Demo(#[from] DemoError),
    /// `--model` names no file or directory.
    #[error("--model {}: no such file or directory; {hint}", path.display())]
    ModelMissing {
        /// The path given.
        path: PathBuf,
        /// What to do instead.
        hint: String,
    },
    /// The model could not be loaded.
    #[error(transparent)]
    Engine(#[from] EngineLoadError),
    /// `--adapter-root` is not a readable directory (or, with workers, not a path the workers can be sent).
    #[error("--adapter-root {path}: {source}")]
    AdapterRoot {
        /// The directory.
        path: PathBuf,
        /// Why it cannot be used.
        #[source]
        source: std::io::Error,
    },
    /// An `--adapter` could not be loaded.
    #[error("--adapter {name}={}: {source}", dir.display())]
    Adapter {
        /// Its name.
        name: AdapterName,
        /// Its directory.
        dir: PathBuf,
        /// Why it failed.
        #[source]
        source: CoreError,
    },
    /// The keys cannot be used.
    #[error("authentication keys: {0}")]
    Keys(#[from] KeyConfigError),
    /// The coordinator could not start (its actors, or the recorded state it puts back).
    #[error(transparent)]
    Coordinator(#[from] StartError),
    /// The state directory (or the shared state) cannot be used.
    #[error("--state-dir / --state: {0}")]
    State(#[from] StateError),
    /// This replica's addresses could not be announced to the others sharing the state.
    #[error("--state: announcing this replica: {0}")]
    Announce(String),
    /// The Tinker front's futures store could not start.
    #[error("starting the Tinker front: {0}")]
    Tinker(#[source] loragate_tinker::StartError),
    /// A listener could not be bound.
    #[error("binding {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error(transparent)]
    Grpc(#[from] loragate_grpc::GrpcServeError),
    /// The HTTP server failed.
    #[error(transparent)]
    Http(#[from] loragate_http::HttpServeError),
    /// `loragate agent`'s server failed (its directory could not be opened, or serving failed).
    #[error("agent: {0}")]
    Agent(String),
    /// A blocking start-up task panicked.
    #[error("start-up task failed: {0}")]
    Startup(String),
    /// The fleet of workers could not start (no worker became ready).
    #[error("--worker: {0}")]
    Fleet(#[from] FleetError),
    /// With workers, an `--adapter` path leaves the adapter root (or has `..`).
    #[error("--adapter {name}={}: the path leaves the adapter root {}", dir.display(), root.display())]
    AdapterOutsideRoot {
        /// Its name.
        name: AdapterName,
        /// Its path.
        dir: PathBuf,
        /// The adapter root.
        root: PathBuf,
    },
    /// SIGINT or SIGTERM arrived before the server was ready: nothing was served.
    #[error("stopped by a signal while starting ({step}); nothing was served")]
    Interrupted {
        /// The start-up step under way.
        step: String,
    },
    /// The worker could not serve.
    #[error(transparent)]
    Worker(#[from] loragate_worker::WorkerServeError),
}
