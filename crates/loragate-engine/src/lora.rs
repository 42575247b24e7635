//! LoRA: the seven adaptable projections, one adapter's weights, PEFT loading, and the per-row application to a
//! mixed batch.
//!
//! An adapted projection computes `y = x·Wᵀ + (x·Aᵀ)·Bᵀ · s` with `A` of shape `(r, in)`, `B` of shape `(out, r)` and
//! `s = lora_alpha / r` (or `lora_alpha / √r` with rsLoRA). Only the low-rank path is scaled, never the base output
//! (candle-lora's `(base + BA)·s` is wrong). The scale is folded into `B` when the adapter is built.

mod bank;
mod factor;
mod peft;

#[cfg(test)]
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{DType, Device, Tensor};

use crate::model::ModelConfig;

pub(crate) use bank::{LoraBank, LoraBatch};
pub(crate) use peft::{AdapterLimits, AdapterReader, check_peft_layout};

/// A projection LoRA can adapt, by its Hugging Face module name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum LoraTarget {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LoraTarget {
    /// Every target, in the order of [`LoraTarget::index`].
    pub(crate) const ALL: [Self; 7] = [Self::Q, Self::K, Self::V, Self::O, Self::Gate, Self::Up, Self::Down];

    /// The module's name in Hugging Face checkpoints and PEFT `target_modules`.
    pub(crate) fn module_name(self) -> &'static str {
        match self {
            Self::Q => "q_proj",
            Self::K => "k_proj",
            Self::V => "v_proj",
            Self::O => "o_proj",
            Self::Gate => "gate_proj",
            Self::Up => "up_proj",
            Self::Down => "down_proj",
        }
    }

    /// Parses a PEFT `target_modules` entry.
    pub(crate) fn from_module_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|target| target.module_name() == name)
    }

    /// The position of this target in per-target arrays.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The block holding the module: `self_attn` or `mlp`.
    fn block(self) -> &'static str {
        match self {
            Self::Q | Self::K | Self::V | Self::O => "self_attn",
            Self::Gate | Self::Up | Self::Down => "mlp",
        }
    }

    /// The module's path in a Hugging Face checkpoint, e.g. `model.layers.3.self_attn.q_proj`.
    pub(crate) fn module_path(self, layer: usize) -> String {
        format!("model.layers.{layer}.{}.{}", self.block(), self.module_name())
    }

    /// `(in_features, out_features)` of the projection in `config`'s model.
    pub(crate) fn features(self, config: &ModelConfig) -> (usize, usize) {
        let attention = config.num_heads * config.head_dim;
        let kv = config.num_kv_heads * config.head_dim;
        match self {
            Self::Q => (config.hidden_size, attention),
            Self::K | Self::V => (config.hidden_size, kv),
            Self::O => (attention, config.hidden_size),
            Self::Gate | Self::Up => (config.hidden_size, config.intermediate_size),
            Self::Down => (config.intermediate_size, config.hidden_size),
        }
    }
}

/// One adapted projection, stored ready for `x·Aᵀ·(s·B)ᵀ`.
#[derive(Clone, Debug)]
pub(crate) struct LoraPair {
    /// `Aᵀ`, shape `(in, r)`.
    a_t: Tensor,
    /// `(s·B)ᵀ`, shape `(r, out)`.
    b_t: Tensor,
}

impl LoraPair {
    /// From PEFT's `A` `(r, in)` and `B` `(out, r)` and the scale `s`.
    pub(crate) fn new(a: &Tensor, b: &Tensor, scale: f64) -> candle_core::Result<Self> {
        Ok(Self::from_transposed(factor::scaled_transpose(a, 1.0)?, factor::scaled_transpose(b, scale)?))
    }

    /// From `Aᵀ` `(in, r)` and `(s·B)ᵀ` `(r, out)`, as [`factor::scaled_transpose`] makes them.
    pub(crate) fn from_transposed(a_t: Tensor, b_t: Tensor) -> Self {
        Self { a_t, b_t }
    }

    pub(crate) fn rank(&self) -> usize {
        self.b_t.dims()[0]
    }

    /// Whether every value of `Aᵀ` and `(s·B)ᵀ` is finite, as stored (in the pair's dtype).
    pub(crate) fn is_finite(&self) -> candle_core::Result<bool> {
        Ok(factor::all_finite(&self.a_t)? && factor::all_finite(&self.b_t)?)
    }

    /// The pair on `device` as `dtype`.
    pub(crate) fn to_device(&self, device: &Device, dtype: DType) -> candle_core::Result<Self> {
        Ok(Self {
            a_t: self.a_t.to_dtype(dtype)?.to_device(device)?,
            b_t: self.b_t.to_dtype(dtype)?.to_device(device)?,
        })
    }

    /// The weight change `ΔW = s·B·A`, shape `(out, in)`, for merging and tests.
    #[cfg(test)]
    pub(crate) fn delta_weight(&self) -> candle_core::Result<Tensor> {
        self.a_t.matmul(&self.b_t)?.t()
    }
}

/// The weights of one loaded adapter: for each layer, the pair of each target it adapts.
#[derive(Debug)]
pub(crate) struct AdapterWeights {
    /// Unique per built adapter, so batches can tell adapter sets apart cheaply.
    id: u64,
    /// `layers[layer][target.index()]`.
    layers: Vec<[Option<LoraPair>; 7]>,
}

/// An adapter's device memory is freed wherever its last `Arc` goes: on the step thread, or on the async runtime's
/// thread that replaced or unloaded it. cudarc frees in the CUDA context current on the freeing thread, and a free on
/// a thread with none fails and poisons the context's next operation (`CUDA_ERROR_INVALID_CONTEXT` at the next
/// step, seen on an H200 after a swap): so the device's context is made current first.
impl Drop for AdapterWeights {
    fn drop(&mut self) {
        let first = self.layers.iter().flatten().flatten().next();
        if let Some(pair) = first {
            bind_device_to_thread(pair.a_t.device());
        }
    }
}

/// Makes `device`'s CUDA context current on this thread (a no-op on the CPU).
fn bind_device_to_thread(device: &Device) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device
        && let Err(err) = cuda.cuda_stream().context().bind_to_thread()
    {
        tracing::warn!(%err, "could not make the CUDA context current to free an adapter's weights");
    }
    #[cfg(not(feature = "cuda"))]
    let _ = device;
}

impl AdapterWeights {
    /// Builds an adapter; `layers[layer][target.index()]` is the pair adapting that projection, if any.
    pub(crate) fn new(layers: Vec<[Option<LoraPair>; 7]>) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Self { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), layers }
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn pair(&self, layer: usize, target: LoraTarget) -> Option<&LoraPair> {
        self.layers.get(layer).and_then(|pairs| pairs[target.index()].as_ref())
    }

    /// The rank this adapter uses for `target` (0 when it does not adapt it). PEFT adapters use one rank for every
    /// layer, so layer 0 speaks for all.
    pub(crate) fn rank(&self, target: LoraTarget) -> usize {
        self.pair(0, target).map_or(0, LoraPair::rank)
    }

    pub(crate) fn num_layers(&self) -> usize {
        self.layers.len()
    }
}

/// Draws a random adapter for `config` (A and B both nonzero), for tests and benchmarks of the engine.
#[cfg(test)]
pub(crate) fn random_adapter(
    config: &ModelConfig,
    rank: usize,
    scale: f64,
    targets: &[LoraTarget],
    seed: u64,
    device: &Device,
) -> candle_core::Result<Arc<AdapterWeights>> {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let layers = (0..config.num_layers)
        .map(|_| {
            let mut pairs: [Option<LoraPair>; 7] = Default::default();
            for target in targets {
                let (fan_in, fan_out) = target.features(config);
                let a = crate::model::random_tensor(&mut rng, (rank, fan_in), 1.0 / (fan_in as f32).sqrt(), device)?;
                let b = crate::model::random_tensor(&mut rng, (fan_out, rank), 1.0 / (rank as f32).sqrt(), device)?;
                pairs[target.index()] = Some(LoraPair::new(&a, &b, scale)?);
            }
            Ok(pairs)
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok(Arc::new(AdapterWeights::new(layers)))
}
