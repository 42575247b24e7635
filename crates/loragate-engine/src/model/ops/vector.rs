//! Row kernels with a vectorised `exp`: a softmax, a log-softmax and SwiGLU's `silu(gate)·up`, each over one slice.
//! On the CPU these run once per score, logit and MLP activation of every step, and the C library's scalar `expf`
//! made the softmax of a long prompt's attention scores a tenth of its prefill. With AVX2 and FMA (checked at run
//! time by `pulp`, whose intrinsics are safe functions) eight values go through Cephes' `expf` polynomial at once:
//! within two units in the last place of `f32::exp` on `[-87.3, 88.37]`, flushed to zero below. Other
//! CPUs, and the tails of fewer than eight values, run the scalar loop.
//!
//! Non-finite inputs behave as the scalar code does: a NaN or infinite score or logit makes its whole row NaN.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::__m256;

/// Lanes of one AVX2 vector of `f32`.
#[cfg(target_arch = "x86_64")]
const LANES: usize = 8;

/// `row ← softmax(row)`: `exp(x − max) / Σ exp(x − max)`.
pub(crate) fn softmax_in_place(row: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        return simd.vectorize(Softmax { simd, row });
    }
    softmax_scalar(row);
}

/// `row ← log_softmax(row)`: `(x − max) − ln Σ exp(x − max)`, in that order (adding `max` and the logarithm first
/// would round the logprobs near 0 at the logits' magnitude), the sum accumulated in f64.
pub(crate) fn log_softmax_in_place(row: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        return simd.vectorize(LogSoftmax { simd, row });
    }
    log_softmax_scalar(row);
}

/// `gate ← silu(gate) · up = gate / (1 + exp(−gate)) · up`, element by element.
pub(crate) fn silu_mul_in_place(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu·up of {} and {} values", gate.len(), up.len());
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        return simd.vectorize(SiluMul { simd, gate, up });
    }
    silu_mul_scalar(gate, up);
}

fn max_scalar(values: &[f32]) -> f32 {
    values.iter().fold(f32::NEG_INFINITY, |max, &value| max.max(value))
}

fn softmax_scalar(row: &mut [f32]) {
    let max = max_scalar(row);
    let mut sum = 0.0;
    for value in row.iter_mut() {
        *value = (*value - max).exp();
        sum += *value;
    }
    let scale = 1.0 / sum;
    row.iter_mut().for_each(|value| *value *= scale);
}

fn log_softmax_scalar(row: &mut [f32]) {
    let max = max_scalar(row);
    let sum: f64 = row.iter().map(|&x| f64::from((x - max).exp())).sum();
    let ln_sum = sum.ln() as f32;
    row.iter_mut().for_each(|x| *x = (*x - max) - ln_sum);
}

fn silu_mul_scalar(gate: &mut [f32], up: &[f32]) {
    for (gate, up) in gate.iter_mut().zip(up) {
        *gate = *gate / (1.0 + (-*gate).exp()) * up;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use pulp::x86::V3;

    /// `exp` of eight values: Cephes' `expf` (`exp(x) = 2ⁿ·exp(r)`, `n = round(x·log₂e)`, `r = x − n·ln 2` in two
    /// parts, `exp(r)` by a degree-5 polynomial), the input clamped to ±88.376 first (so `exp` of 88.38–88.72 is
    /// short of `f32::exp`'s; no caller goes there: softmax inputs are ≤ 0, and silu's sigmoid is below 1e-38 where
    /// `exp(−x)` is that large). The clamps take the input as their second operand, which `vminps`/`vmaxps` return
    /// when it is NaN: a NaN stays NaN.
    #[inline(always)]
    pub(super) fn exp(simd: V3, x: __m256) -> __m256 {
        let (avx, avx2, fma) = (simd.avx, simd.avx2, simd.fma);
        let x = avx._mm256_min_ps(avx._mm256_set1_ps(88.376_26), x);
        let x = avx._mm256_max_ps(avx._mm256_set1_ps(-88.376_26), x);
        let n = avx._mm256_floor_ps(fma._mm256_fmadd_ps(
            x,
            avx._mm256_set1_ps(std::f32::consts::LOG2_E),
            avx._mm256_set1_ps(0.5),
        ));
        let r = fma._mm256_fnmadd_ps(n, avx._mm256_set1_ps(0.693_359_4), x);
        let r = fma._mm256_fnmadd_ps(n, avx._mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = avx._mm256_set1_ps(1.987_569_1e-4);
        for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
            p = fma._mm256_fmadd_ps(p, r, avx._mm256_set1_ps(c));
        }
        let p = fma._mm256_fmadd_ps(p, avx._mm256_mul_ps(r, r), avx._mm256_add_ps(r, avx._mm256_set1_ps(1.0)));
        // 2ⁿ by building its exponent bits; n = −127 (the clamp's low end) gives +0.
        let biased = avx2._mm256_add_epi32(avx._mm256_cvttps_epi32(n), avx._mm256_set1_epi32(127));
        avx._mm256_mul_ps(p, avx._mm256_castsi256_ps(avx2._mm256_slli_epi32::<23>(biased)))
    }

    #[inline(always)]
    pub(super) fn load(values: &[f32]) -> __m256 {
        bytemuck::pod_read_unaligned(bytemuck::cast_slice(&values[..LANES]))
    }

    #[inline(always)]
    pub(super) fn store(values: &mut [f32], vector: __m256) {
        values[..LANES].copy_from_slice(&bytemuck::cast::<__m256, [f32; LANES]>(vector));
    }

    /// The largest value, NaN ignored (as `f32::max` does in the scalar code; the `exp` pass spreads the NaN).
    #[inline(always)]
    pub(super) fn max(simd: V3, row: &[f32]) -> f32 {
        let mut max = simd.avx._mm256_set1_ps(f32::NEG_INFINITY);
        let chunks = row.chunks_exact(LANES);
        let tail = max_scalar(chunks.remainder());
        for chunk in chunks {
            max = simd.avx._mm256_max_ps(load(chunk), max);
        }
        bytemuck::cast::<__m256, [f32; LANES]>(max).into_iter().fold(tail, f32::max)
    }
}

/// [`softmax_in_place`]'s AVX2 body (`pulp` compiles a struct's `call` with the features enabled).
#[cfg(target_arch = "x86_64")]
struct Softmax<'a> {
    simd: pulp::x86::V3,
    row: &'a mut [f32],
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for Softmax<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let Self { simd, row } = self;
        let avx = simd.avx;
        let max = avx2::max(simd, row);
        let shift = avx._mm256_set1_ps(max);
        let mut sums = avx._mm256_setzero_ps();
        let mut chunks = row.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            let e = avx2::exp(simd, avx._mm256_sub_ps(avx2::load(chunk), shift));
            sums = avx._mm256_add_ps(sums, e);
            avx2::store(chunk, e);
        }
        let mut sum = 0.0;
        for value in chunks.into_remainder() {
            *value = (*value - max).exp();
            sum += *value;
        }
        let sum = bytemuck::cast::<__m256, [f32; LANES]>(sums).into_iter().fold(sum, |a, b| a + b);
        let scale = avx._mm256_set1_ps(1.0 / sum);
        let mut chunks = row.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            avx2::store(chunk, avx._mm256_mul_ps(avx2::load(chunk), scale));
        }
        chunks.into_remainder().iter_mut().for_each(|value| *value *= 1.0 / sum);
    }
}

/// [`log_softmax_in_place`]'s AVX2 body.
#[cfg(target_arch = "x86_64")]
struct LogSoftmax<'a> {
    simd: pulp::x86::V3,
    row: &'a mut [f32],
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for LogSoftmax<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let Self { simd, row } = self;
        let avx = simd.avx;
        let max = avx2::max(simd, row);
        let shift = avx._mm256_set1_ps(max);
        // Eight f32 terms at a time, each vector's sum widened into two f64 accumulators.
        let (mut low, mut high) = (avx._mm256_setzero_pd(), avx._mm256_setzero_pd());
        let chunks = row.chunks_exact(LANES);
        let mut sum: f64 = chunks.remainder().iter().map(|&x| f64::from((x - max).exp())).sum();
        for chunk in chunks {
            let e = avx2::exp(simd, avx._mm256_sub_ps(avx2::load(chunk), shift));
            low = avx._mm256_add_pd(low, avx._mm256_cvtps_pd(avx._mm256_castps256_ps128(e)));
            high = avx._mm256_add_pd(high, avx._mm256_cvtps_pd(avx._mm256_extractf128_ps::<1>(e)));
        }
        sum += bytemuck::cast::<_, [f64; 4]>(avx._mm256_add_pd(low, high)).into_iter().sum::<f64>();
        let ln_sum = sum.ln() as f32;
        let offset = avx._mm256_set1_ps(ln_sum);
        let mut chunks = row.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            avx2::store(chunk, avx._mm256_sub_ps(avx._mm256_sub_ps(avx2::load(chunk), shift), offset));
        }
        chunks.into_remainder().iter_mut().for_each(|x| *x = (*x - max) - ln_sum);
    }
}

/// [`silu_mul_in_place`]'s AVX2 body.
#[cfg(target_arch = "x86_64")]
struct SiluMul<'a> {
    simd: pulp::x86::V3,
    gate: &'a mut [f32],
    up: &'a [f32],
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for SiluMul<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let Self { simd, gate, up } = self;
        let avx = simd.avx;
        let (one, sign) = (avx._mm256_set1_ps(1.0), avx._mm256_set1_ps(-0.0));
        let mut gates = gate.chunks_exact_mut(LANES);
        let mut ups = up.chunks_exact(LANES);
        for (gate, up) in (&mut gates).zip(&mut ups) {
            let x = avx2::load(gate);
            let sigmoid = avx._mm256_div_ps(one, avx._mm256_add_ps(one, avx2::exp(simd, avx._mm256_xor_ps(x, sign))));
            avx2::store(gate, avx._mm256_mul_ps(avx._mm256_mul_ps(x, sigmoid), avx2::load(up)));
        }
        silu_mul_scalar(gates.into_remainder(), ups.remainder());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values from −100 to 100 and the edges of `exp`'s range, in an order that puts every kind in a vector lane
    /// and in a tail.
    fn inputs() -> Vec<f32> {
        let mut values: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) / 20.0).collect();
        values.extend([
            0.0,
            -0.0,
            1e-8,
            -1e-8,
            88.0,
            88.37,
            -87.0,
            -87.3,
            std::f32::consts::LN_2,
            -std::f32::consts::LN_2,
            3.0,
        ]);
        values
    }

    #[test]
    fn the_vector_exp_is_within_two_ulps_of_the_c_librarys() {
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V3::try_new() {
            struct Exp<'a>(pulp::x86::V3, &'a [f32]);
            impl pulp::NullaryFnOnce for Exp<'_> {
                type Output = Vec<f32>;
                fn call(self) -> Vec<f32> {
                    self.1
                        .chunks_exact(LANES)
                        .flat_map(|chunk| bytemuck::cast::<__m256, [f32; LANES]>(avx2::exp(self.0, avx2::load(chunk))))
                        .collect()
                }
            }
            let x: Vec<f32> = inputs().into_iter().filter(|x| (-87.3..=88.37).contains(x)).collect();
            let x = &x[..x.len() / LANES * LANES];
            let got = simd.vectorize(Exp(simd, x));
            for (x, got) in x.iter().zip(got) {
                let want = x.exp();
                let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
                assert!(ulps <= 2, "exp({x}) = {got}, the C library says {want} ({ulps} ulps)");
            }
        }
    }

    #[test]
    fn softmax_log_softmax_and_silu_agree_with_f64_references() {
        for len in [1, 7, 8, 9, 100, 4012] {
            let x: Vec<f32> = inputs().into_iter().cycle().skip(len * 3).take(len).map(|x| x / 10.0).collect();
            let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
            let sum: f64 = x.iter().map(|&v| (f64::from(v) - max).exp()).sum();

            let mut softmax = x.clone();
            softmax_in_place(&mut softmax);
            for (v, got) in x.iter().zip(&softmax) {
                let want = (f64::from(*v) - max).exp() / sum;
                assert!((f64::from(*got) - want).abs() <= 1e-5 * want, "softmax {got} vs {want} (len {len})");
            }

            let mut log_softmax = x.clone();
            log_softmax_in_place(&mut log_softmax);
            for (v, got) in x.iter().zip(&log_softmax) {
                let want = f64::from(*v) - max - sum.ln();
                assert!((f64::from(*got) - want).abs() <= 1e-5, "log_softmax {got} vs {want} (len {len})");
            }

            let up: Vec<f32> = x.iter().rev().copied().collect();
            let mut silu = x.clone();
            silu_mul_in_place(&mut silu, &up);
            for ((g, u), got) in x.iter().zip(&up).zip(&silu) {
                let (g, u) = (f64::from(*g), f64::from(*u));
                let want = g / (1.0 + (-g).exp()) * u;
                assert!((f64::from(*got) - want).abs() <= 1e-6 * want.abs() + 1e-30, "silu·up {got} vs {want}");
            }
        }
    }

    #[test]
    fn a_non_finite_value_spoils_its_whole_row_in_every_lane() {
        for spoiler in [f32::NAN, f32::INFINITY] {
            for at in [0, 5, 8, 18] {
                let mut row: Vec<f32> = (0..19).map(|i| i as f32 / 7.0).collect();
                row[at] = spoiler;
                let mut softmax = row.clone();
                softmax_in_place(&mut softmax);
                assert!(softmax.iter().all(|v| v.is_nan()), "softmax, {spoiler} at {at}: {softmax:?}");
                log_softmax_in_place(&mut row);
                assert!(row.iter().all(|v| v.is_nan()), "log_softmax, {spoiler} at {at}: {row:?}");
            }
        }
        let (mut gate, up) = (vec![1.0, f32::NAN, 2.0, 0.5, 0.0, -1.0, 3.0, 4.0, f32::NAN], vec![1.0; 9]);
        silu_mul_in_place(&mut gate, &up);
        assert!(gate[1].is_nan() && gate[8].is_nan(), "a NaN activation stays NaN: {gate:?}");
        assert!(gate.iter().enumerate().all(|(i, v)| i == 1 || i == 8 || v.is_finite()), "{gate:?}");
    }
}
