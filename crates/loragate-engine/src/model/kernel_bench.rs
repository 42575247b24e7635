//! The CPU attention kernels on synthetic paged KV caches, for the engine's `attention` benchmark (`cargo bench -p
//! loragate-engine --bench attention`): the kernels themselves are internal to the engine, so this is the one door
//! the benchmark goes through. Nothing else uses it.

use candle_core::{Device, Result, Tensor};

use super::kv_cache::{BLOCK_SIZE, LayerKv};
use super::ops::{self, SequenceView};
use super::quantized::Simd;

/// The widest kernels a call may use (each falls back to the next narrower one the CPU has, as in the engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernels {
    /// The scalar loops.
    Portable,
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512 (the engine's default where the CPU has it).
    Avx512,
}

impl Kernels {
    fn simd(self) -> Simd {
        match self {
            Self::Portable => Simd::Portable,
            Self::Avx2 => Simd::Avx2,
            Self::Avx512 => Simd::Avx512Vnni,
        }
    }
}

/// The attention dimensions of a model.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (`heads` is a multiple of it).
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
}

impl AttentionShape {
    /// SmolLM2-135M's: 9 query heads sharing 3 key/value heads of 64 values.
    pub const SMOLLM2_135M: Self = Self { heads: 9, kv_heads: 3, head_dim: 64 };
}

/// One layer's paged KV cache holding `rows` sequences of `context` positions each, their blocks scattered through
/// the pool (as a pool that has served a while hands them out), and one query per position of the packed pass.
pub struct AttentionCase {
    shape: AttentionShape,
    layer: LayerKv,
    tables: Vec<Vec<u32>>,
    context: usize,
    queries: Tensor,
}

impl AttentionCase {
    /// `rows` sequences of `context` positions of `shape`, with `queries` packed query positions (at least `rows`,
    /// and at least the longest chunk [`Self::chunk`] is asked for). Values are deterministic.
    pub fn new(shape: AttentionShape, rows: usize, context: usize, queries: usize) -> Result<Self> {
        let per_row = context.div_ceil(BLOCK_SIZE);
        // Block 0 is never handed out; one spare block between sequences' runs, visited in a scrambled order.
        let blocks = rows * per_row + 2;
        let stride = coprime_stride(blocks - 1);
        let tables = (0..rows)
            .map(|row| {
                (0..per_row).map(|b| 1 + ((row * per_row + b) * stride % (blocks - 1)) as u32).collect::<Vec<u32>>()
            })
            .collect();
        let width = shape.kv_heads * shape.head_dim;
        let slots = blocks * BLOCK_SIZE;
        let layer = LayerKv { keys: values(slots, width, 17)?, values: values(slots, width, 53)? };
        let queries = values(queries.max(rows), shape.heads * shape.head_dim, 31)?.reshape((
            queries.max(rows),
            shape.heads,
            1,
            shape.head_dim,
        ))?;
        Ok(Self { shape, layer, tables, context, queries })
    }

    /// The decode rows' attention with kernels no wider than `kernels`: each of the `rows` sequences' first query
    /// over its whole context. Returns `(rows, 1, heads, head_dim)`.
    pub fn decode(&self, kernels: Kernels) -> Result<Tensor> {
        let views = self.views();
        ops::paged_decode_attention_with(kernels.simd(), &self.queries, &views, &self.layer, self.shape.kv_heads)?
            .ok_or_else(|| candle_core::Error::Msg("the paged decode kernel did not apply".into()))
    }

    /// A prefill chunk's attention: the last `len` positions of the first sequence's context, the packed pass's
    /// first `len` queries. Returns `(len, 1, heads, head_dim)`.
    pub fn chunk(&self, len: usize) -> Result<Tensor> {
        let view = self.views()[0];
        ops::causal_chunk_attention(&self.queries, 0, len, view, &self.layer, self.shape.kv_heads)?
            .ok_or_else(|| candle_core::Error::Msg("the chunk kernel did not apply".into()))
    }

    fn views(&self) -> Vec<SequenceView<'_>> {
        self.tables.iter().map(|blocks| SequenceView { blocks, len: self.context }).collect()
    }
}

/// A stride near a third of `modulus` that visits every residue.
fn coprime_stride(modulus: usize) -> usize {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    (modulus / 3 + 1..).find(|&stride| gcd(stride, modulus) == 1).unwrap_or(1)
}

/// `(rows, width)` deterministic values in −1..1.
fn values(rows: usize, width: usize, seed: usize) -> Result<Tensor> {
    let data: Vec<f32> = (0..rows * width).map(|i| ((i * seed + 7) % 97) as f32 / 48.0 - 1.0).collect();
    Tensor::from_vec(data, (rows, width), &Device::Cpu)
}
