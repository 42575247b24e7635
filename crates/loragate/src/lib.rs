//! The loragate server: swap LoRA adapter weights while rollouts keep sampling, safely and per adapter.
//!
//! This crate is the composition root: it puts the pieces together and nothing else depends on it. `loragate serve`
//! ([`RunningServer`]) runs the candle engine ([`loragate_engine`]) or, with `--worker URL`, a fleet of workers
//! ([`loragate_fleet`]) under the coordinator ([`loragate_core`]), with its state in a directory
//! ([`loragate_state`]) or shared through etcd ([`loragate_etcd`]), behind the gRPC front ([`loragate_grpc`]) and
//! the HTTP front ([`loragate_http`]) with the Tinker API's routes ([`loragate_tinker`]); the cross-crate tests start
//! real servers on `127.0.0.1:0` with it. `loragate worker` ([`RunningWorker`]) is one worker of such a fleet: the
//! engine and a coordinator, which the binary builds, behind vLLM's own gRPC protocol ([`loragate_worker`]). Both
//! take their settings in the same groups: [`GateDeadlines`], [`Authentication`], [`FleetSettings`] (`serve` only),
//! the core's `Limits`, `loragate_net::ConnectionLimits` and the engine's `EngineConfig`, each filled by one flag
//! group ([`GateArgs`], [`KeyArgs`], [`FleetArgs`], [`AdmissionArgs`], [`ConnectionArgs`], [`EngineArgs`]).
//!
//! ```no_run
//! # async fn run() -> Result<(), loragate::ServeError> {
//! let mut config = loragate::ServeConfig::demo(loragate_engine::default_cache_dir());
//! config.grpc_addr = "127.0.0.1:0".parse().expect("address");
//! config.http_addr = "127.0.0.1:0".parse().expect("address");
//! let server = loragate::RunningServer::start(config).await?;
//! println!("gRPC on {}, HTTP on {}", server.grpc_addr(), server.http_addr());
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod agent;
mod byte_size_arg;
mod cli;
mod compute_threads;
mod duration_arg;
mod error;
mod large_frees;
mod listen_addr;
mod logging;
mod model;
mod model_facts;
mod serve;
mod settings;
mod startup;
mod state_dir;
mod stats_log;
mod text_codec;
mod worker;

pub use agent::{AgentSettings, RunningAgent};
pub use byte_size_arg::parse_byte_size;
pub use cli::{
    AdmissionArgs, AgentArgs, Cli, Command, ConnectionArgs, EngineArgs, FleetArgs, GateArgs, KeyArgs, ServeArgs,
    TinkerArgs, WorkerArgs,
};
pub use compute_threads::{default_compute_threads, set_compute_threads};
pub use duration_arg::parse_duration;
pub use error::ServeError;
pub use large_frees::return_large_frees_to_the_os;
pub use logging::{LogFormat, init_logging};
pub use loragate_engine::{DemoFiles, default_cache_dir, ensure_demo_files};
pub use model::{InitialAdapter, ModelSource};
pub use serve::{EngineLayer, RunningServer, ServeConfig};
pub use settings::{AdapterSettings, Authentication, FleetSettings, GateDeadlines};
pub use state_dir::StateLocation;
pub use worker::{RunningWorker, WorkerSettings};
