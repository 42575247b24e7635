//! How an engine runs: device, dtype, batch and step limits, quantized weights, the KV cache.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::EngineLoadError;
use crate::scheduler::{StepCostModel, StepLimits, StepTarget};

/// Where the model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The CPU (always available).
    #[default]
    Cpu,
    /// The NVIDIA GPU with this ordinal; needs a build with the `cuda` feature.
    Cuda(usize),
}

impl Device {
    /// The candle device, or [`EngineLoadError::Device`] if this build or machine cannot provide it.
    pub(crate) fn open(self) -> Result<candle_core::Device, EngineLoadError> {
        match self {
            Self::Cpu => Ok(candle_core::Device::Cpu),
            Self::Cuda(ordinal) if cfg!(feature = "cuda") => candle_core::Device::new_cuda(ordinal)
                .map_err(|err| EngineLoadError::Device(format!("cuda:{ordinal}: {err}"))),
            Self::Cuda(ordinal) => Err(EngineLoadError::Device(format!(
                "cuda:{ordinal} was asked for, but this build has no CUDA support (rebuild with `--features cuda`)"
            ))),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

/// A device string that is none of `cpu`, `cuda`, `cuda:N`.
#[derive(Debug, thiserror::Error)]
#[error("unknown device {0:?} (expected cpu, cuda or cuda:N)")]
pub struct ParseDeviceError(String);

impl FromStr for Device {
    type Err = ParseDeviceError;

    /// Parses `cpu`, `cuda` (GPU 0) or `cuda:N`.
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|ordinal| ordinal.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| ParseDeviceError(raw.to_owned())),
        }
    }
}

/// The floating-point type of weights and activations. Logits are always turned into `f32` before sampling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DType {
    /// 32-bit floats (the default; the only choice on the CPU).
    #[default]
    F32,
    /// bfloat16 (CUDA only).
    Bf16,
    /// IEEE half precision (CUDA only).
    F16,
}

impl DType {
    /// The candle dtype, checked against the device: the CPU runs `f32` only (on a CPU without AVX-512 BF16,
    /// candle's half-precision matmuls are slower than f32: see `docs/benchmarks.md`; some of its kernels lack them).
    pub(crate) fn for_device(self, device: &candle_core::Device) -> Result<candle_core::DType, EngineLoadError> {
        let dtype = match self {
            Self::F32 => candle_core::DType::F32,
            Self::Bf16 => candle_core::DType::BF16,
            Self::F16 => candle_core::DType::F16,
        };
        if device.is_cpu() && dtype != candle_core::DType::F32 {
            return Err(EngineLoadError::DType(format!("{self} needs a CUDA device; the CPU runs f32")));
        }
        Ok(dtype)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        })
    }
}

/// A dtype string that is none of `f32`, `bf16`, `f16`.
#[derive(Debug, thiserror::Error)]
#[error("unknown dtype {0:?} (expected f32, bf16 or f16)")]
pub struct ParseDTypeError(String);

impl FromStr for DType {
    type Err = ParseDTypeError;

    /// Parses `f32`/`float32`, `bf16`/`bfloat16`, `f16`/`float16`.
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f16" | "float16" => Ok(Self::F16),
            _ => Err(ParseDTypeError(raw.to_owned())),
        }
    }
}

/// How the quantized weight matrices of a GGUF file are multiplied (a Hugging Face directory's weights, and a GGUF
/// file's `F32`/`F16`/`BF16` matrices, are dense either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QuantizedWeights {
    /// Kept in their block format and multiplied as such, the inputs quantized to 8 bits per block as llama.cpp
    /// does: the least memory, and the fastest decoding, which is bound by memory bandwidth. On the CPU only (on
    /// CUDA they are dequantized).
    #[default]
    Quantized,
    /// Dequantized to the engine's dtype at load: dense GEMMs everywhere, and 4–8× the memory of the file at f32.
    Dequantized,
    /// Both: quantized for inputs of fewer than `dense_from_rows` rows (decode steps), dense for more (prefill),
    /// where a dense GEMM is faster than quantized dot products; the memory of both. On the CPU only (refused on
    /// CUDA, where every matrix is dense).
    Hybrid {
        /// The fewest input rows multiplied by the dense copy.
        dense_from_rows: usize,
    },
}

impl QuantizedWeights {
    /// The row count from which [`QuantizedWeights::Hybrid`] multiplies densely unless told otherwise: prefill
    /// chunks, not decode batches. (Before the tiled kernel a dense GEMM overtook it between 32 and 64 rows on the
    /// 2-core machine of `docs/benchmarks.md`; now the quantized kernel is faster there too.)
    pub const DEFAULT_DENSE_FROM_ROWS: usize = 64;
}

impl fmt::Display for QuantizedWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Quantized => f.write_str("quantized"),
            Self::Dequantized => f.write_str("dequantized"),
            Self::Hybrid { dense_from_rows } => write!(f, "hybrid:{dense_from_rows}"),
        }
    }
}

/// A quantized-weights setting that is none of `quantized`, `dequantized`, `hybrid`, `hybrid:N`.
#[derive(Debug, thiserror::Error)]
#[error("unknown quantized-weights setting {0:?} (expected quantized, dequantized, hybrid or hybrid:N with N ≥ 1)")]
pub struct ParseQuantizedWeightsError(String);

impl FromStr for QuantizedWeights {
    type Err = ParseQuantizedWeightsError;

    /// Parses `quantized`, `dequantized`, `hybrid` (dense from [`Self::DEFAULT_DENSE_FROM_ROWS`] rows) or
    /// `hybrid:N`.
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let error = || ParseQuantizedWeightsError(raw.to_owned());
        match raw.trim().to_ascii_lowercase().as_str() {
            "quantized" => Ok(Self::Quantized),
            "dequantized" => Ok(Self::Dequantized),
            "hybrid" => Ok(Self::Hybrid { dense_from_rows: Self::DEFAULT_DENSE_FROM_ROWS }),
            other => match other.strip_prefix("hybrid:").map(str::parse::<usize>) {
                Some(Ok(rows)) if rows > 0 => Ok(Self::Hybrid { dense_from_rows: rows }),
                _ => Err(error()),
            },
        }
    }
}

/// How a [`crate::CandleEngine`] runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Where the model runs.
    pub device: Device,
    /// The weights' and activations' type.
    pub dtype: DType,
    /// The most sequences decoded together in one step (a started prompt's sequences count from the start of its
    /// prefill). Requests beyond it wait, served round-robin over adapters and first come first served within one (a
    /// request with more samples than this still runs, alone).
    pub max_batch_size: usize,
    /// The most tokens one engine step runs (vLLM's `max_num_batched_tokens`): the next token of every decoding
    /// sequence, then chunks of prompts up to this budget, so a long prompt is prefilled over several steps while
    /// every stream keeps decoding. Smaller keeps other streams' inter-token latency low while prompts arrive (a step
    /// costs at most this many tokens' work); larger prefills prompts with fewer, more efficient passes. Must exceed
    /// `max_batch_size`. `None`: [`EngineConfig::DEFAULT_MAX_NUM_BATCHED_TOKENS_CPU`] (or
    /// [`EngineConfig::DEFAULT_MAX_NUM_BATCHED_TOKENS_CPU_QUANTIZED`] for weights multiplied quantized) or
    /// [`EngineConfig::DEFAULT_MAX_NUM_BATCHED_TOKENS_CUDA`] for the device (raised to `max_batch_size` +
    /// [`EngineConfig::MIN_PREFILL_TOKENS_PER_STEP`] if that is more).
    pub max_num_batched_tokens: Option<usize>,
    /// Serve at most this many tokens of context, below the model's `max_position_embeddings` (a real checkpoint's
    /// 128k context is rarely what a CPU or a small GPU should promise). `None` serves the model's full length.
    pub max_context_length: Option<u32>,
    /// The largest LoRA rank (`r`) an adapter may have: its rank columns are multiplied for every row of every
    /// batch it joins, and its weights grow with it.
    pub max_lora_rank: usize,
    /// The largest `adapter_model.safetensors` accepted, in bytes.
    pub max_adapter_bytes: u64,
    /// How long reading and checking one adapter may take; past it the load fails and installs nothing.
    pub adapter_load_timeout: Duration,
    /// How a GGUF file's quantized weight matrices are multiplied.
    pub quantized_weights: QuantizedWeights,
    /// The bytes of the paged KV cache (vLLM's `kv_cache_memory_bytes`): its blocks of
    /// [`EngineConfig::KV_BLOCK_SIZE`] positions are taken from one pool of this size, allocated at start.
    /// `None`: [`EngineConfig::default_kv_cache_bytes`] for the machine and the model.
    pub kv_cache_memory_bytes: Option<u64>,
    /// Whether requests reuse the cached keys and values of a prefix they share with earlier requests (vLLM's
    /// `enable_prefix_caching`): full blocks named by their adapter, its version, the request's cache salt and
    /// every token up to them.
    pub enable_prefix_caching: bool,
    /// How much longer than a decode-only step of the batch a step with prompt chunks may take
    /// (`--max-step-slowdown`): the engine times its steps, fits what a decode row and a prompt token cost, and
    /// gives each step only the prompt tokens that keep it within this many times the decode-only step of the batch
    /// the queued requests bring in; the rest of the prompts go in the steps after. So other tenants' inter-token
    /// gaps stay near their decode-only gaps while prompts (a swap's continuations) arrive. `None`: every step takes
    /// the whole token budget ([`EngineConfig::max_num_batched_tokens`]).
    pub max_step_slowdown: Option<StepTarget>,
}

impl EngineConfig {
    /// The default [`EngineConfig::max_lora_rank`].
    pub const DEFAULT_MAX_LORA_RANK: usize = 64;
    /// The default [`EngineConfig::max_adapter_bytes`]: 1 GiB.
    pub const DEFAULT_MAX_ADAPTER_BYTES: u64 = 1 << 30;
    /// The default [`EngineConfig::adapter_load_timeout`].
    pub const DEFAULT_ADAPTER_LOAD_TIMEOUT: Duration = Duration::from_secs(120);
    /// The default step budget on the CPU for dense weights: a step with a full prefill chunk costs about two
    /// decode steps of a 135M model's full batch on two cores, and stays under the one-second gap that other tenants
    /// may see (measured: see `docs/engine.md`). It equals `max_batch_size + MIN_PREFILL_TOKENS_PER_STEP` at the
    /// default batch size.
    pub const DEFAULT_MAX_NUM_BATCHED_TOKENS_CPU: usize = 80;
    /// The default step budget on the CPU for weights multiplied quantized (a GGUF file's, without dense copies):
    /// their prefill chunks cost less per token, so a step with a full chunk of 128 costs about three decode steps
    /// of a 135M model's 33-row batch, well under the one-second gap, and a swap's continuations refill within 2×
    /// one batch's time, which at 80 they did not (measured: see `docs/engine.md`).
    pub const DEFAULT_MAX_NUM_BATCHED_TOKENS_CPU_QUANTIZED: usize = 128;
    /// The default step budget on CUDA: measured on an H200 (`docs/benchmarks.md`, CUDA), a step with a full
    /// 1,024-token chunk beside 16 decoding streams costs about 4 decode steps (4.2 on a model of Llama-3.2-1B's
    /// shape, 4.3 on SmolLM2-135M's, bf16) and prefills within 2–4 % of 2,048's speed, whose steps cost 6.4–7.7.
    pub const DEFAULT_MAX_NUM_BATCHED_TOKENS_CUDA: usize = 1024;
    /// What a default step budget leaves for prompts at least, beside a full batch of decoding sequences.
    pub const MIN_PREFILL_TOKENS_PER_STEP: usize = 16;
    /// Positions per block of the paged KV cache (see `docs/engine.md` for why 16).
    pub const KV_BLOCK_SIZE: usize = crate::model::BLOCK_SIZE;
    /// The largest default KV cache: 4 GiB.
    pub const MAX_DEFAULT_KV_CACHE_BYTES: u64 = 4 << 30;
    /// The default KV cache when the machine's available memory cannot be read: 1 GiB.
    pub const FALLBACK_KV_CACHE_BYTES: u64 = 1 << 30;

    /// The default size of the KV cache, for a model whose cached positions take `bytes_per_position` each, served
    /// with `context_length` positions per sequence: a quarter of the memory the machine has available
    /// (`available_bytes`, `MemAvailable` on Linux; [`Self::FALLBACK_KV_CACHE_BYTES`] when unknown), at most
    /// [`Self::MAX_DEFAULT_KV_CACHE_BYTES`], and no more than every place of the batch (`max_batch_size`, at least
    /// 64) holding a whole context. A quarter leaves the weights, the activations and the rest of the machine their
    /// room; on a CPU the memory is only used as blocks are first written. On CUDA the pool is allocated on the device
    /// at once and the host's memory says nothing of it: the cap applies, and a larger GPU should be given its size.
    pub fn default_kv_cache_bytes(
        available_bytes: Option<u64>,
        bytes_per_position: usize,
        context_length: usize,
        max_batch_size: usize,
    ) -> u64 {
        let share = available_bytes.map_or(Self::FALLBACK_KV_CACHE_BYTES, |available| available / 4);
        let whole_batch = (bytes_per_position as u64)
            .saturating_mul(context_length as u64)
            .saturating_mul(max_batch_size.max(64) as u64);
        share.min(Self::MAX_DEFAULT_KV_CACHE_BYTES).min(whole_batch)
    }

    /// The machine's available memory (`MemAvailable` in `/proc/meminfo`), if it can be read.
    pub fn available_memory_bytes() -> Option<u64> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = meminfo.lines().find(|line| line.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    }

    /// The blocks of the KV cache for a model whose cached positions take `bytes_per_position` each, served with
    /// `context_length` positions (block 0, kept zero for padding, among them). An explicit size that holds no
    /// block besides it is an [`EngineLoadError::Settings`] naming the flag.
    pub(crate) fn kv_cache_blocks(
        &self,
        bytes_per_position: usize,
        context_length: usize,
    ) -> Result<usize, EngineLoadError> {
        let block_bytes = (bytes_per_position * Self::KV_BLOCK_SIZE) as u64;
        let bytes = self.kv_cache_memory_bytes.unwrap_or_else(|| {
            Self::default_kv_cache_bytes(
                Self::available_memory_bytes(),
                bytes_per_position,
                context_length,
                self.max_batch_size,
            )
        });
        let blocks = usize::try_from(bytes / block_bytes.max(1)).unwrap_or(usize::MAX);
        if blocks < 2 {
            return Err(EngineLoadError::Settings(format!(
                "kv_cache_memory_bytes (--kv-cache-memory-bytes) {bytes} holds no block of {} positions ({block_bytes} \
                 bytes for this model)",
                Self::KV_BLOCK_SIZE
            )));
        }
        Ok(blocks)
    }

    /// How a GGUF file's quantized matrices are multiplied on this config's device. On the CPU, as asked. On CUDA they
    /// are always dequantized to the dtype (the quantized kernels are the CPU's): the default `quantized` becomes
    /// `dequantized`, and `hybrid`, which asks for the CPU's quantized kernel beside a dense copy, is an
    /// [`EngineLoadError::Settings`] naming the flag rather than a setting silently ignored.
    pub(crate) fn quantized_weights_on_device(&self) -> Result<QuantizedWeights, EngineLoadError> {
        match (self.device, self.quantized_weights) {
            (Device::Cpu, weights) => Ok(weights),
            (device, QuantizedWeights::Hybrid { .. }) => Err(EngineLoadError::Settings(format!(
                "quantized_weights (--quantized-weights) {} runs the CPU's quantized kernel for small inputs; on \
                 {device} a GGUF file's matrices are dequantized to the dtype: use `dequantized` (or the default)",
                self.quantized_weights
            ))),
            (Device::Cuda(_), _) => Ok(QuantizedWeights::Dequantized),
        }
    }

    /// The step limits these settings give on `device`, for a model whose weights are multiplied quantized only or
    /// not; an explicit step budget that does not exceed `max_batch_size` is an [`EngineLoadError::Settings`] (a full
    /// batch would leave no token for any prompt).
    pub(crate) fn step_limits(
        &self,
        device: &candle_core::Device,
        quantized_only: bool,
    ) -> Result<StepLimits, EngineLoadError> {
        let max_batch_size = self.max_batch_size.max(1);
        let max_num_batched_tokens = match self.max_num_batched_tokens {
            Some(tokens) if tokens <= max_batch_size => {
                return Err(EngineLoadError::Settings(format!(
                    "max_num_batched_tokens ({tokens}) must exceed max_batch_size ({max_batch_size}): every step runs \
                     one token of each decoding sequence first, and a prompt needs room beside them"
                )));
            }
            Some(tokens) => tokens,
            None => {
                let device_default = if device.is_cuda() {
                    Self::DEFAULT_MAX_NUM_BATCHED_TOKENS_CUDA
                } else if quantized_only {
                    Self::DEFAULT_MAX_NUM_BATCHED_TOKENS_CPU_QUANTIZED
                } else {
                    Self::DEFAULT_MAX_NUM_BATCHED_TOKENS_CPU
                };
                device_default.max(max_batch_size + Self::MIN_PREFILL_TOKENS_PER_STEP)
            }
        };
        let cost_prior = if device.is_cuda() { StepCostModel::gpu_prior() } else { StepCostModel::cpu_prior() };
        Ok(StepLimits { max_batch_size, max_num_batched_tokens, step_target: self.max_step_slowdown, cost_prior })
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            dtype: DType::F32,
            max_batch_size: 64,
            max_num_batched_tokens: None,
            max_context_length: None,
            max_lora_rank: Self::DEFAULT_MAX_LORA_RANK,
            max_adapter_bytes: Self::DEFAULT_MAX_ADAPTER_BYTES,
            adapter_load_timeout: Self::DEFAULT_ADAPTER_LOAD_TIMEOUT,
            quantized_weights: QuantizedWeights::default(),
            kv_cache_memory_bytes: None,
            enable_prefix_caching: true,
            max_step_slowdown: Some(StepTarget::DEFAULT),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print_back() {
        for (raw, device) in [("cpu", Device::Cpu), ("CUDA", Device::Cuda(0)), ("cuda:3", Device::Cuda(3))] {
            assert_eq!(raw.parse::<Device>().expect(raw), device);
        }
        assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
        for bad in ["gpu", "cuda:", "cuda:x", ""] {
            assert!(bad.parse::<Device>().is_err(), "{bad}");
        }
    }

    #[test]
    fn dtypes_parse_and_the_cpu_runs_f32_only() {
        assert_eq!("bfloat16".parse::<DType>().expect("bf16"), DType::Bf16);
        assert!("int8".parse::<DType>().is_err());
        let cpu = candle_core::Device::Cpu;
        assert_eq!(DType::F32.for_device(&cpu).expect("f32"), candle_core::DType::F32);
        assert!(matches!(DType::Bf16.for_device(&cpu), Err(EngineLoadError::DType(_))));
    }

    #[test]
    fn quantized_weight_settings_parse_and_print_back() {
        for (raw, setting) in [
            ("quantized", QuantizedWeights::Quantized),
            ("Dequantized", QuantizedWeights::Dequantized),
            ("hybrid", QuantizedWeights::Hybrid { dense_from_rows: QuantizedWeights::DEFAULT_DENSE_FROM_ROWS }),
            ("hybrid:128", QuantizedWeights::Hybrid { dense_from_rows: 128 }),
        ] {
            assert_eq!(raw.parse::<QuantizedWeights>().expect(raw), setting);
            assert_eq!(setting.to_string().parse::<QuantizedWeights>().expect("round trip"), setting);
        }
        for bad in ["q4", "hybrid:0", "hybrid:x", "hybrid:"] {
            assert!(bad.parse::<QuantizedWeights>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_step_budget_defaults_per_device_and_must_exceed_the_batch() {
        let cpu = candle_core::Device::Cpu;
        let limits = EngineConfig::default().step_limits(&cpu, false).expect("defaults");
        assert_eq!((limits.max_batch_size, limits.max_num_batched_tokens), (64, 80));
        let quantized = EngineConfig::default().step_limits(&cpu, true).expect("defaults, quantized");
        assert_eq!(quantized.max_num_batched_tokens, 128, "a GGUF file's weights kept quantized");
        let wide = EngineConfig { max_batch_size: 256, ..EngineConfig::default() };
        assert_eq!(wide.step_limits(&cpu, false).expect("wide").max_num_batched_tokens, 272, "room for prompts");
        let explicit = EngineConfig { max_num_batched_tokens: Some(65), ..EngineConfig::default() };
        assert_eq!(explicit.step_limits(&cpu, false).expect("explicit").max_num_batched_tokens, 65);
        let tight = EngineConfig { max_num_batched_tokens: Some(64), ..EngineConfig::default() };
        let err = tight.step_limits(&cpu, false).expect_err("no room for prompts");
        assert!(
            matches!(&err, EngineLoadError::Settings(reason) if reason.contains("max_num_batched_tokens")),
            "{err}"
        );
    }

    #[test]
    fn cuda_dequantizes_gguf_matrices_and_refuses_hybrid_by_name() {
        let on = |device, quantized_weights| EngineConfig { device, quantized_weights, ..EngineConfig::default() };
        let hybrid = QuantizedWeights::Hybrid { dense_from_rows: 64 };
        assert_eq!(on(Device::Cpu, hybrid).quantized_weights_on_device().expect("cpu"), hybrid);
        let cuda = Device::Cuda(0);
        for weights in [QuantizedWeights::Quantized, QuantizedWeights::Dequantized] {
            let applied = on(cuda, weights).quantized_weights_on_device().expect("cuda");
            assert_eq!(applied, QuantizedWeights::Dequantized);
        }
        let err = on(cuda, hybrid).quantized_weights_on_device().expect_err("hybrid on cuda");
        assert!(
            matches!(&err, EngineLoadError::Settings(reason) if reason.contains("--quantized-weights") && reason.contains("cuda:0")),
            "{err}"
        );
    }

    #[test]
    fn the_kv_cache_defaults_to_a_capped_quarter_of_the_available_memory() {
        let gib = 1u64 << 30;
        // SmolLM2-135M: 46,080 bytes per position, 8,192 positions.
        assert_eq!(EngineConfig::default_kv_cache_bytes(Some(8 * gib), 46_080, 8192, 64), 2 * gib, "a quarter");
        assert_eq!(EngineConfig::default_kv_cache_bytes(Some(64 * gib), 46_080, 8192, 64), 4 * gib, "capped");
        assert_eq!(EngineConfig::default_kv_cache_bytes(None, 46_080, 8192, 64), gib, "unknown memory");
        // The demo model (2 KiB per position, 4,096 positions): every place of the batch holding a whole context.
        assert_eq!(EngineConfig::default_kv_cache_bytes(Some(64 * gib), 2048, 4096, 8), 2048 * 4096 * 64);
        let config = EngineConfig { kv_cache_memory_bytes: Some(10 * 46_080 * 16), ..EngineConfig::default() };
        assert_eq!(config.kv_cache_blocks(46_080, 8192).expect("blocks"), 10);
        let tiny = EngineConfig { kv_cache_memory_bytes: Some(46_080 * 16), ..EngineConfig::default() };
        let err = tiny.kv_cache_blocks(46_080, 8192).expect_err("one block is only the zero block");
        assert!(err.to_string().contains("--kv-cache-memory-bytes"), "{err}");
        if cfg!(target_os = "linux") {
            assert!(EngineConfig::available_memory_bytes().is_some_and(|bytes| bytes > 0), "read on Linux");
        }
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_a_clear_error() {
        let err = Device::Cuda(0).open().expect_err("no cuda in this build");
        assert!(err.to_string().contains("--features cuda"), "{err}");
    }
}
