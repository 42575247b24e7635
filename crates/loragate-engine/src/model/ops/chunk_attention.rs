//! A prefill chunk's attention over its sequence's cache, on the CPU, as one parallel pass.
//!
//! candle's path (the fallback, in `model/layer.rs`) builds the chunk's whole score tensor, `(kv_heads, group · len,
//! total)` — 8.6 MB for an 80-token chunk at position 3,000 of a model with 9 query heads — in freshly zeroed pages
//! on every layer, and copies the queries twice (regrouped, then scaled) and the output once. Its GEMM also reads
//! the keys, whose rows are contiguous, by gathering them value by value (gemm packs an operand that way unless
//! its columns are contiguous), which was a sixth of a long prefill's time in a profile.
//!
//! Here the cached keys are read from the sequence's blocks and transposed once per key/value head, the values
//! copied from the blocks into one contiguous run per head beside them (the GEMMs want contiguous operands: a block
//! holds 16 positions), and the work is split into tasks of one query head and up to [`BLOCK`] consecutive
//! positions, each run on one thread of the engine's pool: its scores against every key its last position may see
//! (one small GEMM, the `1/√d` scale folded into it), the causal softmax of each row in place, and the weighted sum
//! of the values (a second GEMM). A task's scores live in a per-thread scratch buffer of at most `BLOCK × total`
//! values (192 KB at 3,000 positions: within a core's L2), reused from task to task; the queries are read where the
//! packed pass left them.

use std::cell::{Cell, RefCell};

use candle_core::{CpuStorage, Result, Storage, Tensor};
use rayon::prelude::*;

use super::paged_attention::SequenceView;
use super::vector;
use crate::model::kv_cache::LayerKv;
use crate::model::scratch;

/// Query positions per task: enough rows for the GEMMs' kernels, few enough that an 80-token chunk of a 9-head
/// model is 45 tasks to share among the pool's threads.
const BLOCK: usize = 16;

/// The largest transposed keys (and copied values) kept for the next layer: 8 MiB each (SmolLM2-135M's 3
/// key/value heads up to 10,000 positions); a longer context or a larger model allocates them per layer instead of
/// holding them for good.
const KEPT_TRANSPOSED_VALUES: usize = 2 * 1024 * 1024;

thread_local! {
    /// One task's scores, kept for the next task on this thread.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The keys of a chunk's layer, transposed, kept for the next layer on the thread that calls.
    static KEYS_TRANSPOSED: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The values of a chunk's layer, one contiguous run per head, kept likewise.
    static VALUES_COPIED: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// One layer's storage on the host: slot `s` holds `width` values from `s · width`, head `h`'s `head_dim` of them
/// from `h · head_dim`.
struct Slots<'a> {
    data: &'a [f32],
    width: usize,
    head_dim: usize,
}

impl Slots<'_> {
    /// Writes head `head`'s keys of `sequence`, transposed, into `columns`: `head_dim` rows of `total` values, one
    /// block (16 positions × 64 values of a head: 4 KB, within L1) at a time.
    fn transpose_head(&self, sequence: SequenceView<'_>, head: usize, columns: &mut [f32]) {
        let (d, total) = (self.head_dim, sequence.len);
        let mut position = 0;
        for (first, count) in sequence.runs() {
            for column in 0..d {
                let out = &mut columns[column * total + position..][..count];
                for (at, value) in out.iter_mut().enumerate() {
                    *value = self.data[(first + at) * self.width + head * d + column];
                }
            }
            position += count;
        }
    }

    /// Copies head `head`'s values of `sequence` into `rows`: `total` rows of `head_dim` values, one after the other.
    fn copy_head(&self, sequence: SequenceView<'_>, head: usize, rows: &mut [f32]) {
        let d = self.head_dim;
        let mut position = 0;
        for (first, count) in sequence.runs() {
            for at in 0..count {
                let from = (first + at) * self.width + head * d;
                rows[(position + at) * d..][..d].copy_from_slice(&self.data[from..from + d]);
            }
            position += count;
        }
    }
}

/// A layer's keys, transposed: per key/value head, `head_dim` rows of `total` values.
struct TransposedKeys<'a> {
    data: &'a [f32],
    head_dim: usize,
    total: usize,
}

impl TransposedKeys<'_> {
    /// `head`'s `head_dim` rows, each `total` long (of which the first `visible` are read).
    fn head(&self, head: usize) -> &[f32] {
        &self.data[head * self.head_dim * self.total..][..self.head_dim * self.total]
    }
}

/// Causal attention of a chunk of `len` positions at the end of its sequence's: `q` holds the packed pass's queries
/// `(tokens, heads, 1, d)` with RoPE applied, the chunk's being the `len` rows from `offset`; `sequence` is the
/// sequence's blocks and its `total` positions, the chunk's own (already written) last, in `layer`, the cache's
/// `(slots, kv_heads · d)` storage. The query at chunk position `i` sees keys `..=total − len + i`. Returns `(len,
/// 1, heads, d)` in f32.
///
/// `None` where this path does not apply — not on the CPU, not f32, tracked by autograd, or laid out otherwise than
/// contiguous rows of `d` — and the caller gathers.
pub(crate) fn causal_chunk_attention(
    q: &Tensor,
    offset: usize,
    len: usize,
    sequence: SequenceView<'_>,
    layer: &LayerKv,
    kv_heads: usize,
) -> Result<Option<Tensor>> {
    if !q.device().is_cpu() || q.track_op() || !q.is_contiguous() {
        return Ok(None);
    }
    let (tokens, heads, one, head_dim) = q.dims4()?;
    let total = sequence.len;
    if one != 1 || kv_heads == 0 {
        return Ok(None);
    }
    if heads % kv_heads != 0 || len == 0 || len > total || offset + len > tokens {
        candle_core::bail!(
            "a chunk of {len} at {offset} of {tokens} tokens over {total} positions, {heads}/{kv_heads} heads"
        )
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
    let (key_slots, value_slots) = (
        Slots { data: &k_data[k_start..k_end], width, head_dim },
        Slots { data: &v_data[v_start..v_end], width, head_dim },
    );
    let queries = &q_data[q_layout.start_offset() + offset * heads * head_dim..][..len * heads * head_dim];

    // The keys transposed, `(kv_heads, d, total)`: gemm reads an operand whose rows are contiguous by gathering
    // it value by value, once for every task; transposed here, once per key/value head, each task's keys are
    // read as they lie. The values are copied out of their blocks into `(kv_heads, total, d)`. The buffers are kept
    // for the next layer.
    let mut transposed = scratch::take_zeroed(&KEYS_TRANSPOSED, kv_heads * head_dim * total);
    let mut copied = scratch::take_zeroed(&VALUES_COPIED, kv_heads * total * head_dim);
    transposed.par_chunks_mut(head_dim * total).zip(copied.par_chunks_mut(total * head_dim)).enumerate().for_each(
        |(head, (columns, rows))| {
            key_slots.transpose_head(sequence, head, columns);
            value_slots.copy_head(sequence, head, rows);
        },
    );
    let keys = TransposedKeys { data: &transposed, head_dim, total };
    let values = HeadRows { data: &copied, head_stride: total * head_dim, head_dim };
    let shape = Shape { start: total - len, heads, group: heads / kv_heads, head_dim };
    // Computed as `(heads, len, d)`, so that each task's rows are one slice of it; transposed to the packed order
    // at the end (a copy of the chunk's output, small beside its scores).
    let mut output = vec![0f32; heads * len * head_dim];
    output.par_chunks_mut(len * head_dim).enumerate().for_each(|(head, rows)| {
        rows.par_chunks_mut(BLOCK * head_dim).enumerate().for_each(|(block, rows)| {
            shape.attend_block(queries, &keys, &values, head, block * BLOCK, rows);
        });
    });
    scratch::keep(&KEYS_TRANSPOSED, transposed, KEPT_TRANSPOSED_VALUES);
    scratch::keep(&VALUES_COPIED, copied, KEPT_TRANSPOSED_VALUES);
    drop((q_storage, k_storage, v_storage));
    let output = Tensor::from_vec(output, (heads, len, head_dim), q.device())?;
    output.transpose(0, 1)?.contiguous()?.reshape((len, 1, heads, head_dim)).map(Some)
}

/// The chunk's dimensions.
struct Shape {
    /// The chunk's first position: how many cached positions come before it.
    start: usize,
    heads: usize,
    /// Query heads per key/value head.
    group: usize,
    head_dim: usize,
}

/// One layer's values of a sequence as `kv_heads` runs of `total` rows of `head_dim` contiguous values.
struct HeadRows<'a> {
    data: &'a [f32],
    head_stride: usize,
    head_dim: usize,
}

impl HeadRows<'_> {
    /// The first `rows` rows of `head`.
    fn rows(&self, head: usize, rows: usize) -> &[f32] {
        &self.data[head * self.head_stride..][..rows * self.head_dim]
    }
}

impl Shape {
    /// Attention of query head `head` at chunk positions `first..`, one position per `head_dim` values of `output`.
    fn attend_block(
        &self,
        queries: &[f32],
        keys: &TransposedKeys<'_>,
        values: &HeadRows<'_>,
        head: usize,
        first: usize,
        output: &mut [f32],
    ) {
        let d = self.head_dim;
        let rows = output.len() / d;
        let row_stride = self.heads * d;
        // Every key the block's last position may see; earlier rows see fewer.
        let visible = self.start + first + rows;
        let kv_head = head / self.group;
        let (keys, values) = (keys.head(kv_head), values.rows(kv_head, visible));
        let query = &queries[first * row_stride + head * d..][..(rows - 1) * row_stride + d];
        SCORES.with_borrow_mut(|scores| {
            scores.clear();
            scores.resize(rows * visible, 0.0);
            // scores = (q · Kᵀ) / √d: `rows × visible`, the first `visible` columns of the transposed keys.
            // SAFETY: every operand is a slice holding exactly what the strides reach: `query` `rows` rows
            // `row_stride` apart, `keys` `d` rows of `total ≥ visible`, `scores` `rows × visible`; `scores` is not aliased.
            #[allow(unsafe_code)]
            unsafe {
                gemm::gemm(
                    rows,
                    visible,
                    d,
                    scores.as_mut_ptr(),
                    1,
                    visible as isize,
                    false,
                    query.as_ptr(),
                    1,
                    row_stride as isize,
                    keys.as_ptr(),
                    1,
                    (keys.len() / d) as isize,
                    0.0,
                    1.0 / (d as f32).sqrt(),
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
            for (row, scores) in scores.chunks_exact_mut(visible).enumerate() {
                let (seen, hidden) = scores.split_at_mut(self.start + first + row + 1);
                // A NaN or infinite score (an overflowing adapter) makes the whole row NaN, as candle's softmax does.
                vector::softmax_in_place(seen);
                hidden.fill(0.0);
            }
            // output = weights · V: `rows × d`.
            // SAFETY: as above: `scores` `rows × visible`, `values` `visible` rows of `d`, `output` `rows × d`, not
            // aliased.
            #[allow(unsafe_code)]
            unsafe {
                gemm::gemm(
                    rows,
                    d,
                    visible,
                    output.as_mut_ptr(),
                    1,
                    d as isize,
                    false,
                    scores.as_ptr(),
                    1,
                    visible as isize,
                    values.as_ptr(),
                    1,
                    d as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;
    use crate::model::kv_cache::BLOCK_SIZE;

    /// Deterministic values in −2..2.
    fn values(count: usize, seed: usize) -> Vec<f32> {
        (0..count).map(|i| ((i * seed + 7) % 97) as f32 / 24.0 - 2.0).collect()
    }

    /// A storage of `blocks` blocks of `width` values per slot, and a table of `len` positions over blocks in a
    /// scrambled order.
    fn storage(blocks: usize, width: usize, len: usize) -> (Vec<f32>, Vec<f32>, Vec<u32>) {
        let slots = blocks * BLOCK_SIZE * width;
        let table = (0..len.div_ceil(BLOCK_SIZE) as u32).map(|b| (b * 7 + 2) % blocks as u32).collect();
        (values(slots, 17), values(slots, 53), table)
    }

    /// The attention of chunk position `i`, query head `h`, in f64 and loops: the definition.
    fn reference(
        q: &[f32],
        (keys, values, table): (&[f32], &[f32], &[u32]),
        (heads, kv_heads, head_dim): (usize, usize, usize),
        (offset, start): (usize, usize),
        i: usize,
        h: usize,
    ) -> Vec<f64> {
        let kv = h / (heads / kv_heads);
        let query = &q[((offset + i) * heads + h) * head_dim..][..head_dim];
        let slot = |p: usize| table[p / BLOCK_SIZE] as usize * BLOCK_SIZE + p % BLOCK_SIZE;
        let row = |data: &[f32], p: usize| data[(slot(p) * kv_heads + kv) * head_dim..][..head_dim].to_vec();
        let scores: Vec<f64> = (0..=start + i)
            .map(|j| {
                let key = row(keys, j);
                query.iter().zip(&key).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>()
                    / (head_dim as f64).sqrt()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = weights.iter().sum();
        (0..head_dim)
            .map(|c| weights.iter().enumerate().map(|(j, w)| w / sum * f64::from(row(values, j)[c])).sum())
            .collect()
    }

    #[test]
    fn equals_the_definition_for_chunks_shorter_and_longer_than_a_block_over_scattered_blocks() {
        let device = Device::Cpu;
        for (heads, kv_heads, head_dim, start, len, offset) in
            [(9, 3, 64, 0, 5, 0), (9, 3, 64, 37, 40, 3), (4, 4, 8, 0, 16, 2), (6, 2, 16, 100, 33, 0)]
        {
            let tokens = offset + len + 2;
            let width = kv_heads * head_dim;
            let (k_values, v_values, table) = storage(20, width, start + len);
            let q_values = values(tokens * heads * head_dim, 31);
            let q = Tensor::from_vec(q_values.clone(), (tokens, heads, 1, head_dim), &device).expect("q");
            let layer = LayerKv {
                keys: Tensor::from_vec(k_values.clone(), (20 * BLOCK_SIZE, width), &device).expect("keys"),
                values: Tensor::from_vec(v_values.clone(), (20 * BLOCK_SIZE, width), &device).expect("values"),
            };
            let sequence = SequenceView { blocks: &table, len: start + len };
            let output =
                causal_chunk_attention(&q, offset, len, sequence, &layer, kv_heads).expect("attention").expect("taken");
            assert_eq!(output.dims(), &[len, 1, heads, head_dim]);
            let output = output.flatten_all().and_then(|o| o.to_vec1::<f32>()).expect("output");
            let dims = (heads, kv_heads, head_dim);
            for i in 0..len {
                for h in 0..heads {
                    let want = reference(&q_values, (&k_values, &v_values, &table), dims, (offset, start), i, h);
                    let got = &output[(i * heads + h) * head_dim..][..head_dim];
                    for (got, want) in got.iter().zip(&want) {
                        assert!((f64::from(*got) - want).abs() < 1e-5, "{got} vs {want} at {i}, head {h}, {dims:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_nan_query_spoils_only_its_own_rows_and_other_dtypes_are_left_to_gathering() {
        let device = Device::Cpu;
        let (heads, kv_heads, head_dim, len) = (2, 1, 8, 20);
        let mut q_values = values(len * heads * head_dim, 13);
        q_values[(3 * heads + 1) * head_dim] = f32::NAN;
        let q = Tensor::from_vec(q_values, (len, heads, 1, head_dim), &device).expect("q");
        let (k_values, _, table) = storage(4, head_dim, len);
        let cache = Tensor::from_vec(k_values, (4 * BLOCK_SIZE, head_dim), &device).expect("kv");
        let layer = LayerKv { keys: cache.clone(), values: cache };
        let sequence = SequenceView { blocks: &table, len };
        let output = causal_chunk_attention(&q, 0, len, sequence, &layer, kv_heads).expect("attention").expect("taken");
        let output = output.flatten_all().and_then(|o| o.to_vec1::<f32>()).expect("output");
        for (at, value) in output.iter().enumerate() {
            let (position, head) = (at / (heads * head_dim), at / head_dim % heads);
            assert_eq!(value.is_nan(), (position, head) == (3, 1), "{value} at position {position}, head {head}");
        }
        let half = LayerKv {
            keys: layer.keys.to_dtype(DType::F16).expect("f16"),
            values: layer.values.to_dtype(DType::F16).expect("f16"),
        };
        let q = q.to_dtype(DType::F16).expect("f16");
        assert!(causal_chunk_attention(&q, 0, len, sequence, &half, kv_heads).expect("attention").is_none());
    }
}
