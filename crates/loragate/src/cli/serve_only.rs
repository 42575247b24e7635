//! The flag groups only `serve` has: the fleet of workers it fronts, and the Tinker API front.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use loragate_core::Key;
use loragate_fleet::WorkerAddress;
use loragate_tinker::{RetentionLimits, TinkerConfig};

use crate::duration_arg::parse_duration;
use crate::settings::FleetSettings;

/// The workers `serve` fronts instead of running the model in-process.
#[derive(Debug, Args)]
pub struct FleetArgs {
    /// A worker to front instead of running the model in-process. Its URL's scheme names its protocol:
    /// `grpc://HOST:PORT` (vLLM's gRPC: `loragate worker`, vLLM's `vllm-rs serve MODEL --grpc-port PORT`; `http://` is
    /// an alias), `vllm+http://HOST:PORT` (vLLM's OpenAI server) or `sglang+http://HOST:PORT` (SGLang's server).
    /// Repeatable, protocols mixed. With workers, --model supplies only the config and tokenizer, and adapter paths
    /// are sent to the workers absolute (see --worker-adapter-root).
    #[arg(long = "worker", value_name = "URL", value_parser = WorkerUrlParser)]
    pub workers: Vec<WorkerAddress>,
    /// How often each worker's health is checked, in seconds.
    #[arg(long, value_name = "SECONDS", default_value = "2", value_parser = parse_duration)]
    pub worker_health_interval: Duration,
    /// Failures in a row after which a worker's health checks back off exponentially, and it must pass this many
    /// checks in a row before it gets traffic again.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub worker_failure_threshold: u32,
    /// How long a fleet coordinator waits at start for a first worker to be ready (workers started after it are
    /// waited for), in seconds.
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = parse_duration)]
    pub worker_wait: Duration,
    /// How long a worker may take from a sequence's request to its first streamed event (response head and first
    /// chunk), in seconds. Past it the sequence is tried on another worker (or handed back aborted, retryable) and
    /// the worker counts a failure.
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = parse_duration)]
    pub worker_first_byte_timeout: Duration,
    /// How long a worker may stay silent between two events of a sequence's stream, in seconds. Past it the
    /// sequence is handed back aborted with its tokens (retryable) and the worker counts a failure.
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = parse_duration)]
    pub worker_inter_chunk_timeout: Duration,
    /// The most workers a fleet holds (--worker and AddWorker together); more are refused.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_workers: u64,
    /// Where the workers mount the adapter root: adapter paths inside --adapter-root are sent to the workers under
    /// this directory instead (default: the same path as here).
    #[arg(long, value_name = "DIR")]
    pub worker_adapter_root: Option<PathBuf>,
    /// The key presented to the workers (as `authorization: Bearer KEY`): a `loragate worker`'s --admin-key, or
    /// the --api-key of a vLLM or SGLang server.
    #[arg(long, value_name = "KEY", env = "LORAGATE_WORKER_KEY", hide_env_values = true)]
    pub worker_key: Option<Key>,
}

impl FleetArgs {
    /// The fleet these flags describe (none without --worker).
    pub fn into_settings(self) -> FleetSettings {
        FleetSettings {
            workers: self.workers,
            health_interval: self.worker_health_interval,
            failure_threshold: self.worker_failure_threshold,
            join_timeout: self.worker_wait,
            first_byte_timeout: self.worker_first_byte_timeout,
            inter_chunk_timeout: self.worker_inter_chunk_timeout,
            max_workers: usize::try_from(self.max_workers).unwrap_or(usize::MAX),
            worker_adapter_root: self.worker_adapter_root,
            worker_key: self.worker_key,
        }
    }
}

/// The Tinker API front's flags.
#[derive(Debug, Args)]
pub struct TinkerArgs {
    /// Tinker API: the longest a sample waits for its paused adapter before its future fails (keep it below the
    /// SDK's 120-minute stuck detection).
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = parse_duration)]
    pub tinker_max_pause_wait: Duration,
    /// Tinker API: the most samples pending at once; past it `asample` answers 429 and the SDK resubmits after a
    /// back-off.
    #[arg(long, value_name = "N", default_value_t = RetentionLimits::default().max_pending)]
    pub tinker_max_pending: usize,
    /// Tinker API: how long a `retrieve_future` long-poll is held before answering `try_again` (below the SDK's
    /// 45 s timeout).
    #[arg(long, value_name = "DURATION", default_value = "25s", value_parser = parse_duration)]
    pub tinker_poll_hold: Duration,
}

impl TinkerArgs {
    /// The Tinker front's settings these flags describe (the rest at their defaults).
    pub fn tinker_config(&self) -> TinkerConfig {
        TinkerConfig {
            max_pause_wait: self.tinker_max_pause_wait,
            poll_hold: self.tinker_poll_hold,
            retention: RetentionLimits { max_pending: self.tinker_max_pending, ..RetentionLimits::default() },
            ..TinkerConfig::default()
        }
    }
}

/// Parses `--worker`. Its errors never quote the value as given (clap's own errors would): an address may carry a
/// credential, which must not reach a terminal or a log.
#[derive(Clone, Copy, Debug)]
struct WorkerUrlParser;

impl clap::builder::TypedValueParser for WorkerUrlParser {
    type Value = WorkerAddress;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<WorkerAddress, clap::Error> {
        let invalid = |why: String| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("--worker: {why}\n")).with_cmd(cmd)
        };
        let raw = value.to_str().ok_or_else(|| invalid("is not UTF-8".into()))?;
        WorkerAddress::parse(raw).map_err(|err| invalid(err.to_string()))
    }
}
