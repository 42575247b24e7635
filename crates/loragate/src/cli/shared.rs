//! The flag groups `serve` and `worker` share, each declared once and each making one setting group: the gate's
//! deadline, admission limits, connection limits, keys, and how the model runs.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use loragate_core::{DEFAULT_MAX_HELD, DEFAULT_MAX_IN_FLIGHT, Key, Limits};
use loragate_engine::{DType, Device, EngineConfig, QuantizedWeights, StepTarget};
use loragate_net::ConnectionLimits;

use crate::byte_size_arg::parse_byte_size;
use crate::duration_arg::parse_duration;
use crate::model::ModelSource;
use crate::settings::{Authentication, GateDeadlines};

/// The gate's deadline: `serve`'s flag, which `worker` takes too.
#[derive(Debug, Args)]
pub struct GateArgs {
    /// The longest a sampling request waits at a paused adapter's gate (or a paused worker) before UNAVAILABLE /
    /// 503.
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub gate_max_wait: Duration,
}

impl GateArgs {
    /// The deadlines: this gate deadline, and the coordinator's default pause deadlines (`serve` sets those with
    /// flags of its own).
    pub fn deadlines(&self) -> GateDeadlines {
        GateDeadlines { gate_max_wait: self.gate_max_wait, ..GateDeadlines::default() }
    }
}

/// Admission limits over every adapter: `serve`'s flags, which `worker` takes too.
#[derive(Debug, Args)]
pub struct AdmissionArgs {
    /// The most sampling requests admitted at once (queued or running), over every adapter and the base model;
    /// more are refused with RESOURCE_EXHAUSTED / 429.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: u32,
    /// The most sampling requests held at paused adapters' gates at once; more are refused with
    /// RESOURCE_EXHAUSTED / 429.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_HELD)]
    pub max_held: u32,
}

impl AdmissionArgs {
    /// The limits: these, and no per-adapter cap (`serve` sets those with flags of its own).
    pub fn limits(&self) -> Limits {
        Limits { max_in_flight: self.max_in_flight, max_held: self.max_held, ..Limits::default() }
    }
}

/// Connection limits: `serve`'s flags, which `worker` takes too.
#[derive(Debug, Args)]
pub struct ConnectionArgs {
    /// The most connections open at once (over every listener); more wait to be accepted.
    #[arg(long, value_name = "N", default_value_t = loragate_net::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// How long a new connection may take to send its first complete request head before it is closed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// How long a connection may stay without a request in progress before it is closed (long-polls, held
    /// requests and streams are in progress).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
}

impl ConnectionArgs {
    /// The limits (one cap, shared by every listener given them).
    pub fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits::new(self.max_connections, self.header_read_timeout, self.idle_timeout)
    }
}

/// The API and admin keys: any one turns authentication on.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// Turns authentication on: this key may sample (send it as `Authorization: Bearer KEY`, on gRPC as
    /// `authorization` metadata). Health and metrics stay open.
    #[arg(long, value_name = "KEY", env = "LORAGATE_API_KEY", hide_env_values = true)]
    pub api_key: Option<Key>,
    /// Turns authentication on: this key may do everything (pause, resume, load, unload, and sample).
    #[arg(long, value_name = "KEY", env = "LORAGATE_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<Key>,
}

impl KeyArgs {
    /// The authentication: these keys, and no tenant keys (`serve` takes those with a flag of its own).
    pub fn authentication(self) -> Authentication {
        Authentication { api_key: self.api_key, admin_key: self.admin_key, tenant_keys: None }
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
    /// --max-batch-size (default: 80 on the CPU, 128 there for a GGUF file's weights kept quantized, 1024 on CUDA,
    /// raised to --max-batch-size + 16 if that is more; see docs/engine.md).
    #[arg(long, value_name = "N")]
    pub max_num_batched_tokens: Option<usize>,
    /// How much longer than a decode-only step a step that also prefills prompts may take, or `off`. The engine
    /// times its steps and fits what a step, a decode row and a prompt token cost (published as
    /// loragate_engine_step_cost_seconds); while sequences decode, each step gets only the prompt tokens (at least
    /// 16, at most what --max-num-batched-tokens leaves) that keep it within FACTOR times the decode-only step of the
    /// batch the waiting requests bring in, and the rest of the prompts go in the steps after; with nothing decoding
    /// prompts take the whole budget. So other adapters' inter-token gaps stay near their decode-only gaps while a
    /// swap's continuations or long prompts are prefilled. Why 1.5: the goal is another stream's largest gap
    /// within 2x its p99 during a swap, and 1.5 leaves a third of that for the fit's error on a busy machine, while a
    /// swap's 32 continuations, judged against the 33-row batch they rejoin, still get chunks near the full budget
    /// beside the rows left (smaller factors refill them more slowly). `off`: every step takes the whole token
    /// budget. See docs/engine.md.
    #[arg(long, value_name = "FACTOR", default_value = "1.5", value_parser = parse_step_slowdown)]
    pub max_step_slowdown: StepSlowdown,
    /// CPU threads for the engine's tensor operations (default: $RAYON_NUM_THREADS, else every core, as llama.cpp
    /// and vLLM use). Why every core: decoding reads every weight once per step, and one core reads them more
    /// slowly than two (SmolLM2-135M Q4_1 on a 2-core machine, one stream: 59-65 tok/s with 1 thread, 75 with 2);
    /// and the control plane stays responsive under full engine load, because the pool's workers sleep when they
    /// run out of work (32 streams on 2 cores, measured under other load: GET /v1/models p50 1.5 ms, p99 20.5 ms
    /// with 2 threads against 1.4 ms and 28.6 ms with 1). Lower it to keep cores for other work on the machine
    /// (see docs/engine.md).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub compute_threads: Option<u32>,
    /// Serve at most this many tokens of context (default: the model's own length). `--max-model-len` is vLLM's
    /// spelling.
    #[arg(long, visible_alias = "max-model-len", value_name = "TOKENS")]
    pub max_context_length: Option<u32>,
    /// The largest LoRA rank (`r`) an adapter may have; loads of larger ones are refused.
    #[arg(long, value_name = "RANK", default_value_t = EngineConfig::DEFAULT_MAX_LORA_RANK)]
    pub max_lora_rank: usize,
    /// The largest adapter weights file (adapter_model.safetensors) accepted, in bytes (1073741824 is 1 GiB).
    #[arg(long, value_name = "BYTES", default_value_t = EngineConfig::DEFAULT_MAX_ADAPTER_BYTES)]
    pub max_adapter_bytes: u64,
    /// How long reading and checking one adapter may take before its load fails (installing nothing).
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub adapter_load_timeout: Duration,
    /// How a GGUF file's quantized weights are multiplied: `quantized` (kept in their block format: least memory,
    /// fastest decoding), `dequantized` (to --dtype at load: dense GEMMs everywhere), or `hybrid[:N]` (both:
    /// quantized below N input rows, dense from N rows on — prefill —; N is 64 when left out). On CUDA the matrices
    /// are always dequantized (`hybrid` is refused there).
    #[arg(long, value_name = "MODE", default_value = "quantized")]
    pub quantized_weights: QuantizedWeights,
    /// The size of the paged KV cache, every cached position of every sequence (`4GiB`, `512MiB`, `4GB`, or
    /// bytes; vLLM's flag). Default: a quarter of the memory the machine has available, at most 4 GiB, and no more
    /// than every place of the batch holding a whole context; on a CPU it is only used as blocks are first
    /// written, on CUDA it is allocated at once. A full cache preempts the newest sequence (recomputed later); the
    /// served context never exceeds what it holds. See docs/engine.md.
    #[arg(long, value_name = "BYTES", value_parser = parse_byte_size)]
    pub kv_cache_memory_bytes: Option<u64>,
    /// Reuse the cached keys and values of a prompt prefix earlier requests computed — GRPO groups, multi-turn
    /// conversations, continuations — named by adapter version and `cache_salt` (on by default; vLLM's flag).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Compute every prompt whole: no prefix reuse.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Where the demo model is generated and cached (default: $LORAGATE_CACHE_DIR, $XDG_CACHE_HOME/loragate or
    /// ~/.cache/loragate).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

/// `--max-step-slowdown`: a factor, or `off` (`None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepSlowdown(pub Option<StepTarget>);

fn parse_step_slowdown(text: &str) -> Result<StepSlowdown, String> {
    if text.trim().eq_ignore_ascii_case("off") {
        return Ok(StepSlowdown(None));
    }
    text.parse().map(|target| StepSlowdown(Some(target)))
}

impl EngineArgs {
    /// The CPU threads for tensor operations: --compute-threads, else its default (see
    /// [`default_compute_threads`](crate::default_compute_threads)).
    pub fn compute_threads(&self) -> usize {
        self.compute_threads.map_or_else(crate::compute_threads::default_compute_threads, |threads| threads as usize)
    }

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
            kv_cache_memory_bytes: self.kv_cache_memory_bytes,
            enable_prefix_caching: !self.no_enable_prefix_caching,
            max_step_slowdown: self.max_step_slowdown.0,
        }
    }

    /// The model: `path`, or the demo model cached in --cache-dir.
    pub(crate) fn model_source(&self, path: Option<PathBuf>) -> ModelSource {
        match path {
            Some(path) => ModelSource::Path(path),
            None => ModelSource::Demo {
                cache_dir: self.cache_dir.clone().unwrap_or_else(loragate_engine::default_cache_dir),
            },
        }
    }
}
