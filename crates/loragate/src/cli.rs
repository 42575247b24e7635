//! The command line: `loragate serve`, `loragate worker` and `loragate demo-model`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use loragate_core::{AdapterName, DEFAULT_MAX_HELD, DEFAULT_MAX_IN_FLIGHT, Key, Limits};
use loragate_engine::{DType, Device, EngineConfig, QuantizedWeights};
use loragate_fleet::WorkerAddress;
use loragate_tinker::{RetentionLimits, TinkerConfig};

use crate::duration_arg::parse_duration;
use crate::serve::{Authentication, InitialAdapter, ModelSource, ServeConfig};
use crate::state_dir::StateLocation;
use crate::worker::WorkerSettings;

/// loragate: swap LoRA adapter weights while rollouts keep sampling, safely and per adapter.
#[derive(Debug, Parser)]
#[command(name = "loragate", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a model and its LoRA adapters over gRPC and HTTP (the built-in demo model when no --model is given).
    Serve(Box<ServeArgs>),
    /// Serve the model over vLLM's own gRPC protocol (vllm.Inference, vllm.Control, grpc.health.v1) as one worker
    /// of a fleet behind `loragate serve --worker URL` (the built-in demo model when no --model is given).
    Worker(Box<WorkerArgs>),
    /// Write the demo base model (Hugging Face format) and its `meow` and `woof` adapters (PEFT format) to a
    /// directory: DIR/model/, DIR/adapters/meow/, DIR/adapters/woof/.
    DemoModel {
        /// Where to write them.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Write a PEFT LoRA adapter with seeded random factors for a model (a Hugging Face directory or a GGUF file),
    /// adapting all seven projections of every layer. Untrained: it shifts the model's outputs without teaching it
    /// anything; use it to try per-request adapters, loads and swaps on a real model before bringing trained ones.
    RandomAdapter {
        /// The model the adapter is for.
        #[arg(long, value_name = "DIR|FILE.gguf")]
        model: PathBuf,
        /// The adapter directory to write.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The LoRA rank.
        #[arg(long, default_value_t = 8)]
        rank: usize,
        /// `lora_alpha` (the scale is alpha / rank).
        #[arg(long, default_value_t = 16.0)]
        alpha: f64,
        /// The standard deviation of `lora_B`'s values (PEFT starts them at zero, which would change nothing).
        #[arg(long, default_value_t = 0.01)]
        b_std: f32,
        /// The seed: the same seed writes the same adapter.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// `loragate serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the gRPC server (LoraControl, Sampler, health, reflection).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50051")]
    pub grpc_addr: SocketAddr,
    /// Address of the HTTP server (OpenAI- and SkyRL-compatible endpoints, metrics).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8000")]
    pub http_addr: SocketAddr,
    /// The model: a Hugging Face model directory (config.json, safetensors, tokenizer.json, tokenizer_config.json)
    /// or a GGUF file (llama.cpp's format; its tokenizer and chat template come from its metadata). Without it, the
    /// built-in demo model is served with its adapters `meow` and `woof` loaded.
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,
    /// What HTTP `model` and /v1/models call the base model (default: the model directory's name or the GGUF file's
    /// stem; `loragate-demo` for the demo).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// An adapter to load at start: NAME=DIR with DIR a PEFT adapter directory. Repeatable.
    #[arg(long = "adapter", value_name = "NAME=DIR", value_parser = parse_initial_adapter)]
    pub adapters: Vec<InitialAdapter>,
    /// The only directory LoadLoraAdapter may read adapters from (paths outside it, `..` escapes and symlinks out
    /// of it are refused). Default for the demo: its adapters directory; otherwise loading by path is disabled.
    #[arg(long, value_name = "DIR")]
    pub adapter_root: Option<PathBuf>,
    /// The longest a sampling request waits at a paused adapter's gate before UNAVAILABLE / 503.
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub gate_max_wait: Duration,
    /// How long an abort waits for its requests to be handed back before reporting the stragglers.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub abort_ack_timeout: Duration,
    /// The longest a wait-mode pause waits for running requests to finish when its caller set no deadline (past it
    /// the pause is withdrawn and the call fails).
    #[arg(long, value_name = "DURATION", default_value = "600s", value_parser = parse_duration)]
    pub max_pause_drain: Duration,
    /// On SIGINT/SIGTERM, how long running requests may finish before the rest are aborted.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
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
    /// The most workers a fleet holds (--worker and AddWorker together); more are refused.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_workers: u64,
    /// Where the workers mount the adapter root: adapter paths inside --adapter-root are sent to the workers under
    /// this directory instead (default: the same path as here).
    #[arg(long, value_name = "DIR")]
    pub worker_adapter_root: Option<PathBuf>,
    /// The most sampling requests admitted at once (queued or running), over every adapter and the base model;
    /// more are refused with RESOURCE_EXHAUSTED / 429.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: u32,
    /// The most sampling requests held at paused adapters' gates at once; more are refused with
    /// RESOURCE_EXHAUSTED / 429.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_HELD)]
    pub max_held: u32,
    /// The most sampling requests admitted at once for any one adapter (default: only --max-in-flight applies).
    #[arg(long, value_name = "N")]
    pub max_in_flight_per_adapter: Option<u32>,
    /// The most sampling requests held at any one adapter's gate (default: only --max-held applies).
    #[arg(long, value_name = "N")]
    pub max_held_per_adapter: Option<u32>,
    /// The most connections open at once, gRPC and HTTP together; more wait to be accepted.
    #[arg(long, value_name = "N", default_value_t = loragate_net::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// How long a new connection may take to send its first complete request head before it is closed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// How long a connection may stay without a request in progress before it is closed (long-polls, held
    /// requests and streams are in progress).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Turns authentication on: this key may sample (send it as `Authorization: Bearer KEY`, on gRPC as
    /// `authorization` metadata). Health and metrics stay open.
    #[arg(long, value_name = "KEY", env = "LORAGATE_API_KEY", hide_env_values = true)]
    pub api_key: Option<Key>,
    /// Turns authentication on: this key may do everything (pause, resume, load, unload, and sample).
    #[arg(long, value_name = "KEY", env = "LORAGATE_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<Key>,
    /// Turns authentication on with per-tenant keys: a JSON file mapping each key to
    /// {"adapters": [names or prefixes like "team-a/*"], "control": bool} (see docs/security.md).
    #[arg(long, value_name = "FILE")]
    pub tenant_keys: Option<PathBuf>,
    /// Where loaded adapters, their versions and pauses are recorded, so that a restart puts them back: a directory
    /// (default: $XDG_STATE_HOME/loragate/<served-name>, else ~/.local/state/loragate/<served-name>), or `none` to
    /// keep them in memory only. Remove the directory to start fresh (see docs/state.md).
    #[arg(long, value_name = "DIR|none", value_parser = StateLocation::parse)]
    pub state_dir: Option<StateLocation>,
    /// Shares adapters, versions and pauses with every other coordinator started with the same URL, through etcd: a
    /// pause, resume, load or unload on any of them holds on all (see docs/state.md). Nothing is kept in a state
    /// directory then.
    #[arg(long, value_name = "etcd://HOST:PORT[,HOST:PORT…]/PREFIX", value_parser = parse_shared_state, conflicts_with = "state_dir")]
    pub state: Option<StateLocation>,
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
    /// How the model runs in-process (with --worker, only --max-context-length and --cache-dir apply).
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `loragate worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Address of the gRPC server (vllm.Inference, vllm.Control, grpc.health.v1).
    #[arg(long, value_name = "HOST:PORT")]
    pub grpc_addr: SocketAddr,
    /// A Hugging Face model directory or a GGUF file. Without it, the built-in demo model is served (no adapter
    /// loaded: the fleet loads them).
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,
    /// What `GenerateRequest.model` may name and GetModelInfo reports (default: the model directory's name or the
    /// GGUF file's stem; `loragate-demo` for the demo).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// The only directory LoadLora may read adapters from (relative paths are taken from it). Default for the demo:
    /// its adapters directory; otherwise loading is refused.
    #[arg(long, value_name = "DIR")]
    pub adapter_root: Option<PathBuf>,
    /// How the model runs.
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl WorkerArgs {
    /// The worker these arguments describe.
    pub fn into_settings(self) -> WorkerSettings {
        WorkerSettings {
            grpc_addr: self.grpc_addr,
            model: self.engine.model_source(self.model),
            served_model_name: self.served_model_name,
            adapter_root: self.adapter_root,
            engine: self.engine.engine_config(),
        }
    }
}

/// How the model runs: the flags `serve` and `worker` share.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// Where the model runs: cpu, cuda or cuda:N (CUDA needs a build with the `cuda` feature).
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    pub device: Device,
    /// The weights' type: f32, bf16 or f16 (half precision on CUDA only).
    #[arg(long, value_name = "DTYPE", default_value = "f32")]
    pub dtype: DType,
    /// The most sequences decoded together in one engine step.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_batch_size: usize,
    /// The most tokens one engine step runs: one for each decoding sequence, the rest chunks of prompts being
    /// prefilled. It trades the other streams' inter-token latency while long prompts (or a swap's continuations)
    /// arrive, which it bounds, against prefill throughput, which fewer larger passes raise. Must exceed
    /// --max-batch-size (default: 128 on the CPU, 2048 on CUDA; see docs/engine.md).
    #[arg(long, value_name = "N")]
    pub max_num_batched_tokens: Option<usize>,
    /// CPU threads for the engine's tensor operations (default: $RAYON_NUM_THREADS, else half the cores, at least
    /// 1). Candle's small CPU ops lose more to cross-thread synchronisation than they gain, and the async runtime
    /// needs cores too (see docs/benchmarks.md).
    #[arg(long, value_name = "N", default_value_t = crate::compute_threads::default_compute_threads())]
    pub compute_threads: usize,
    /// Serve at most this many tokens of context (default: the model's own length).
    #[arg(long, value_name = "TOKENS")]
    pub max_context_length: Option<u32>,
    /// The largest LoRA rank (`r`) an adapter may have; loads of larger ones are refused.
    #[arg(long, value_name = "RANK", default_value_t = EngineConfig::DEFAULT_MAX_LORA_RANK)]
    pub max_lora_rank: usize,
    /// The largest adapter weights file (adapter_model.safetensors) accepted, in bytes (default: 1 GiB).
    #[arg(long, value_name = "BYTES", default_value_t = EngineConfig::DEFAULT_MAX_ADAPTER_BYTES)]
    pub max_adapter_bytes: u64,
    /// How long reading and checking one adapter may take before its load fails (installing nothing).
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub adapter_load_timeout: Duration,
    /// How a GGUF file's quantized weights are multiplied: `quantized` (kept in their block format: least memory,
    /// fastest decoding), `dequantized` (to --dtype at load: dense GEMMs everywhere), or `hybrid[:N]` (both:
    /// quantized below N input rows, dense from N rows on — prefill —, default N = 64).
    #[arg(long, value_name = "MODE", default_value = "quantized")]
    pub quantized_weights: QuantizedWeights,
    /// Where the demo model is generated and cached (default: $LORAGATE_CACHE_DIR, $XDG_CACHE_HOME/loragate or
    /// ~/.cache/loragate).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

impl EngineArgs {
    /// The engine configuration.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            device: self.device,
            dtype: self.dtype,
            max_batch_size: self.max_batch_size,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_context_length: self.max_context_length,
            max_lora_rank: self.max_lora_rank,
            max_adapter_bytes: self.max_adapter_bytes,
            adapter_load_timeout: self.adapter_load_timeout,
            quantized_weights: self.quantized_weights,
        }
    }

    /// The model: `path`, or the demo model cached in --cache-dir.
    fn model_source(&self, path: Option<PathBuf>) -> ModelSource {
        match path {
            Some(path) => ModelSource::Path(path),
            None => ModelSource::Demo {
                cache_dir: self.cache_dir.clone().unwrap_or_else(loragate_engine::default_cache_dir),
            },
        }
    }
}

impl ServeArgs {
    /// The server configuration these arguments describe.
    pub fn into_config(self) -> ServeConfig {
        let model = self.engine.model_source(self.model);
        ServeConfig {
            grpc_addr: self.grpc_addr,
            http_addr: self.http_addr,
            model,
            served_model_name: self.served_model_name,
            adapters: self.adapters,
            adapter_root: self.adapter_root,
            gate_max_wait: self.gate_max_wait,
            limits: Limits {
                max_in_flight: self.max_in_flight,
                max_held: self.max_held,
                max_in_flight_per_adapter: self.max_in_flight_per_adapter,
                max_held_per_adapter: self.max_held_per_adapter,
            },
            max_connections: self.max_connections,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            authentication: Authentication {
                api_key: self.api_key,
                admin_key: self.admin_key,
                tenant_keys: self.tenant_keys,
            },
            abort_ack_timeout: self.abort_ack_timeout,
            max_pause_drain: self.max_pause_drain,
            shutdown_grace: self.shutdown_grace,
            engine: self.engine.engine_config(),
            workers: self.workers,
            worker_health_interval: self.worker_health_interval,
            worker_failure_threshold: self.worker_failure_threshold,
            worker_wait: self.worker_wait,
            max_workers: usize::try_from(self.max_workers).unwrap_or(usize::MAX),
            worker_adapter_root: self.worker_adapter_root,
            state: self.state.or(self.state_dir).unwrap_or(StateLocation::UserDefault),
            tinker: TinkerConfig {
                max_pause_wait: self.tinker_max_pause_wait,
                poll_hold: self.tinker_poll_hold,
                retention: RetentionLimits { max_pending: self.tinker_max_pending, ..RetentionLimits::default() },
                ..TinkerConfig::default()
            },
        }
    }
}

/// Parses `--state`.
fn parse_shared_state(raw: &str) -> Result<StateLocation, String> {
    loragate_etcd::EtcdUrl::parse(raw).map(StateLocation::Shared).map_err(|err| err.to_string())
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

fn parse_initial_adapter(raw: &str) -> Result<InitialAdapter, String> {
    let (name, dir) = raw.split_once('=').ok_or_else(|| format!("{raw:?} is not NAME=DIR"))?;
    let name = AdapterName::parse(name).map_err(|err| err.to_string())?;
    if dir.is_empty() {
        return Err(format!("{raw:?} names no directory"));
    }
    Ok(InitialAdapter { name, dir: PathBuf::from(dir) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_defaults_match_the_contract() {
        let Cli { command: Command::Serve(args) } = Cli::parse_from(["loragate", "serve"]) else {
            panic!("serve parses");
        };
        assert_eq!(args.grpc_addr, "127.0.0.1:50051".parse().expect("address"));
        assert_eq!(args.http_addr, "127.0.0.1:8000".parse().expect("address"));
        assert!(args.model.is_none() && args.adapters.is_empty());
        let config = args.into_config();
        assert!(matches!(config.model, ModelSource::Demo { .. }));
        assert_eq!((config.engine.max_lora_rank, config.engine.max_adapter_bytes), (64, 1 << 30));
        assert_eq!(config.engine.adapter_load_timeout, Duration::from_secs(120));
        assert_eq!(config.state, StateLocation::UserDefault, "durable by default");
        assert_eq!(config.engine.max_num_batched_tokens, None, "sized to the device when the engine starts");
    }

    #[test]
    fn state_dir_takes_a_directory_or_none() {
        let state = |args: &[&str]| {
            let Command::Serve(args) = Cli::try_parse_from(args).expect("parses").command else { panic!("serve") };
            args.into_config().state
        };
        assert_eq!(state(&["loragate", "serve", "--state-dir", "none"]), StateLocation::Memory);
        assert_eq!(
            state(&["loragate", "serve", "--state-dir", "/srv/lg"]),
            StateLocation::Directory(PathBuf::from("/srv/lg"))
        );
        let bad = Cli::try_parse_from(["loragate", "serve", "--state-dir", ""]).expect_err("empty");
        assert!(bad.to_string().contains("--state-dir"), "{bad}");
        let url = "etcd://127.0.0.1:2379,etcd-b:2379/lg";
        assert_eq!(
            state(&["loragate", "serve", "--state", url]),
            StateLocation::Shared(loragate_etcd::EtcdUrl::parse(url).expect("valid"))
        );
        let both = Cli::try_parse_from(["loragate", "serve", "--state", url, "--state-dir", "/srv/lg"]);
        assert!(both.expect_err("both").to_string().contains("--state-dir"), "one or the other");
        let bad = Cli::try_parse_from(["loragate", "serve", "--state", "etcd://h/lg"]).expect_err("no port");
        assert!(bad.to_string().contains("no :PORT"), "{bad}");
    }

    #[test]
    fn adapters_are_name_equals_dir_and_repeatable() {
        let cli = Cli::try_parse_from([
            "loragate",
            "serve",
            "--model",
            "/m",
            "--adapter",
            "meow=/a/meow",
            "--adapter",
            "woof=/a/woof",
            "--adapter-root",
            "/a",
            "--gate-max-wait",
            "5s",
            "--device",
            "cuda:1",
            "--max-lora-rank",
            "16",
            "--max-adapter-bytes",
            "1000000",
            "--adapter-load-timeout",
            "5s",
        ])
        .expect("parses");
        let Command::Serve(args) = cli.command else { panic!("serve") };
        let names: Vec<_> = args.adapters.iter().map(|a| a.name.to_string()).collect();
        assert_eq!(names, vec!["meow", "woof"]);
        assert_eq!(args.gate_max_wait, Duration::from_secs(5));
        assert_eq!(args.engine.device, Device::Cuda(1));
        let engine = args.into_config().engine;
        assert_eq!((engine.max_lora_rank, engine.max_adapter_bytes), (16, 1_000_000));
        assert_eq!(engine.adapter_load_timeout, Duration::from_secs(5));
        for bad in ["meow", "=dir", "bad name=dir", "meow="] {
            assert!(Cli::try_parse_from(["loragate", "serve", "--adapter", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_connections_and_keys_have_the_issues_defaults_and_flags() {
        let Command::Serve(args) = Cli::parse_from(["loragate", "serve"]).command else { panic!("serve") };
        let config = args.into_config();
        assert_eq!(config.limits, Limits::default());
        assert_eq!((config.limits.max_in_flight, config.limits.max_held), (1024, 4096));
        assert_eq!(config.max_connections, 4096);
        assert_eq!(
            (config.header_read_timeout, config.idle_timeout),
            (Duration::from_secs(10), Duration::from_secs(60))
        );
        assert!(config.authentication.api_key.is_none() || std::env::var_os("LORAGATE_API_KEY").is_some());

        let cli = Cli::try_parse_from([
            "loragate",
            "serve",
            "--max-in-flight",
            "8",
            "--max-held",
            "16",
            "--max-in-flight-per-adapter",
            "2",
            "--max-held-per-adapter",
            "4",
            "--max-connections",
            "32",
            "--header-read-timeout",
            "2s",
            "--idle-timeout",
            "5s",
            "--api-key",
            "k-api",
            "--admin-key",
            "k-admin",
            "--tenant-keys",
            "/etc/loragate/tenants.json",
        ])
        .expect("parses");
        let Command::Serve(args) = cli.command else { panic!("serve") };
        let config = args.into_config();
        let expected = Limits {
            max_in_flight: 8,
            max_held: 16,
            max_in_flight_per_adapter: Some(2),
            max_held_per_adapter: Some(4),
        };
        assert_eq!(config.limits, expected);
        assert_eq!((config.max_connections, config.idle_timeout), (32, Duration::from_secs(5)));
        assert_eq!(config.authentication.api_key, Some(Key::parse("k-api").expect("key")));
        assert!(!format!("{config:?}").contains("k-admin"), "keys are redacted from Debug output");
        assert!(Cli::try_parse_from(["loragate", "serve", "--api-key", "has space"]).is_err());
    }

    #[test]
    fn serve_fronts_repeated_workers_and_checks_them_every_interval() {
        let Cli { command: Command::Serve(args) } = Cli::parse_from(["loragate", "serve"]) else { panic!("serve") };
        assert!(args.workers.is_empty(), "no worker: the in-process engine");
        assert_eq!(args.worker_health_interval, Duration::from_secs(2), "the default interval");
        let cli = Cli::try_parse_from([
            "loragate",
            "serve",
            "--worker",
            "http://127.0.0.1:9001",
            "--worker",
            "vllm+http://127.0.0.1:9002",
            "--worker",
            "sglang+http://Worker-3:9003/",
            "--worker-health-interval",
            "0.5",
            "--worker-failure-threshold",
            "5",
            "--worker-wait",
            "10",
            "--max-workers",
            "8",
            "--worker-adapter-root",
            "/mnt/adapters",
        ])
        .expect("parses");
        let Command::Serve(args) = cli.command else { panic!("serve") };
        let config = args.into_config();
        let workers: Vec<&str> = config.workers.iter().map(WorkerAddress::as_str).collect();
        assert_eq!(workers, ["grpc://127.0.0.1:9001", "vllm+http://127.0.0.1:9002", "sglang+http://worker-3:9003"]);
        assert_eq!(config.worker_health_interval, Duration::from_millis(500));
        assert_eq!((config.worker_failure_threshold, config.worker_wait), (5, Duration::from_secs(10)));
        assert_eq!(config.max_workers, 8);
        assert_eq!(config.worker_adapter_root.as_deref(), Some(std::path::Path::new("/mnt/adapters")));
        let bad = Cli::try_parse_from(["loragate", "serve", "--worker", "127.0.0.1:9001"]).expect_err("not a URL");
        assert!(bad.to_string().contains("--worker"), "{bad}");
        let secret = Cli::try_parse_from(["loragate", "serve", "--worker", "http://u:hunter2@h:1"]).expect_err("creds");
        assert!(!secret.to_string().contains("hunter2"), "{secret}");
        let defaults = Cli::parse_from(["loragate", "serve"]);
        let Command::Serve(args) = defaults.command else { panic!("serve") };
        let config = args.into_config();
        assert_eq!(
            (config.worker_wait, config.max_workers, config.worker_failure_threshold),
            (Duration::from_secs(60), 256, 3)
        );
    }

    #[test]
    fn worker_needs_an_address_and_takes_the_engine_flags() {
        assert!(Cli::try_parse_from(["loragate", "worker"]).is_err(), "--grpc-addr is required");
        let cli = Cli::try_parse_from([
            "loragate",
            "worker",
            "--grpc-addr",
            "127.0.0.1:9001",
            "--adapter-root",
            "/a",
            "--max-batch-size",
            "8",
            "--max-num-batched-tokens",
            "96",
            "--device",
            "cpu",
        ])
        .expect("parses");
        let Command::Worker(args) = cli.command else { panic!("worker") };
        let settings = args.into_settings();
        assert_eq!(settings.grpc_addr, "127.0.0.1:9001".parse().expect("address"));
        assert_eq!(settings.engine.max_batch_size, 8);
        assert_eq!(settings.engine.max_num_batched_tokens, Some(96));
        assert_eq!(settings.adapter_root.as_deref(), Some(std::path::Path::new("/a")));
        assert!(matches!(settings.model, ModelSource::Demo { .. }));
    }

    #[test]
    fn tinker_flags_reach_the_tinker_front() {
        let Cli { command: Command::Serve(defaults) } = Cli::parse_from(["loragate", "serve"]) else { panic!("serve") };
        let defaults = defaults.into_config().tinker;
        assert_eq!((defaults.max_pause_wait, defaults.poll_hold), (Duration::from_secs(1800), Duration::from_secs(25)));
        let cli = Cli::try_parse_from([
            "loragate",
            "serve",
            "--tinker-max-pause-wait",
            "10m",
            "--tinker-max-pending",
            "7",
            "--tinker-poll-hold",
            "5s",
        ])
        .expect("parses");
        let Command::Serve(args) = cli.command else { panic!("serve") };
        let tinker = args.into_config().tinker;
        assert_eq!(tinker.max_pause_wait, Duration::from_secs(600));
        assert_eq!(tinker.retention.max_pending, 7);
        assert_eq!(tinker.poll_hold, Duration::from_secs(5));
    }

    #[test]
    fn demo_model_takes_an_output_directory() {
        let cli = Cli::try_parse_from(["loragate", "demo-model", "--out", "/tmp/demo"]).expect("parses");
        assert!(matches!(cli.command, Command::DemoModel { out } if out == std::path::Path::new("/tmp/demo")));
        assert!(Cli::try_parse_from(["loragate", "demo-model"]).is_err(), "--out is required");
    }
}
