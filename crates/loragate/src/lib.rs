//! The loragate server: swap LoRA adapter weights while rollouts keep sampling, safely and per adapter.
//!
//! This crate puts the pieces together: the candle engine ([`loragate_engine`]), the coordinator
//! ([`loragate_core`]), the gRPC front ([`loragate_grpc`]) and the HTTP front ([`loragate_http`]); `loragate serve`
//! runs them, and [`RunningServer`] does the same in-process (the cross-crate tests start real servers on
//! `127.0.0.1:0` with it). With `--worker URL`, `serve` fronts a fleet of workers ([`loragate_fleet`]) instead of
//! the in-process engine; `loragate worker` ([`RunningWorker`]) is such a worker, the engine and a coordinator behind
//! vLLM's own gRPC protocol ([`loragate_worker`]).
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

mod cli;
mod compute_threads;
mod duration_arg;
mod large_frees;
mod listen_addr;
mod logging;
mod model_facts;
mod serve;
mod state_dir;
mod stats_log;
mod text_codec;
mod worker;

pub use cli::{Cli, Command, EngineArgs, FrontLimitArgs, KeyArgs, ServeArgs, WorkerArgs};
pub use compute_threads::{default_compute_threads, set_compute_threads};
pub use duration_arg::parse_duration;
pub use large_frees::return_large_frees_to_the_os;
pub use logging::{LogFormat, init_logging};
pub use loragate_engine::{DemoFiles, default_cache_dir, ensure_demo_files};
pub use serve::{Authentication, InitialAdapter, ModelSource, RunningServer, ServeConfig, ServeError};
pub use state_dir::StateLocation;
pub use worker::{RunningWorker, WorkerSettings};
