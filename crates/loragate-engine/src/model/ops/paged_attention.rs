//! The decode rows' attention on the CPU, reading each sequence's keys and values where its blocks hold them: no
//! gather, no padding, no mask. One task per row and key/value head (the query heads of its group together, so a
//! key or value is read once for the group): the scores of every position the row sees, `q·k/√d`, the softmax of
//! each query head's row of them in place, then the weighted sum of the values. Tasks run on the engine's pool
//! when a step has enough of them to share; a task's scores live in a per-thread scratch buffer.
//!
//! The dot products and the weighted sums run eight values at a time with AVX2 and FMA (checked at run time by
//! `pulp`), the scalar loops elsewhere.

use std::cell::Cell;

use candle_core::{CpuStorage, Result, Storage, Tensor};
use rayon::prelude::*;

use super::vector;
use crate::model::kv_cache::{BLOCK_SIZE, LayerKv};

/// Values multiplied (positions × heads × head_dim) from which the tasks are shared among the pool's threads: below
/// it a step's attention is a few microseconds, less than handing tasks over costs.
const PARALLEL_WORK: usize = 1 << 16;

thread_local! {
    /// One task's scores, kept for the next task on this thread.
    static SCORES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// The positions one sequence attends to: its first `len` positions, held by `blocks` in order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SequenceView<'a> {
    pub(crate) blocks: &'a [u32],
    pub(crate) len: usize,
}

impl SequenceView<'_> {
    /// Each block's first slot and how many of its positions are seen, in position order.
    pub(crate) fn runs(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.blocks.iter().enumerate().map_while(move |(index, &block)| {
            let start = index * BLOCK_SIZE;
            (start < self.len).then(|| (block as usize * BLOCK_SIZE, BLOCK_SIZE.min(self.len - start)))
        })
    }
}

/// The decode rows' attention: `q` holds the packed pass's queries `(tokens, heads, 1, d)` with RoPE applied, the
/// rows' being the first `rows.len()`; row `i` sees the positions of `rows[i]` (its new one included, already
/// written). `layer` is the cache's storage, `(slots, kv_heads · d)`. Returns `(rows, 1, heads, d)` in f32.
///
/// `None` where this path does not apply (not on the CPU, not f32, not contiguous) and the caller gathers.
pub(crate) fn paged_decode_attention(
    q: &Tensor,
    rows: &[SequenceView<'_>],
    layer: &LayerKv,
    kv_heads: usize,
) -> Result<Option<Tensor>> {
    if !q.device().is_cpu() || q.track_op() || !q.is_contiguous() || rows.is_empty() {
        return Ok(None);
    }
    let (tokens, heads, one, head_dim) = q.dims4()?;
    if one != 1 || tokens < rows.len() || kv_heads == 0 || heads % kv_heads != 0 {
        candle_core::bail!("{} decode rows of {tokens} tokens, {heads}/{kv_heads} heads", rows.len())
    }
    let (q_storage, q_layout) = q.storage_and_layout();
    let (k_storage, k_layout) = layer.keys.storage_and_layout();
    let (v_storage, v_layout) = layer.values.storage_and_layout();
    let (
        Storage::Cpu(CpuStorage::F32(q_data)),
        Storage::Cpu(CpuStorage::F32(k_data)),
        Storage::Cpu(CpuStorage::F32(v_data)),
    ) = (&*q_storage, &*k_storage, &*v_storage)
    else {
        return Ok(None);
    };
    let (Some((k_start, k_end)), Some((v_start, v_end))) =
        (k_layout.contiguous_offsets(), v_layout.contiguous_offsets())
    else {
        return Ok(None);
    };
    let width = kv_heads * head_dim;
    let cache = Cache { keys: &k_data[k_start..k_end], values: &v_data[v_start..v_end], width, head_dim };
    let group = heads / kv_heads;
    let queries = &q_data[q_layout.start_offset()..][..rows.len() * heads * head_dim];
    let mut output = vec![0f32; rows.len() * heads * head_dim];
    let task = |(index, out): (usize, &mut [f32])| {
        let (row, kv_head) = (index / kv_heads, index % kv_heads);
        let query = &queries[(row * heads + kv_head * group) * head_dim..][..group * head_dim];
        attend(&cache, rows[row], kv_head, query, out);
    };
    let work: usize = rows.iter().map(|row| row.len).sum::<usize>() * heads * head_dim;
    if work >= PARALLEL_WORK {
        output.par_chunks_mut(group * head_dim).enumerate().for_each(task);
    } else {
        output.chunks_mut(group * head_dim).enumerate().for_each(task);
    }
    drop((q_storage, k_storage, v_storage));
    Tensor::from_vec(output, (rows.len(), 1, heads, head_dim), q.device()).map(Some)
}

/// A layer's storage as host values: slot `s` is `width` values from `s · width`.
struct Cache<'a> {
    keys: &'a [f32],
    values: &'a [f32],
    width: usize,
    head_dim: usize,
}

/// One task: the group of query heads `query` (`group × d`) of key/value head `kv_head` over `sequence`, into `out`
/// (`group × d`).
///
/// The scores' buffer is taken out of the thread's [`SCORES`] before the vectorised body runs and put back after: a
/// body run inside `LocalKey::with`'s closure is compiled without AVX2 and FMA (the closure is not inlined into the
/// function `pulp` compiles with them), and every FMA became a call — most of a decode step's attention time.
fn attend(cache: &Cache<'_>, sequence: SequenceView<'_>, kv_head: usize, query: &[f32], out: &mut [f32]) {
    let mut scores = SCORES.take();
    let task = Task { cache, sequence, kv_head, query, out, scores: &mut scores };
    #[cfg(target_arch = "x86_64")]
    let simd = pulp::x86::V3::try_new();
    #[cfg(not(target_arch = "x86_64"))]
    let simd: Option<std::convert::Infallible> = None;
    match simd {
        #[cfg(target_arch = "x86_64")]
        Some(simd) => simd.vectorize(Avx2Task { simd, task }),
        #[cfg(not(target_arch = "x86_64"))]
        Some(never) => match never {},
        None => attend_with(Scalar, task),
    }
    SCORES.set(scores);
}

/// One task's operands (see [`attend`]).
struct Task<'a, 'b> {
    cache: &'a Cache<'b>,
    sequence: SequenceView<'a>,
    kv_head: usize,
    query: &'a [f32],
    out: &'a mut [f32],
    /// The scores' buffer, any length.
    scores: &'a mut Vec<f32>,
}

/// The two products a task is made of.
trait Lanes: Copy {
    /// `Σ a·b`.
    fn dot(self, a: &[f32], b: &[f32]) -> f32;
    /// `y ← y + a·x`.
    fn axpy(self, y: &mut [f32], a: f32, x: &[f32]);
}

#[inline(always)]
fn attend_with(lanes: impl Lanes, task: Task<'_, '_>) {
    let Task { cache, sequence, kv_head, query, out, scores } = task;
    let d = cache.head_dim;
    let (total, group) = (sequence.len, query.len() / d);
    let scale = 1.0 / (d as f32).sqrt();
    let column = kv_head * d;
    scores.clear();
    scores.resize(group * total, 0.0);
    let mut position = 0;
    for (first, count) in sequence.runs() {
        for slot in first..first + count {
            let key = &cache.keys[slot * cache.width + column..][..d];
            for (g, query) in query.chunks_exact(d).enumerate() {
                scores[g * total + position] = lanes.dot(query, key) * scale;
            }
            position += 1;
        }
    }
    for row in scores.chunks_exact_mut(total) {
        // A NaN or infinite score (an overflowing adapter) makes the whole row NaN, as candle's softmax does.
        vector::softmax_in_place(row);
    }
    out.fill(0.0);
    let mut position = 0;
    for (first, count) in sequence.runs() {
        for slot in first..first + count {
            let value = &cache.values[slot * cache.width + column..][..d];
            for (g, out) in out.chunks_exact_mut(d).enumerate() {
                lanes.axpy(out, scores[g * total + position], value);
            }
            position += 1;
        }
    }
}

#[derive(Clone, Copy)]
struct Scalar;

impl Lanes for Scalar {
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(a, b)| a * b).sum()
    }

    #[inline(always)]
    fn axpy(self, y: &mut [f32], a: f32, x: &[f32]) {
        for (y, x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::__m256;

    use pulp::x86::V3;

    use super::*;

    const LANES: usize = 8;

    #[inline(always)]
    fn load(values: &[f32]) -> __m256 {
        bytemuck::pod_read_unaligned(bytemuck::cast_slice(&values[..LANES]))
    }

    impl Lanes for V3 {
        #[inline(always)]
        fn dot(self, a: &[f32], b: &[f32]) -> f32 {
            let (avx, fma) = (self.avx, self.fma);
            let mut sums = avx._mm256_setzero_ps();
            let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
            let tail: f32 = a_chunks.remainder().iter().zip(b_chunks.remainder()).map(|(a, b)| a * b).sum();
            for (a, b) in a_chunks.zip(b_chunks) {
                sums = fma._mm256_fmadd_ps(load(a), load(b), sums);
            }
            bytemuck::cast::<__m256, [f32; LANES]>(sums).into_iter().fold(tail, |sum, lane| sum + lane)
        }

        #[inline(always)]
        fn axpy(self, y: &mut [f32], a: f32, x: &[f32]) {
            let (avx, fma) = (self.avx, self.fma);
            let scale = avx._mm256_set1_ps(a);
            let mut y_chunks = y.chunks_exact_mut(LANES);
            let mut x_chunks = x.chunks_exact(LANES);
            for (y, x) in (&mut y_chunks).zip(&mut x_chunks) {
                let sum = fma._mm256_fmadd_ps(scale, load(x), load(y));
                y.copy_from_slice(&bytemuck::cast::<__m256, [f32; LANES]>(sum));
            }
            for (y, x) in y_chunks.into_remainder().iter_mut().zip(x_chunks.remainder()) {
                *y += a * x;
            }
        }
    }
}

/// [`attend`]'s AVX2 body (`pulp` compiles a struct's `call` with the features enabled).
#[cfg(target_arch = "x86_64")]
struct Avx2Task<'a, 'b> {
    simd: pulp::x86::V3,
    task: Task<'a, 'b>,
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for Avx2Task<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        attend_with(self.simd, self.task);
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;

    /// Deterministic values in −2..2.
    fn values(count: usize, seed: usize) -> Vec<f32> {
        (0..count).map(|i| ((i * seed + 7) % 97) as f32 / 24.0 - 2.0).collect()
    }

    /// The attention of row `row`, query head `h`, in f64 and loops, over keys and values read through `blocks`.
    fn reference(
        q: &[f32],
        (keys, values): (&[f32], &[f32]),
        (heads, kv_heads, d): (usize, usize, usize),
        sequence: SequenceView<'_>,
        (row, h): (usize, usize),
    ) -> Vec<f64> {
        let kv = h / (heads / kv_heads);
        let query = &q[(row * heads + h) * d..][..d];
        let slot = |p: usize| sequence.blocks[p / BLOCK_SIZE] as usize * BLOCK_SIZE + p % BLOCK_SIZE;
        let at = |data: &[f32], p: usize| data[slot(p) * kv_heads * d + kv * d..][..d].to_vec();
        let scores: Vec<f64> = (0..sequence.len)
            .map(|p| {
                let key = at(keys, p);
                query.iter().zip(&key).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() / (d as f64).sqrt()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = weights.iter().sum();
        (0..d).map(|c| weights.iter().enumerate().map(|(p, w)| w / sum * f64::from(at(values, p)[c])).sum()).collect()
    }

    #[test]
    fn equals_the_definition_over_scattered_blocks_alone_and_in_parallel() {
        let device = Device::Cpu;
        for (heads, kv_heads, d, lens) in
            [(9, 3, 64, vec![1, 17, 40]), (4, 2, 8, vec![5]), (6, 2, 12, vec![33, 2]), (9, 3, 64, vec![700, 900])]
        {
            let blocks = 140;
            let width = kv_heads * d;
            let (k_values, v_values) =
                (values(blocks * BLOCK_SIZE * width, 17), values(blocks * BLOCK_SIZE * width, 53));
            let layer = LayerKv {
                keys: Tensor::from_vec(k_values.clone(), (blocks * BLOCK_SIZE, width), &device).expect("keys"),
                values: Tensor::from_vec(v_values.clone(), (blocks * BLOCK_SIZE, width), &device).expect("values"),
            };
            // Each sequence's blocks, in a scrambled order through the pool.
            let tables: Vec<Vec<u32>> = lens
                .iter()
                .enumerate()
                .map(|(row, &len): (usize, &usize)| {
                    (0..len.div_ceil(BLOCK_SIZE) as u32)
                        .map(|b| (b * 11 + row as u32 * 64 + 3) % blocks as u32)
                        .collect()
                })
                .collect();
            let views: Vec<SequenceView<'_>> =
                tables.iter().zip(&lens).map(|(blocks, &len)| SequenceView { blocks, len }).collect();
            let tokens = lens.len() + 2;
            let q_values = values(tokens * heads * d, 31);
            let q = Tensor::from_vec(q_values.clone(), (tokens, heads, 1, d), &device).expect("q");
            let output = paged_decode_attention(&q, &views, &layer, kv_heads).expect("attention").expect("taken");
            assert_eq!(output.dims(), &[lens.len(), 1, heads, d]);
            let output = output.flatten_all().and_then(|o| o.to_vec1::<f32>()).expect("output");
            for (row, view) in views.iter().enumerate() {
                for h in 0..heads {
                    let want = reference(&q_values, (&k_values, &v_values), (heads, kv_heads, d), *view, (row, h));
                    let got = &output[(row * heads + h) * d..][..d];
                    for (got, want) in got.iter().zip(&want) {
                        assert!((f64::from(*got) - want).abs() < 1e-5, "{got} vs {want}: row {row}, head {h}");
                    }
                }
            }
        }
        let half = Tensor::zeros((1, 2, 1, 8), DType::F16, &device).expect("f16");
        let layer = LayerKv {
            keys: Tensor::zeros((16, 8), DType::F16, &device).expect("keys"),
            values: Tensor::zeros((16, 8), DType::F16, &device).expect("values"),
        };
        let view = SequenceView { blocks: &[0], len: 1 };
        assert!(paged_decode_attention(&half, &[view], &layer, 1).expect("attention").is_none(), "left to gathering");
    }
}
