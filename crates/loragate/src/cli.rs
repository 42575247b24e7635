//! The command line: `loragate serve`, `loragate worker` and `loragate demo-model`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use loragate_core::{AdapterName, Key, Limits};
use loragate_engine::EngineConfig;

use crate::agent::AgentSettings;
use crate::duration_arg::parse_duration;
use crate::listen_addr::{parse_host, parse_listen_addr};
use crate::logging::LogFormat;
use crate::model::InitialAdapter;
use crate::serve::ServeConfig;
use crate::settings::{AdapterSettings, Authentication, GateDeadlines};
use crate::state_dir::StateLocation;
use crate::worker::WorkerSettings;

mod serve_only;
mod shared;

pub use self::serve_only::{FleetArgs, TinkerArgs};
pub use self::shared::{AdmissionArgs, ConnectionArgs, EngineArgs, GateArgs, KeyArgs};

/// loragate: swap LoRA adapter weights while rollouts keep sampling, safely and per adapter.
#[derive(Debug, Parser)]
#[command(name = "loragate", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// How log lines (on stderr) look: `text`, or `json` (one object per line). `RUST_LOG` filters them (`info`
    /// when unset).
    #[arg(long, value_name = "FORMAT", global = true, default_value = "text")]
    pub log_format: LogFormat,
    /// Logs one line per HTTP request and gRPC call (target `loragate_access`): method, path or RPC, status, gRPC
    /// status when the answer's head carries one, and the time until the response head (a stream's first byte).
    #[arg(long, global = true)]
    pub access_log: bool,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a model and its LoRA adapters over gRPC and HTTP (the built-in demo model when no --model is given).
    Serve(Box<ServeArgs>),
    /// Serve the model over vLLM's own gRPC protocol (vllm.Inference, vllm.Control, grpc.health.v1) as one worker
    /// of a fleet behind `loragate serve --worker URL` (the built-in demo model when no --model is given).
    Worker(Box<WorkerArgs>),
    /// Receive pushed adapter versions beside a vLLM or SGLang HTTP worker and write them under a directory it
    /// loads from (`DIR/NAME@V/`): the sidecar a fleet coordinator pushes to when the worker's address names it
    /// (`vllm+http://HOST:PORT?agent=HOST:PORT`).
    Agent(AgentArgs),
    /// Write the demo base model (Hugging Face format) and its `meow` and `woof` adapters (PEFT format) to a
    /// directory: DIR/model/, DIR/adapters/meow/, DIR/adapters/woof/. They are copied from the demo cache `serve`
    /// uses (`$LORAGATE_CACHE_DIR`, else `$XDG_CACHE_HOME/loragate` or `~/.cache/loragate`), generated there first
    /// if it has no copy; the generation is deterministic, so every copy is the same bytes.
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
    /// Address of the gRPC server (LoraControl, Sampler, health, reflection); HOST is an IP address or a host name
    /// (default: 127.0.0.1:50051, or --host and --grpc-port).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen_addr, conflicts_with_all = ["host", "grpc_port"])]
    pub grpc_addr: Option<SocketAddr>,
    /// Address of the HTTP server (OpenAI- and SkyRL-compatible endpoints, metrics); HOST is an IP address or a
    /// host name (default: 127.0.0.1:8000, or --host and --port).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen_addr, conflicts_with_all = ["host", "port"])]
    pub http_addr: Option<SocketAddr>,
    /// The host both servers listen on, an IP address or a host name (vLLM's spelling; 0.0.0.0 for every interface;
    /// default: 127.0.0.1).
    #[arg(long, value_name = "HOST", value_parser = parse_host)]
    pub host: Option<IpAddr>,
    /// The HTTP server's port (vLLM's spelling; default: 8000).
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// The gRPC server's port (default: 50051).
    #[arg(long, value_name = "PORT")]
    pub grpc_port: Option<u16>,
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
    /// vLLM's spelling of --adapter: one or more NAME=DIR (or vLLM's JSON form {"name": NAME, "path": DIR}) after
    /// one flag. Loaded after the --adapter ones.
    #[arg(long, value_name = "NAME=DIR", num_args = 1.., value_parser = parse_lora_module)]
    pub lora_modules: Vec<InitialAdapter>,
    /// The only directory LoadLoraAdapter may read adapters from (paths outside it, `..` escapes and symlinks out
    /// of it are refused). Default for the demo: its adapters directory; otherwise loading by path is disabled.
    #[arg(long, value_name = "DIR")]
    pub adapter_root: Option<PathBuf>,
    /// How many versions of each adapter stay loaded and servable to exact pins (`lora_name` / `model` = NAME@V):
    /// the current one and N − 1 older ones, released oldest first (a version still running a pinned request is
    /// released when it ends). 1 keeps only the current version.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub retain_versions: u32,
    /// The most LoRA adapters loaded at once (vLLM's name, as `worker --max-loras`): a load under a new name past it
    /// is refused (gRPC RESOURCE_EXHAUSTED, HTTP 429) until one is unloaded; reloads of a loaded name are not
    /// (default: no limit). Adapters the state puts back at start count but are never refused.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_loras: Option<u64>,
    /// Accepted for vLLM's command lines; it does nothing: loragate keeps no CPU-side cache of adapters to swap in
    /// (every loaded adapter stays resident until unloaded; pushed versions are kept on disk in the state directory).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_cpu_loras: Option<u64>,
    /// Accepted for vLLM's command lines; it does nothing: LoRA is always on.
    #[arg(long)]
    pub enable_lora: bool,
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
    /// The workers to front instead of the in-process engine.
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// The gate's deadline (shared with `worker`).
    #[command(flatten)]
    pub gate: GateArgs,
    /// Admission limits (shared with `worker`).
    #[command(flatten)]
    pub admission: AdmissionArgs,
    /// Connection limits (shared with `worker`).
    #[command(flatten)]
    pub connections: ConnectionArgs,
    /// The most sampling requests admitted at once for any one adapter (default: only --max-in-flight applies).
    #[arg(long, value_name = "N")]
    pub max_in_flight_per_adapter: Option<u32>,
    /// The most sampling requests held at any one adapter's gate (default: only --max-held applies).
    #[arg(long, value_name = "N")]
    pub max_held_per_adapter: Option<u32>,
    /// The API and admin keys (shared with `worker`).
    #[command(flatten)]
    pub keys: KeyArgs,
    /// Turns authentication on with per-tenant keys: a JSON file mapping each key to
    /// {"adapters": [names or prefixes like "team-a/*"], "control": bool, "paths": [directories under
    /// --adapter-root it may load from; by default its adapter patterns]} (see docs/security.md).
    #[arg(long, value_name = "FILE")]
    pub tenant_keys: Option<PathBuf>,
    /// Where loaded adapters, their versions and pauses are recorded, so that a restart puts them back: a directory
    /// (default: $XDG_STATE_HOME/loragate/<served-name>, else ~/.local/state/loragate/<served-name>), or `none` to
    /// keep them in memory only. Remove the directory to start fresh (see docs/state.md).
    #[arg(long, value_name = "DIR|none", value_parser = StateLocation::parse)]
    pub state_dir: Option<StateLocation>,
    /// How often the stats line is logged (throughput, running, waiting, held and kept requests, paused adapters),
    /// in seconds; 0 turns it off. At INFO while there is activity, at DEBUG when idle.
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = parse_duration)]
    pub log_stats_interval: Duration,
    /// Shares adapters, versions and pauses with every other coordinator started with the same URL, through etcd: a
    /// pause, resume, load or unload on any of them holds on all (see docs/state.md). Nothing is kept in a state
    /// directory then.
    #[arg(long, value_name = "etcd://HOST:PORT[,HOST:PORT…]/PREFIX", value_parser = parse_shared_state, conflicts_with = "state_dir")]
    pub state: Option<StateLocation>,
    /// With --state: the TTL of this replica's registration in etcd, which it renews every third of it. A replica
    /// that dies stops counting once it runs out: pauses no longer wait for it and ListReplicas drops it. Whole
    /// seconds, at least 2 (etcd's shortest lease); a pause waits --abort-ack-timeout plus this for the replicas.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_replica_lease, requires = "state")]
    pub replica_lease: Duration,
    /// The Tinker API front.
    #[command(flatten)]
    pub tinker: TinkerArgs,
    /// How the model runs in-process (with --worker, only --max-context-length and --cache-dir apply).
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `loragate agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Where pushed versions are written, as DIR/NAME@V/ (created if missing; the worker beside it must be able to
    /// read it).
    #[arg(long, value_name = "DIR")]
    pub adapter_dir: PathBuf,
    /// Address of the HTTP server taking `PUT /v1/lora_adapters/{name}`; HOST is an IP address or a host name.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen_addr)]
    pub http_addr: SocketAddr,
    /// The key every call must present as `Authorization: Bearer KEY` (the fleet coordinator's --worker-key);
    /// without it, anyone who reaches the port may write adapters into the directory.
    #[arg(long, value_name = "KEY", env = "LORAGATE_API_KEY", hide_env_values = true)]
    pub api_key: Option<Key>,
    /// The largest adapter weights file (adapter_model.safetensors) accepted, in bytes (1073741824 is 1 GiB).
    #[arg(long, value_name = "BYTES", default_value_t = EngineConfig::DEFAULT_MAX_ADAPTER_BYTES)]
    pub max_adapter_bytes: u64,
}

impl AgentArgs {
    /// The agent these arguments describe.
    pub fn into_settings(self) -> AgentSettings {
        AgentSettings {
            http_addr: self.http_addr,
            adapter_dir: self.adapter_dir,
            api_key: self.api_key,
            max_adapter_bytes: self.max_adapter_bytes,
        }
    }
}

/// `loragate worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Address of the gRPC server (vllm.Inference, vllm.Control, grpc.health.v1); HOST is an IP address or a host
    /// name. Required, or --grpc-port (with --host).
    #[arg(
        long,
        value_name = "HOST:PORT",
        value_parser = parse_listen_addr,
        required_unless_present = "grpc_port",
        conflicts_with_all = ["host", "grpc_port"]
    )]
    pub grpc_addr: Option<SocketAddr>,
    /// The host the gRPC server listens on, an IP address or a host name (vLLM's spelling; 0.0.0.0 for every
    /// interface; default: 127.0.0.1), with --grpc-port.
    #[arg(long, value_name = "HOST", value_parser = parse_host, requires = "grpc_port")]
    pub host: Option<IpAddr>,
    /// The gRPC server's port (the spelling of vLLM's Rust frontend, `vllm-rs serve --grpc-port`).
    #[arg(long, value_name = "PORT")]
    pub grpc_port: Option<u16>,
    /// Address of an HTTP server for `GET /metrics` (the worker's coordinator's metrics, as `serve` serves them;
    /// open, like `serve`'s); HOST is an IP address or a host name. Without it, the worker serves no HTTP.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen_addr)]
    pub http_addr: Option<SocketAddr>,
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
    /// The most LoRA adapters loaded at once (vLLM's name); more LoadLora calls are refused with
    /// RESOURCE_EXHAUSTED until one is unloaded (default: no limit).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_loras: Option<u64>,
    /// Let the Shutdown RPC stop the worker (with keys, it needs the admin key); without this flag it is refused.
    #[arg(long)]
    pub enable_shutdown_rpc: bool,
    /// The gate's deadline, as `serve` takes it.
    #[command(flatten)]
    pub gate: GateArgs,
    /// Admission limits, as `serve` takes them.
    #[command(flatten)]
    pub admission: AdmissionArgs,
    /// Connection limits, as `serve` takes them.
    #[command(flatten)]
    pub connections: ConnectionArgs,
    /// The keys: the API key may call vllm.Inference, the admin key everything (the coordinator's --worker-key).
    #[command(flatten)]
    pub keys: KeyArgs,
    /// How the model runs.
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl WorkerArgs {
    /// The worker these arguments describe.
    pub fn into_settings(self) -> WorkerSettings {
        let host = self.host.unwrap_or(IpAddr::from([127, 0, 0, 1]));
        // clap requires --grpc-addr or --grpc-port; port 0 (any free port) is what neither would mean.
        let grpc_addr = self.grpc_addr.unwrap_or_else(|| SocketAddr::new(host, self.grpc_port.unwrap_or(0)));
        WorkerSettings {
            grpc_addr,
            http_addr: self.http_addr,
            model: self.engine.model_source(self.model),
            served_model_name: self.served_model_name,
            adapter_root: self.adapter_root,
            deadlines: self.gate.deadlines(),
            limits: self.admission.limits(),
            connections: self.connections.connection_limits(),
            authentication: self.keys.authentication(),
            max_loras: self.max_loras.map(|max| usize::try_from(max).unwrap_or(usize::MAX)),
            enable_shutdown_rpc: self.enable_shutdown_rpc,
            engine: self.engine.engine_config(),
        }
    }
}

impl ServeArgs {
    /// The server configuration these arguments describe.
    pub fn into_config(self) -> ServeConfig {
        let model = self.engine.model_source(self.model);
        let host = self.host.unwrap_or(IpAddr::from([127, 0, 0, 1]));
        let mut initial = self.adapters;
        initial.extend(self.lora_modules);
        ServeConfig {
            grpc_addr: self.grpc_addr.unwrap_or_else(|| SocketAddr::new(host, self.grpc_port.unwrap_or(50051))),
            http_addr: self.http_addr.unwrap_or_else(|| SocketAddr::new(host, self.port.unwrap_or(8000))),
            model,
            served_model_name: self.served_model_name,
            adapters: AdapterSettings {
                initial,
                root: self.adapter_root,
                retain_versions: usize::try_from(self.retain_versions).unwrap_or(1),
                max_loras: self.max_loras.map(|max| usize::try_from(max).unwrap_or(usize::MAX)),
            },
            deadlines: GateDeadlines {
                abort_ack_timeout: self.abort_ack_timeout,
                max_pause_drain: self.max_pause_drain,
                ..self.gate.deadlines()
            },
            shutdown_grace: self.shutdown_grace,
            limits: Limits {
                max_in_flight_per_adapter: self.max_in_flight_per_adapter,
                max_held_per_adapter: self.max_held_per_adapter,
                ..self.admission.limits()
            },
            connections: self.connections.connection_limits(),
            authentication: Authentication { tenant_keys: self.tenant_keys, ..self.keys.authentication() },
            engine: self.engine.engine_config(),
            fleet: self.fleet.into_settings(),
            state: self.state.or(self.state_dir).unwrap_or(StateLocation::UserDefault),
            replica_lease: self.replica_lease,
            log_stats_interval: (!self.log_stats_interval.is_zero()).then_some(self.log_stats_interval),
            tinker: self.tinker.tinker_config(),
            engine_layer: None,
        }
    }
}

/// Parses `--replica-lease`: a duration of whole seconds, at least 2 (etcd raises shorter leases to its minimum, and
/// counts leases in seconds).
fn parse_replica_lease(raw: &str) -> Result<Duration, String> {
    let lease = parse_duration(raw)?;
    if lease < Duration::from_secs(2) || lease.subsec_nanos() != 0 {
        return Err(format!("{raw:?}: a replica's lease is whole seconds, at least 2s (etcd's shortest lease)"));
    }
    Ok(lease)
}

/// Parses `--state`.
fn parse_shared_state(raw: &str) -> Result<StateLocation, String> {
    loragate_etcd::EtcdUrl::parse(raw).map(StateLocation::Shared).map_err(|err| err.to_string())
}

fn parse_initial_adapter(raw: &str) -> Result<InitialAdapter, String> {
    let (name, dir) = raw.split_once('=').ok_or_else(|| format!("{raw:?} is not NAME=DIR"))?;
    initial_adapter(raw, name, dir)
}

fn initial_adapter(raw: &str, name: &str, dir: &str) -> Result<InitialAdapter, String> {
    let name = AdapterName::parse(name).map_err(|err| err.to_string())?;
    if dir.is_empty() {
        return Err(format!("{raw:?} names no directory"));
    }
    Ok(InitialAdapter { name, dir: PathBuf::from(dir) })
}

/// Parses one `--lora-modules` value: NAME=DIR, or vLLM's JSON `{"name": NAME, "path": DIR}` (its
/// `base_model_name` is accepted and must be the only other field).
fn parse_lora_module(raw: &str) -> Result<InitialAdapter, String> {
    if !raw.trim_start().starts_with('{') {
        return parse_initial_adapter(raw);
    }
    let object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(raw).map_err(|err| format!("{raw:?} is not NAME=DIR nor a JSON object: {err}"))?;
    if let Some(unknown) = object.keys().find(|key| !["name", "path", "base_model_name"].contains(&key.as_str())) {
        return Err(format!("{raw:?}: unknown field {unknown:?} (expected name, path, base_model_name)"));
    }
    let text = |field: &str| match object.get(field) {
        Some(serde_json::Value::String(value)) => Ok(value.as_str()),
        _ => Err(format!("{raw:?}: {field:?} must be a string")),
    };
    initial_adapter(raw, text("name")?, text("path")?)
}

#[cfg(test)]
mod tests;
