//! [`super::attend`]'s AVX-512 body, for heads of 32, 64 or 128 values (two, four or eight 16-lane vectors).
//!
//! Block by block of the sequence (up to 16 positions, contiguous slots): for each query head of the group, the 16
//! keys' products with the query as 16 vectors of partial sums (one independent FMA chain per key, the query held in
//! registers), folded into one vector of 16 scores by a transposing tree of 15 adds; after the softmax, again block
//! by block, each query head's weighted sum of the block's values, in two sets of accumulators (even and odd
//! positions) held in registers across the block. A block's keys or values (16 × 64 values: 4 KB) are read from
//! memory once and from the first-level cache by the group's other heads.
//!
//! The intrinsics on registers are safe functions inside a function compiled with AVX-512 F; the loads and stores
//! go through [`load`] and [`store`], which check their slice's length. Entering the body compiled with AVX-512 F
//! is the one other `unsafe` block, behind [`Avx512`], a token made only after the run-time check.

use std::arch::x86_64::{
    __m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps,
    _mm512_shuffle_f32x4, _mm512_shuffle_ps, _mm512_storeu_ps, _mm512_unpackhi_ps, _mm512_unpacklo_ps,
};

use super::{BLOCK_SIZE, Task, vector};

/// Lanes of one AVX-512 vector of `f32`.
const LANES: usize = 16;

// The score tree folds exactly one block of keys into one vector.
const _: () = assert!(BLOCK_SIZE == LANES);

/// A token: made only by [`Avx512::try_new`], so holding one proves the CPU has AVX-512 F.
#[derive(Clone, Copy)]
pub(super) struct Avx512 {
    _checked: (),
}

impl Avx512 {
    /// The run-time check; `None` where the CPU lacks AVX-512 F.
    pub(super) fn try_new() -> Option<Self> {
        std::arch::is_x86_feature_detected!("avx512f").then_some(Self { _checked: () })
    }

    /// Whether this body serves heads of `head_dim` values.
    pub(super) fn serves(head_dim: usize) -> bool {
        matches!(head_dim, 32 | 64 | 128)
    }

    /// Runs `task` (whose heads [`Self::serves`]) compiled with AVX-512 F.
    #[allow(unsafe_code)]
    pub(super) fn attend(self, task: Task<'_, '_>) {
        // SAFETY: `attend` only needs the CPU to have AVX-512 F, and `self` exists only once `Avx512::try_new` has
        // detected it at run time.
        unsafe {
            match task.cache.head_dim / LANES {
                2 => attend::<2>(task),
                4 => attend::<4>(task),
                8 => attend::<8>(task),
                other => unreachable!("heads of {other} vectors are not served"),
            }
        }
    }
}

/// The first 16 values of `values`.
#[inline]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
fn load(values: &[f32]) -> __m512 {
    let values = &values[..LANES];
    // SAFETY: the pointer is valid for reading 16 values (the slice was just cut to them); the load is unaligned.
    unsafe { _mm512_loadu_ps(values.as_ptr()) }
}

/// Writes `vector` into the first 16 values of `values`.
#[inline]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
fn store(values: &mut [f32], vector: __m512) {
    let values = &mut values[..LANES];
    // SAFETY: the pointer is valid for writing 16 values (the slice was just cut to them) and nothing else
    // borrows them; the store is unaligned.
    unsafe { _mm512_storeu_ps(values.as_mut_ptr(), vector) }
}

/// Lane `i` of the result is the sum of the 16 lanes of `vectors[i]`: a transposing tree of 15 adds (pairs within
/// 128-bit lanes, then quads, then across the 128-bit lanes).
#[inline]
#[target_feature(enable = "avx512f")]
fn sum_lanes(vectors: &[__m512; LANES]) -> __m512 {
    let pairs: [__m512; 8] = std::array::from_fn(|i| {
        let (a, b) = (vectors[2 * i], vectors[2 * i + 1]);
        // Per 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
        _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
    });
    let quads: [__m512; 4] = std::array::from_fn(|i| {
        let (a, b) = (pairs[2 * i], pairs[2 * i + 1]);
        // Per 128-bit lane: the lane's partial sums of vectors 4i..4i + 4, in order.
        _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(a, b), _mm512_shuffle_ps::<0b11_10_11_10>(a, b))
    });
    let halves: [__m512; 2] = std::array::from_fn(|i| {
        let (a, b) = (quads[2 * i], quads[2 * i + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(a, b), _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b))
    });
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(halves[0], halves[1]),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(halves[0], halves[1]),
    )
}

/// The task, for heads of `CHUNKS` vectors.
#[target_feature(enable = "avx512f")]
fn attend<const CHUNKS: usize>(task: Task<'_, '_>) {
    let Task { cache, sequence, kv_head, query, out, scores } = task;
    let d = cache.head_dim;
    let (width, column) = (cache.width, kv_head * d);
    let group = query.len() / d;
    // Each query head's scores, padded to whole blocks so that every block stores all 16 lanes.
    let padded = sequence.len.next_multiple_of(LANES);
    scores.clear();
    scores.resize(group * padded, 0.0);
    let scale = _mm512_set1_ps(1.0 / (d as f32).sqrt());
    let mut position = 0;
    for (first, count) in sequence.runs() {
        let keys = &cache.keys[first * width + column..][..(count - 1) * width + d];
        for (g, query) in query.chunks_exact(d).enumerate() {
            let query: [__m512; CHUNKS] = std::array::from_fn(|c| load(&query[c * LANES..]));
            let mut products = [_mm512_setzero_ps(); LANES];
            for (at, product) in products.iter_mut().enumerate().take(count) {
                let key = &keys[at * width..][..d];
                let mut sum = _mm512_mul_ps(query[0], load(key));
                for (c, query) in query.iter().enumerate().skip(1) {
                    sum = _mm512_fmadd_ps(*query, load(&key[c * LANES..]), sum);
                }
                *product = sum;
            }
            store(&mut scores[g * padded + position..], _mm512_mul_ps(sum_lanes(&products), scale));
        }
        position += count;
    }
    for row in scores.chunks_exact_mut(padded) {
        // A NaN or infinite score (an overflowing adapter) makes the whole row NaN, as candle's softmax does.
        vector::softmax_in_place(&mut row[..sequence.len]);
    }
    out.fill(0.0);
    let mut position = 0;
    for (first, count) in sequence.runs() {
        let values = &cache.values[first * width + column..][..(count - 1) * width + d];
        for (g, out) in out.chunks_exact_mut(d).enumerate() {
            let weights = &scores[g * padded + position..][..count];
            // Even positions into `even`, odd ones into `odd`: two independent chains per vector.
            let mut even: [__m512; CHUNKS] = std::array::from_fn(|c| load(&out[c * LANES..]));
            let mut odd = [_mm512_setzero_ps(); CHUNKS];
            for (pair, weights) in weights.chunks(2).enumerate() {
                let value = &values[2 * pair * width..][..d];
                let weight = _mm512_set1_ps(weights[0]);
                for (c, sum) in even.iter_mut().enumerate() {
                    *sum = _mm512_fmadd_ps(weight, load(&value[c * LANES..]), *sum);
                }
                if let Some(&weight) = weights.get(1) {
                    let value = &values[(2 * pair + 1) * width..][..d];
                    let weight = _mm512_set1_ps(weight);
                    for (c, sum) in odd.iter_mut().enumerate() {
                        *sum = _mm512_fmadd_ps(weight, load(&value[c * LANES..]), *sum);
                    }
                }
            }
            for (c, (even, odd)) in even.into_iter().zip(odd).enumerate() {
                store(&mut out[c * LANES..], _mm512_add_ps(even, odd));
            }
        }
        position += count;
    }
}
