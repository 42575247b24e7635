//! The decode rows' attention on the CPU, reading each sequence's keys and values where its blocks hold them: no
//! gather, no padding, no mask. One task per row and key/value head (the query heads of its group together, so a
//! key or value is read once for the group): the scores of every position the row sees, `q·k/√d`, the softmax of
//! each query head's row of them in place, then the weighted sum of the values. Tasks run on the engine's pool
//! when a step has enough of them to share; a task's scores live in a per-thread scratch buffer.
//!
//! The kernels are chosen at run time, capped by `LORAGATE_SIMD` as the quantized products are ([`Simd`]): with
//! AVX-512 F, for heads of 32, 64 or 128 values, a block of 16 keys at a time ([`avx512`]); with AVX2 and FMA
//! (checked by `pulp`) the dot products and weighted sums eight values at a time; the scalar loops elsewhere.

use std::cell::Cell;

use candle_core::{CpuStorage, Result, Storage, Tensor};
use rayon::prelude::*;

use super::vector;
use crate::model::kv_cache::{BLOCK_SIZE, LayerKv};
use crate::model::quantized::Simd;

#[cfg(target_arch = "x86_64")]
mod avx512;

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
    paged_decode_attention_with(Simd::chosen(), q, rows, layer, kv_heads)
}

/// [`paged_decode_attention`] with kernels no wider than `simd`.
pub(crate) fn paged_decode_attention_with(
    simd: Simd,
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
    let path = Path::new(simd, head_dim);
    let group = heads / kv_heads;
    let queries = &q_data[q_layout.start_offset()..][..rows.len() * heads * head_dim];
    let mut output = vec![0f32; rows.len() * heads * head_dim];
    let task = |(index, out): (usize, &mut [f32])| {
        let (row, kv_head) = (index / kv_heads, index % kv_heads);
        let query = &queries[(row * heads + kv_head * group) * head_dim..][..group * head_dim];
        attend(path, &cache, rows[row], kv_head, query, out);
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

/// The kernels a call runs: the widest that `simd` allows, the CPU has, and that serves its heads.
#[derive(Clone, Copy)]
enum Path {
    #[cfg(target_arch = "x86_64")]
    Avx512(avx512::Avx512),
    #[cfg(target_arch = "x86_64")]
    Avx2(pulp::x86::V3),
    Portable,
}

impl Path {
    fn new(simd: Simd, head_dim: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if simd >= Simd::Avx512Vnni
                && avx512::Avx512::serves(head_dim)
                && let Some(token) = avx512::Avx512::try_new()
            {
                return Self::Avx512(token);
            }
            if simd >= Simd::Avx2
                && let Some(token) = pulp::x86::V3::try_new()
            {
                return Self::Avx2(token);
            }
        }
        let _ = (simd, head_dim);
        Self::Portable
    }
}

/// One task: the group of query heads `query` (`group × d`) of key/value head `kv_head` over `sequence`, into `out`
/// (`group × d`).
///
/// The scores' buffer is taken out of the thread's [`SCORES`] before the vectorised body runs and put back after: a
/// body run inside `LocalKey::with`'s closure is compiled without AVX2 and FMA (the closure is not inlined into the
/// function `pulp` compiles with them), and every FMA became a call — most of a decode step's attention time.
fn attend(path: Path, cache: &Cache<'_>, sequence: SequenceView<'_>, kv_head: usize, query: &[f32], out: &mut [f32]) {
    let mut scores = SCORES.take();
    let task = Task { cache, sequence, kv_head, query, out, scores: &mut scores };
    match path {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512(token) => token.attend(task),
        #[cfg(target_arch = "x86_64")]
        Path::Avx2(simd) => simd.vectorize(Avx2Task { simd, task }),
        Path::Portable => attend_with(Scalar, task),
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

    /// The kernel levels to test, each with whether this CPU runs its own path (a level it lacks falls back to a
    /// narrower one: the test then says so).
    fn levels() -> Vec<(Simd, bool)> {
        #[cfg(target_arch = "x86_64")]
        let (avx2, avx512) = (pulp::x86::V3::try_new().is_some(), avx512::Avx512::try_new().is_some());
        #[cfg(not(target_arch = "x86_64"))]
        let (avx2, avx512) = (false, false);
        for (name, has) in [("AVX2", avx2), ("AVX-512", avx512)] {
            if !has {
                eprintln!("this CPU lacks {name}: its attention path is not tested here");
            }
        }
        vec![(Simd::Portable, true), (Simd::Avx2, avx2), (Simd::Avx512Vnni, avx512)]
    }

    /// A layer of `blocks` blocks, and one sequence per length over scrambled blocks.
    fn layer_and_tables(blocks: usize, width: usize, lens: &[usize]) -> (Vec<f32>, Vec<f32>, LayerKv, Vec<Vec<u32>>) {
        let device = Device::Cpu;
        let (k_values, v_values) = (values(blocks * BLOCK_SIZE * width, 17), values(blocks * BLOCK_SIZE * width, 53));
        let layer = LayerKv {
            keys: Tensor::from_vec(k_values.clone(), (blocks * BLOCK_SIZE, width), &device).expect("keys"),
            values: Tensor::from_vec(v_values.clone(), (blocks * BLOCK_SIZE, width), &device).expect("values"),
        };
        let tables = lens
            .iter()
            .enumerate()
            .map(|(row, &len)| {
                (0..len.div_ceil(BLOCK_SIZE) as u32).map(|b| (b * 11 + row as u32 * 64 + 3) % blocks as u32).collect()
            })
            .collect();
        (k_values, v_values, layer, tables)
    }

    #[test]
    fn every_path_equals_the_definition_over_scattered_blocks_alone_and_in_parallel() {
        let device = Device::Cpu;
        let shapes = [
            (9, 3, 64, vec![1, 16, 17, 40]),
            (4, 2, 8, vec![5]),
            (6, 2, 12, vec![33, 2]),
            (8, 2, 128, vec![15, 31]),
            (4, 4, 32, vec![49, 3]),
            (9, 3, 64, vec![700, 900]),
        ];
        for (simd, runs_its_own) in levels() {
            for (heads, kv_heads, d, lens) in &shapes {
                let (heads, kv_heads, d) = (*heads, *kv_heads, *d);
                let (k_values, v_values, layer, tables) = layer_and_tables(140, kv_heads * d, lens);
                let views: Vec<SequenceView<'_>> =
                    tables.iter().zip(lens).map(|(blocks, &len)| SequenceView { blocks, len }).collect();
                let tokens = lens.len() + 2;
                let q_values = values(tokens * heads * d, 31);
                let q = Tensor::from_vec(q_values.clone(), (tokens, heads, 1, d), &device).expect("q");
                let output =
                    paged_decode_attention_with(simd, &q, &views, &layer, kv_heads).expect("attention").expect("taken");
                assert_eq!(output.dims(), &[lens.len(), 1, heads, d]);
                let output = output.flatten_all().and_then(|o| o.to_vec1::<f32>()).expect("output");
                let portable = paged_decode_attention_with(Simd::Portable, &q, &views, &layer, kv_heads)
                    .and_then(|o| o.expect("taken").flatten_all()?.to_vec1::<f32>())
                    .expect("portable");
                for (row, view) in views.iter().enumerate() {
                    for h in 0..heads {
                        let want = reference(&q_values, (&k_values, &v_values), (heads, kv_heads, d), *view, (row, h));
                        let at = (row * heads + h) * d;
                        for ((got, want), portable) in output[at..][..d].iter().zip(&want).zip(&portable[at..]) {
                            let context =
                                format!("{simd:?} (its own path: {runs_its_own}), d {d}, row {row}, head {h}");
                            assert!((f64::from(*got) - want).abs() < 1e-5, "{got} vs {want}: {context}");
                            assert!((got - portable).abs() < 1e-5, "{got} vs the portable {portable}: {context}");
                        }
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

    #[test]
    fn a_non_finite_key_spoils_the_rows_of_its_head_only_on_every_path() {
        let device = Device::Cpu;
        let (heads, kv_heads, d, lens) = (4, 2, 64, [40, 40]);
        let (_, _, layer, tables) = layer_and_tables(140, kv_heads * d, &lens);
        let views: Vec<SequenceView<'_>> =
            tables.iter().zip(&lens).map(|(blocks, &len)| SequenceView { blocks, len }).collect();
        // Position 20 of row 0 (block 1, slot 4), key/value head 1.
        let slot = tables[0][1] as usize * BLOCK_SIZE + 4;
        let q = Tensor::from_vec(values(2 * heads * d, 31), (2, heads, 1, d), &device).expect("q");
        for spoiler in [f32::NAN, f32::INFINITY] {
            let poisoned = Tensor::full(spoiler, (1, d), &device).expect("spoiler");
            let keys = layer.keys.slice_assign(&[slot..slot + 1, d..2 * d], &poisoned).expect("poisoned");
            let layer = LayerKv { keys, values: layer.values.clone() };
            for (simd, _) in levels() {
                let output = paged_decode_attention_with(simd, &q, &views, &layer, kv_heads)
                    .and_then(|o| o.expect("taken").flatten_all()?.to_vec1::<f32>())
                    .expect("attention");
                for (at, value) in output.iter().enumerate() {
                    let (row, head) = (at / (heads * d), at / d % heads);
                    let spoilt = row == 0 && head >= 2;
                    assert_eq!(value.is_nan(), spoilt, "{simd:?}, {spoiler}: {value} at row {row}, head {head}");
                }
            }
        }
    }
}
