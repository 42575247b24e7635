//! The CPU attention kernels on synthetic paged KV caches, for the engine's `attention` benchmark (`cargo bench -p
//! loragate-engine --bench attention`), and a decode step's quantized products, for its `products` benchmark: the
//! kernels themselves are internal to the engine, so this is the one door the benchmarks go through. Nothing else
//! uses it.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Result, Tensor};
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::kv_cache::{BLOCK_SIZE, LayerKv};
use super::ops::{self, SequenceView};
use super::quantized::{QuantizedMatrix, Simd};

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

/// The matrices of a decoder's layers and its LM head, for [`ProductsCase`].
#[derive(Clone, Copy, Debug)]
pub struct ProductShape {
    /// Hidden size: the input width of every projection but the down projection.
    pub hidden: usize,
    /// The q projection's outputs (query heads × head size).
    pub q: usize,
    /// The k and v projections' outputs each (key/value heads × head size).
    pub kv: usize,
    /// The MLP's intermediate size.
    pub intermediate: usize,
    /// The LM head's outputs.
    pub vocab: usize,
    /// Decoder layers.
    pub layers: usize,
}

impl ProductShape {
    /// SmolLM2-135M's: hidden 576, 9 query heads and 3 key/value heads of 64, MLP 1,536, vocabulary 49,152, 30
    /// layers.
    pub const SMOLLM2_135M: Self = Self { hidden: 576, q: 576, kv: 192, intermediate: 1536, vocab: 49152, layers: 30 };
}

/// One decode step's quantized products as the engine runs them: per layer the q, k and v projections together,
/// the output projection, the gate and up projections together and the down projection, the layers' matrices in a
/// nibble format (SmolLM2's GGUF file has Q4_1) and the LM head in Q8_0 (the file's tied embedding), with seeded
/// random weights. Every layer has its own matrices, so a step streams them from memory as a real one does.
pub struct ProductsCase {
    layers: Vec<[QuantizedMatrix; 7]>,
    lm_head: QuantizedMatrix,
    hidden: Vec<f32>,
    intermediate: Vec<f32>,
    shape: ProductShape,
}

impl ProductsCase {
    /// Seeded random matrices of `shape`, the layers' in `format` (Q4_0, Q4_1 or Q8_0), and `rows` input rows.
    pub fn new(shape: ProductShape, format: GgmlDType, rows: usize) -> Result<Self> {
        let mut rng = StdRng::seed_from_u64(7);
        let mut matrix = |rows: usize, cols: usize, format: GgmlDType| -> Result<QuantizedMatrix> {
            let weights = super::random_tensor(&mut rng, (rows, cols), 1.0, &Device::Cpu)?;
            QuantizedMatrix::from_qtensor(&QTensor::quantize(&weights, format)?)?
                .ok_or_else(|| candle_core::Error::Msg(format!("{format:?} is not served by the engine's kernels")))
        };
        let ProductShape { hidden, q, kv, intermediate, vocab, layers } = shape;
        let layers = (0..layers)
            .map(|_| {
                Ok([
                    matrix(q, hidden, format)?,
                    matrix(kv, hidden, format)?,
                    matrix(kv, hidden, format)?,
                    matrix(hidden, q, format)?,
                    matrix(intermediate, hidden, format)?,
                    matrix(intermediate, hidden, format)?,
                    matrix(hidden, intermediate, format)?,
                ])
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = matrix(vocab, hidden, GgmlDType::Q8_0)?;
        let values = |count: usize, seed: usize| -> Vec<f32> {
            (0..count).map(|i| ((i * seed + 7) % 97) as f32 / 48.0 - 1.0).collect()
        };
        Ok(Self {
            layers,
            lm_head,
            hidden: values(rows * hidden.max(q), 17),
            intermediate: values(rows * intermediate, 53),
            shape,
        })
    }

    /// The layers' products of the case's input rows, on the current pool; returns a checksum.
    pub fn layers(&self) -> f32 {
        let rows = self.hidden.len() / self.shape.hidden.max(self.shape.q);
        let (hidden, intermediate) = (&self.hidden[..rows * self.shape.hidden], &self.intermediate[..]);
        let mut checksum = 0.0;
        for [q, k, v, o, gate, up, down] in &self.layers {
            let qkv = QuantizedMatrix::matmul_many(&[q, k, v], hidden, rows);
            let output = o.matmul(&self.hidden[..rows * self.shape.q], rows);
            let gate_up = QuantizedMatrix::matmul_many(&[gate, up], hidden, rows);
            let down = down.matmul(intermediate, rows);
            checksum += qkv[0][0] + output[0] + gate_up[1][0] + down[0];
        }
        checksum
    }

    /// The LM head's product of the case's input rows, on the current pool; returns a checksum.
    pub fn lm_head(&self) -> f32 {
        let rows = self.hidden.len() / self.shape.hidden.max(self.shape.q);
        self.lm_head.matmul(&self.hidden[..rows * self.shape.hidden], rows)[0]
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
