//! The AVX2 kernel, and its AVX-512 VNNI variant. Per block of a row group ([`ROW_GROUP`] weight rows): each row's 32 values as unsigned bytes
//! (nibbles unpacked, or Q8_0's absolute values with their signs moved onto the inputs), `vpmaddubsw` against the
//! 32 signed input bytes and `vpmaddwd` to eight 32-bit sums; three `vphaddd` and one add fold the four rows' sums
//! into one vector of four exact block products, converted and accumulated with the four rows' combined scales by
//! one FMA (and the offsets' `m·s` by another). One input row reads each group once; four input rows or more are
//! read in tiles of [`INPUT_TILE`] rows that share each unpacked group, every weight row streamed once per pass of
//! [`TILES_PER_PASS`] tiles. `pulp` checks the CPU at run time and compiles this code with AVX2 and FMA enabled; its
//! intrinsics are safe functions, and unaligned loads go through `bytemuck`.
//!
//! Where the CPU has AVX-512 VNNI (and VL), the same kernel is compiled with those features too and each row's
//! `vpmaddubsw` + `vpmaddwd` pair becomes one `vpdpbusd` on the same 256-bit vectors ([`Vnni`]): it sums the same
//! four byte products into each 32-bit lane, exactly, so both variants give bit-identical results. `pulp` (as the
//! workspace builds it) has no VNNI feature set or intrinsic, so [`Vnni`] holds this kernel's `unsafe`
//! blocks: entering the kernel compiled with those features, and the `vpdpbusd` calls, all behind a token made
//! only after the run-time check.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{__m128, __m128i, __m256, __m256i};

#[cfg(target_arch = "x86_64")]
use super::{BLOCK, ByteGroup, INPUT_TILE, NibbleGroup, ROW_GROUP, RowGroups};
use super::{QuantizedInput, QuantizedMatrix};

/// How far ahead of the block it multiplies [`single_nibbles`] asks for the weights: streaming a layer's small
/// matrices one after the other, one core keeps too few loads in flight with the hardware prefetchers alone (the
/// `products` benchmark: 30 layers of SmolLM2-135M's Q4_1 matrices in about a fifth less CPU time; the Q8_0 LM
/// head, one large matrix, got slower with it, so [`single`] has none).
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 2048;

/// Input tiles computed against each row group before the next: their blocks (a few kilobytes) stay in the
/// first-level cache while the groups stream past.
#[cfg(target_arch = "x86_64")]
const TILES_PER_PASS: usize = 4;

/// Computes what [`super::dot_rows_scalar`] computes, if the CPU has AVX2 and FMA; `false` otherwise.
#[cfg(target_arch = "x86_64")]
pub(super) fn dot_rows(matrix: &QuantizedMatrix, input: &QuantizedInput, first_row: usize, out_t: &mut [f32]) -> bool {
    let Some(simd) = pulp::x86::V3::try_new() else { return false };
    let dot = Maddubs;
    match &matrix.groups {
        RowGroups::Nibbles(groups) => simd.vectorize(Kernel { simd, dot, matrix, groups, input, first_row, out_t }),
        RowGroups::Bytes(groups) => simd.vectorize(Kernel { simd, dot, matrix, groups, input, first_row, out_t }),
    }
    true
}

/// Computes what [`super::dot_rows_scalar`] computes, if the CPU has AVX-512 VNNI, VL, AVX2 and FMA; `false`
/// otherwise.
#[cfg(target_arch = "x86_64")]
pub(super) fn dot_rows_vnni(
    matrix: &QuantizedMatrix,
    input: &QuantizedInput,
    first_row: usize,
    out_t: &mut [f32],
) -> bool {
    let (Some(dot), Some(simd)) = (Vnni::try_new(), pulp::x86::V3::try_new()) else { return false };
    match &matrix.groups {
        RowGroups::Nibbles(groups) => dot.vectorize(Kernel { simd, dot, matrix, groups, input, first_row, out_t }),
        RowGroups::Bytes(groups) => dot.vectorize(Kernel { simd, dot, matrix, groups, input, first_row, out_t }),
    }
    true
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn dot_rows(_: &QuantizedMatrix, _: &QuantizedInput, _: usize, _: &mut [f32]) -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn dot_rows_vnni(_: &QuantizedMatrix, _: &QuantizedInput, _: usize, _: &mut [f32]) -> bool {
    false
}

/// How a row's 32 unsigned bytes are multiplied with 32 signed input bytes.
#[cfg(target_arch = "x86_64")]
trait Dot: Copy {
    /// Eight 32-bit sums, lane `i` the exact sum of the products of bytes `4i..4i + 4` (no intermediate
    /// saturation for the values served here: unsigned bytes up to 128, signed ones within ±127).
    fn dot(self, simd: pulp::x86::V3, unsigned: __m256i, signed: __m256i) -> __m256i;

    /// Eight 32-bit sums, lane `i` the exact sum of the products of bytes `4i..4i + 4` of `low` with `x_low` and
    /// of `high` with `x_high`: two [`Dot::dot`]s added, for unsigned bytes up to 15 (nibbles), which lets the
    /// 16-bit pair sums of both be added before widening.
    fn dot_nibbles(self, simd: pulp::x86::V3, low: __m256i, x_low: __m256i, high: __m256i, x_high: __m256i) -> __m256i;
}

/// AVX2: `vpmaddubsw` to pairs in 16 bits (at most 2·128·127, no saturation), `vpmaddwd` by ones to quads.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Maddubs;

#[cfg(target_arch = "x86_64")]
impl Dot for Maddubs {
    #[inline(always)]
    fn dot(self, simd: pulp::x86::V3, unsigned: __m256i, signed: __m256i) -> __m256i {
        let pairs = simd.avx2._mm256_maddubs_epi16(unsigned, signed);
        simd.avx2._mm256_madd_epi16(pairs, simd.avx._mm256_set1_epi16(1))
    }

    /// Each 16-bit pair sum is at most 2·15·127 in magnitude, two of them 3,810 · 2: no saturation.
    #[inline(always)]
    fn dot_nibbles(self, simd: pulp::x86::V3, low: __m256i, x_low: __m256i, high: __m256i, x_high: __m256i) -> __m256i {
        let avx2 = simd.avx2;
        let pairs =
            avx2._mm256_add_epi16(avx2._mm256_maddubs_epi16(low, x_low), avx2._mm256_maddubs_epi16(high, x_high));
        avx2._mm256_madd_epi16(pairs, simd.avx._mm256_set1_epi16(1))
    }
}

/// AVX-512 VNNI: one `vpdpbusd`. A token: made only by [`Vnni::try_new`], so holding one proves the CPU has the
/// features [`Vnni::FEATURES`] names.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Vnni {
    _checked: (),
}

#[cfg(target_arch = "x86_64")]
impl Vnni {
    /// The run-time check; `None` where the CPU lacks a feature the kernel is compiled with.
    fn try_new() -> Option<Self> {
        let has = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni");
        has.then_some(Self { _checked: () })
    }

    /// Runs `kernel` compiled with AVX2, FMA and AVX-512 F/BW/VL/VNNI (what `pulp`'s `vectorize` does for its
    /// own feature sets, which do not include VNNI in the build the workspace uses).
    #[inline(always)]
    #[allow(unsafe_code)]
    fn vectorize<K: pulp::NullaryFnOnce<Output = ()>>(self, kernel: K) {
        #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
        fn compiled<K: pulp::NullaryFnOnce<Output = ()>>(kernel: K) {
            kernel.call();
        }
        // SAFETY: `compiled` only needs the CPU to have the features it is compiled with, and `self` exists only
        // once `Vnni::try_new` has detected every one of them at run time.
        unsafe { compiled(kernel) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Dot for Vnni {
    #[inline(always)]
    #[allow(unsafe_code)]
    fn dot(self, simd: pulp::x86::V3, unsigned: __m256i, signed: __m256i) -> __m256i {
        let zero = simd.avx._mm256_setzero_si256();
        // SAFETY: `_mm256_dpbusd_epi32` needs AVX-512 VNNI and VL, and reads only its three register arguments;
        // `self` exists only once `Vnni::try_new` has detected both on this CPU at run time (and the kernel is
        // compiled with them through `Vnni::vectorize`, so this call is inlined).
        unsafe { std::arch::x86_64::_mm256_dpbusd_epi32(zero, unsigned, signed) }
    }

    #[inline(always)]
    #[allow(unsafe_code)]
    fn dot_nibbles(self, simd: pulp::x86::V3, low: __m256i, x_low: __m256i, high: __m256i, x_high: __m256i) -> __m256i {
        let low = self.dot(simd, low, x_low);
        // SAFETY: as in `dot`: the features were detected when `self` was made.
        unsafe { std::arch::x86_64::_mm256_dpbusd_epi32(low, high, x_high) }
    }
}

/// What [`super::quantize_blocks_scalar`] computes, if the CPU has AVX2 and FMA; `None` otherwise.
#[cfg(target_arch = "x86_64")]
pub(super) fn quantize_blocks(x: &[f32], values: &mut [i8]) -> Option<Vec<(f32, i32)>> {
    let simd = pulp::x86::V3::try_new()?;
    Some(simd.vectorize(Quantize { simd, x, values }))
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn quantize_blocks(_: &[f32], _: &mut [i8]) -> Option<Vec<(f32, i32)>> {
    None
}

/// Input quantization's body (see [`Kernel`] for why a struct).
#[cfg(target_arch = "x86_64")]
struct Quantize<'a> {
    simd: pulp::x86::V3,
    x: &'a [f32],
    values: &'a mut [i8],
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for Quantize<'_> {
    type Output = Vec<(f32, i32)>;

    #[inline(always)]
    fn call(self) -> Vec<(f32, i32)> {
        let Self { simd, x, values } = self;
        let (avx, avx2, sse, sse2) = (simd.avx, simd.avx2, simd.sse, simd.sse2);
        let sign = avx._mm256_set1_ps(-0.0);
        // `vpackssdw` and `vpacksswb` interleave the 128-bit halves; this puts the 32 bytes back in order.
        let order = avx._mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let mut blocks = Vec::with_capacity(x.len() / BLOCK);
        for (block, out) in x.chunks_exact(BLOCK).zip(values.chunks_exact_mut(BLOCK)) {
            let v0: __m256 = bytemuck::pod_read_unaligned(bytemuck::cast_slice(&block[0..8]));
            let v1: __m256 = bytemuck::pod_read_unaligned(bytemuck::cast_slice(&block[8..16]));
            let v2: __m256 = bytemuck::pod_read_unaligned(bytemuck::cast_slice(&block[16..24]));
            let v3: __m256 = bytemuck::pod_read_unaligned(bytemuck::cast_slice(&block[24..32]));
            let max = avx._mm256_max_ps(
                avx._mm256_max_ps(avx._mm256_andnot_ps(sign, v0), avx._mm256_andnot_ps(sign, v1)),
                avx._mm256_max_ps(avx._mm256_andnot_ps(sign, v2), avx._mm256_andnot_ps(sign, v3)),
            );
            let max = sse._mm_max_ps(avx._mm256_castps256_ps128(max), avx._mm256_extractf128_ps::<1>(max));
            let max = sse._mm_max_ps(max, sse._mm_movehl_ps(max, max));
            let max = sse._mm_cvtss_f32(sse._mm_max_ss(max, sse._mm_shuffle_ps::<0b01>(max, max)));
            let inverse = avx._mm256_set1_ps(if max == 0.0 { 0.0 } else { 127.0 / max });
            // Round to nearest, ties to even, without raising exceptions.
            let quantize = |v| avx._mm256_cvtps_epi32(avx._mm256_round_ps::<0b1000>(avx._mm256_mul_ps(v, inverse)));
            let (q0, q1, q2, q3) = (quantize(v0), quantize(v1), quantize(v2), quantize(v3));
            let sum = avx2._mm256_add_epi32(avx2._mm256_add_epi32(q0, q1), avx2._mm256_add_epi32(q2, q3));
            let sum = sse2._mm_add_epi32(avx._mm256_castsi256_si128(sum), avx2._mm256_extracti128_si256::<1>(sum));
            let sum = sse2._mm_add_epi32(sum, sse2._mm_shuffle_epi32::<0b01_00_11_10>(sum));
            let sum = sse2._mm_add_epi32(sum, sse2._mm_shuffle_epi32::<0b10_11_00_01>(sum));
            let packed = avx2._mm256_packs_epi16(avx2._mm256_packs_epi32(q0, q1), avx2._mm256_packs_epi32(q2, q3));
            let bytes: [i8; BLOCK] = bytemuck::cast(avx2._mm256_permutevar8x32_epi32(packed, order));
            out.copy_from_slice(&bytes);
            blocks.push((max / 127.0, sse2._mm_cvtsi128_si32(sum)));
        }
        blocks
    }
}

/// A row group's block as the kernel reads it.
#[cfg(target_arch = "x86_64")]
trait Group: Copy {
    /// Whether the format has block offsets (`m·s` terms).
    const OFFSETS: bool;
    /// One row's values, ready for [`Group::products`].
    type Unpacked: Copy;

    fn unpack(&self, simd: pulp::x86::V3, row: usize) -> Self::Unpacked;
    /// Eight 32-bit partial sums of one row's products with 32 input values.
    fn products<D: Dot>(simd: pulp::x86::V3, dot: D, weights: Self::Unpacked, x: __m256i) -> __m256i;
    /// The four rows' scales and offsets (zero without offsets), in f32.
    fn scales_and_offsets(&self, simd: pulp::x86::V3) -> (__m128, __m128);

    /// The input row `input_row` alone against every group of `groups` (`out_t`'s): [`single`] unless the format
    /// has a faster way.
    #[inline(always)]
    fn single_row<D: Dot>(
        simd: pulp::x86::V3,
        dot: D,
        groups: &[Self],
        input: &QuantizedInput,
        input_row: usize,
        out_t: &mut [f32],
    ) {
        single(simd, dot, groups, input, input_row, out_t);
    }
}

/// Eight f16 values to f32, exactly for finite ones (the groups hold only those), with AVX2 alone (`pulp`'s AVX2
/// level has no F16C): the magnitude's bits shifted into f32's places are the value times 2⁻¹¹² (subnormal halves
/// included), so one multiplication by 2¹¹² rescales it, and the sign goes back on.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn halves_to_f32(simd: pulp::x86::V3, halves: __m128i) -> __m256 {
    let (avx, avx2) = (simd.avx, simd.avx2);
    let words = avx2._mm256_cvtepu16_epi32(halves);
    let sign = avx2._mm256_slli_epi32::<16>(avx2._mm256_and_si256(words, avx._mm256_set1_epi32(0x8000)));
    let magnitude = avx2._mm256_slli_epi32::<13>(avx2._mm256_and_si256(words, avx._mm256_set1_epi32(0x7FFF)));
    let scaled = avx._mm256_mul_ps(avx._mm256_castsi256_ps(magnitude), avx._mm256_set1_ps(f32::from_bits(0x7780_0000)));
    avx._mm256_or_ps(scaled, avx._mm256_castsi256_ps(sign))
}

#[cfg(target_arch = "x86_64")]
impl Group for NibbleGroup {
    const OFFSETS: bool = true;
    type Unpacked = __m256i;

    #[inline(always)]
    fn unpack(&self, simd: pulp::x86::V3, row: usize) -> __m256i {
        let bytes = bytemuck::cast(self.values[row]);
        let both = simd.avx._mm256_set_m128i(simd.sse2._mm_srli_epi16::<4>(bytes), bytes);
        simd.avx2._mm256_and_si256(both, simd.avx._mm256_set1_epi8(0x0F))
    }

    #[inline(always)]
    fn products<D: Dot>(simd: pulp::x86::V3, dot: D, weights: __m256i, x: __m256i) -> __m256i {
        dot.dot(simd, weights, x)
    }

    #[inline(always)]
    fn scales_and_offsets(&self, simd: pulp::x86::V3) -> (__m128, __m128) {
        let halves: __m128i = bytemuck::cast([self.scales, self.offsets]);
        let both = halves_to_f32(simd, halves);
        (simd.avx._mm256_castps256_ps128(both), simd.avx._mm256_extractf128_ps::<1>(both))
    }

    #[inline(always)]
    fn single_row<D: Dot>(
        simd: pulp::x86::V3,
        dot: D,
        groups: &[Self],
        input: &QuantizedInput,
        input_row: usize,
        out_t: &mut [f32],
    ) {
        single_nibbles(simd, dot, groups, input, input_row, out_t);
    }
}

#[cfg(target_arch = "x86_64")]
impl Group for ByteGroup {
    const OFFSETS: bool = false;
    /// The values' absolute values, and the values (whose signs go onto the inputs).
    type Unpacked = (__m256i, __m256i);

    #[inline(always)]
    fn unpack(&self, simd: pulp::x86::V3, row: usize) -> (__m256i, __m256i) {
        let signed: __m256i = bytemuck::cast(self.values[row]);
        (simd.avx2._mm256_sign_epi8(signed, signed), signed)
    }

    #[inline(always)]
    fn products<D: Dot>(simd: pulp::x86::V3, dot: D, (absolute, signed): (__m256i, __m256i), x: __m256i) -> __m256i {
        dot.dot(simd, absolute, simd.avx2._mm256_sign_epi8(x, signed))
    }

    #[inline(always)]
    fn scales_and_offsets(&self, simd: pulp::x86::V3) -> (__m128, __m128) {
        let halves: __m128i = bytemuck::cast([self.scales, self.scales]);
        (simd.avx._mm256_castps256_ps128(halves_to_f32(simd, halves)), simd.sse._mm_setzero_ps())
    }
}

/// The four rows' block products with one input block, summed exactly: `[Σ row 0, Σ row 1, Σ row 2, Σ row 3]`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn block_products<G: Group, D: Dot>(
    simd: pulp::x86::V3,
    dot: D,
    weights: &[G::Unpacked; ROW_GROUP],
    x: __m256i,
) -> __m128 {
    let products = |row: usize| G::products(simd, dot, weights[row], x);
    let sums01 = simd.avx2._mm256_hadd_epi32(products(0), products(1));
    let sums23 = simd.avx2._mm256_hadd_epi32(products(2), products(3));
    // [row 0, row 1, row 2, row 3] from the low and from the high 128 bits.
    let halves = simd.avx2._mm256_hadd_epi32(sums01, sums23);
    let sums = simd
        .sse2
        ._mm_add_epi32(simd.avx._mm256_castsi256_si128(halves), simd.avx2._mm256_extracti128_si256::<1>(halves));
    simd.sse2._mm_cvtepi32_ps(sums)
}

/// The kernel's body, a struct rather than a closure so that it is inlined into the function `pulp` compiles with
/// AVX2 enabled (`#[inline(always)]` on [`pulp::NullaryFnOnce::call`]).
#[cfg(target_arch = "x86_64")]
struct Kernel<'a, G, D> {
    simd: pulp::x86::V3,
    dot: D,
    matrix: &'a QuantizedMatrix,
    groups: &'a [G],
    input: &'a QuantizedInput,
    first_row: usize,
    out_t: &'a mut [f32],
}

#[cfg(target_arch = "x86_64")]
impl<G: Group, D: Dot> pulp::NullaryFnOnce for Kernel<'_, G, D> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let Self { simd, dot, matrix, groups, input, first_row, out_t } = self;
        let blocks = matrix.blocks_per_row();
        let (first, count) = (first_row / ROW_GROUP, out_t.len() / input.rows / ROW_GROUP);
        let groups = &groups[first * blocks..(first + count) * blocks];
        if input.rows < INPUT_TILE {
            for input_row in 0..input.rows {
                G::single_row(simd, dot, groups, input, input_row, out_t);
            }
        } else {
            tiles(simd, dot, groups, input, out_t);
        }
    }
}

/// The input row `input_row` alone against every group of `groups` (`out_t`'s): a decode step of one sequence,
/// bound by reading the weights once.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn single<G: Group, D: Dot>(
    simd: pulp::x86::V3,
    dot: D,
    groups: &[G],
    input: &QuantizedInput,
    input_row: usize,
    out_t: &mut [f32],
) {
    let blocks = input.blocks_per_row;
    let row_blocks = input_row * blocks..(input_row + 1) * blocks;
    let values: &[u8] = bytemuck::cast_slice(&input.values[row_blocks.start * BLOCK..row_blocks.end * BLOCK]);
    let (scales, sums) = (&input.scales[row_blocks.clone()], &input.sums[row_blocks]);
    for (group, out) in groups.chunks_exact(blocks).zip(out_t.chunks_exact_mut(ROW_GROUP * input.rows)) {
        let mut total = simd.sse._mm_setzero_ps();
        for (((block, x), &x_scale), &x_sum) in group.iter().zip(values.chunks_exact(BLOCK)).zip(scales).zip(sums) {
            let x: __m256i = bytemuck::pod_read_unaligned(x);
            let weights = [block.unpack(simd, 0), block.unpack(simd, 1), block.unpack(simd, 2), block.unpack(simd, 3)];
            let (scales, offsets) = block.scales_and_offsets(simd);
            let combined = simd.sse._mm_mul_ps(scales, simd.sse._mm_set1_ps(x_scale));
            total = simd.fma._mm_fmadd_ps(block_products::<G, D>(simd, dot, &weights, x), combined, total);
            if G::OFFSETS {
                total = simd.fma._mm_fmadd_ps(offsets, simd.sse._mm_set1_ps(x_sum), total);
            }
        }
        let total: [f32; ROW_GROUP] = bytemuck::cast(total);
        for (row, value) in total.into_iter().enumerate() {
            out[row * input.rows + input_row] = value;
        }
    }
}

/// [`single`] for the nibble formats, with fewer operations per block (a decode step of one sequence spends most of
/// its time here, and one core runs it more slowly than memory delivers the weights): two rows' packed values are
/// one 256-bit load, whose low nibbles are multiplied with the input's first 16 values held in both 128-bit lanes
/// and whose high nibbles with its last 16, the two 16-bit pair sums added before widening ([`Dot::dot_nibbles`]);
/// each pair of rows accumulates its four partial sums per row, scaled by its own combined scales, in one vector,
/// reduced once per row group rather than once per block; the offsets' `m·s` accumulate in a vector of their own.
/// The integer sums are those of [`single`]; only the order of the f32 additions differs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn single_nibbles<D: Dot>(
    simd: pulp::x86::V3,
    dot: D,
    groups: &[NibbleGroup],
    input: &QuantizedInput,
    input_row: usize,
    out_t: &mut [f32],
) {
    let (sse, avx, avx2, fma) = (simd.sse, simd.avx, simd.avx2, simd.fma);
    let blocks = input.blocks_per_row;
    let row_blocks = input_row * blocks..(input_row + 1) * blocks;
    let values: &[u8] = bytemuck::cast_slice(&input.values[row_blocks.start * BLOCK..row_blocks.end * BLOCK]);
    let (scales, sums) = (&input.scales[row_blocks.clone()], &input.sums[row_blocks]);
    // Each input block's first and last 16 values, each in both 128-bit lanes.
    let halves: Vec<[__m256i; 2]> = values
        .chunks_exact(BLOCK)
        .map(|x| {
            let x: __m256i = bytemuck::pod_read_unaligned(x);
            [avx2._mm256_permute4x64_epi64::<0b01_00_01_00>(x), avx2._mm256_permute4x64_epi64::<0b11_10_11_10>(x)]
        })
        .collect();
    let nibble = avx._mm256_set1_epi8(0x0F);
    // Lanes of the combined scales `[row 0, row 1, row 2, row 3]`: rows 0 and 1's, rows 2 and 3's, four each.
    let (rows_01, rows_23) =
        (avx._mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), avx._mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3));
    for (group, out) in groups.chunks_exact(blocks).zip(out_t.chunks_exact_mut(ROW_GROUP * input.rows)) {
        let (mut sums_01, mut sums_23) = (avx._mm256_setzero_ps(), avx._mm256_setzero_ps());
        let mut offsets_total = sse._mm_setzero_ps();
        for (((block, &[x_low, x_high]), &x_scale), &x_sum) in group.iter().zip(&halves).zip(scales).zip(sums) {
            // Never faults, wherever it points (past the matrix's end for its last groups).
            sse._mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                std::ptr::from_ref(block).cast::<i8>().wrapping_add(PREFETCH_BYTES),
            );
            let (scales, offsets) = block.scales_and_offsets(simd);
            let combined = avx._mm256_castps128_ps256(sse._mm_mul_ps(scales, sse._mm_set1_ps(x_scale)));
            offsets_total = fma._mm_fmadd_ps(offsets, sse._mm_set1_ps(x_sum), offsets_total);
            // Rows 0 and 1, then rows 2 and 3: 32 bytes each, a row's 16 in each 128-bit lane.
            let packed: [__m256i; 2] = bytemuck::cast(block.values);
            let products = |packed: __m256i| {
                let low = avx2._mm256_and_si256(packed, nibble);
                let high = avx2._mm256_and_si256(avx2._mm256_srli_epi16::<4>(packed), nibble);
                avx._mm256_cvtepi32_ps(dot.dot_nibbles(simd, low, x_low, high, x_high))
            };
            sums_01 =
                fma._mm256_fmadd_ps(products(packed[0]), avx2._mm256_permutevar8x32_ps(combined, rows_01), sums_01);
            sums_23 =
                fma._mm256_fmadd_ps(products(packed[1]), avx2._mm256_permutevar8x32_ps(combined, rows_23), sums_23);
        }
        // [0 0 2 2 | 1 1 3 3] (each a row's sum of two partial sums), then [0 2 0 2 | 1 3 1 3], then [0 1 2 3].
        let pairs = avx._mm256_hadd_ps(sums_01, sums_23);
        let quads = avx._mm256_hadd_ps(pairs, pairs);
        let rows = sse._mm_unpacklo_ps(avx._mm256_castps256_ps128(quads), avx._mm256_extractf128_ps::<1>(quads));
        let total: [f32; ROW_GROUP] = bytemuck::cast(sse._mm_add_ps(rows, offsets_total));
        for (row, value) in total.into_iter().enumerate() {
            out[row * input.rows + input_row] = value;
        }
    }
}

/// Every input tile against every group of `groups` (`out_t`'s), in passes of [`TILES_PER_PASS`] tiles: each
/// group's blocks are unpacked once per tile while the group stays in the first-level cache, and the pass's tiles
/// stay there too.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tiles<G: Group, D: Dot>(simd: pulp::x86::V3, dot: D, groups: &[G], input: &QuantizedInput, out_t: &mut [f32]) {
    let blocks = input.blocks_per_row;
    for (pass, pass_tiles) in input.tiles.chunks(TILES_PER_PASS * blocks).enumerate() {
        for (group, out) in groups.chunks_exact(blocks).zip(out_t.chunks_exact_mut(ROW_GROUP * input.rows)) {
            for (pass_tile, tile_blocks) in pass_tiles.chunks_exact(blocks).enumerate() {
                let mut totals = [simd.sse._mm_setzero_ps(); INPUT_TILE];
                for (block, x) in group.iter().zip(tile_blocks) {
                    let weights =
                        [block.unpack(simd, 0), block.unpack(simd, 1), block.unpack(simd, 2), block.unpack(simd, 3)];
                    let (scales, offsets) = block.scales_and_offsets(simd);
                    for (lane, total) in totals.iter_mut().enumerate() {
                        let products = block_products::<G, D>(simd, dot, &weights, bytemuck::cast(x.values[lane]));
                        let combined = simd.sse._mm_mul_ps(scales, simd.sse._mm_set1_ps(x.scales[lane]));
                        *total = simd.fma._mm_fmadd_ps(products, combined, *total);
                        if G::OFFSETS {
                            *total = simd.fma._mm_fmadd_ps(offsets, simd.sse._mm_set1_ps(x.sums[lane]), *total);
                        }
                    }
                }
                let first_input = (pass * TILES_PER_PASS + pass_tile) * INPUT_TILE;
                for (lane, total) in totals.into_iter().enumerate() {
                    let input_row = first_input + lane;
                    if input_row >= input.rows {
                        break;
                    }
                    let total: [f32; ROW_GROUP] = bytemuck::cast(total);
                    for (row, value) in total.into_iter().enumerate() {
                        out[row * input.rows + input_row] = value;
                    }
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use half::f16;

    use super::*;

    /// The scales' conversion inside a function compiled with AVX2 (as the kernels run it).
    struct Convert {
        simd: pulp::x86::V3,
        halves: [u16; 8],
    }

    impl pulp::NullaryFnOnce for Convert {
        type Output = [f32; 8];

        #[inline(always)]
        fn call(self) -> [f32; 8] {
            bytemuck::cast(halves_to_f32(self.simd, bytemuck::cast(self.halves)))
        }
    }

    #[test]
    fn every_finite_half_converts_exactly() {
        let Some(simd) = pulp::x86::V3::try_new() else {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        };
        let finite: Vec<u16> = (0..=u16::MAX).filter(|&bits| f16::from_bits(bits).is_finite()).collect();
        for halves in finite.chunks(8) {
            let mut chunk = [0u16; 8];
            chunk[..halves.len()].copy_from_slice(halves);
            let got = simd.vectorize(Convert { simd, halves: chunk });
            for (bits, got) in chunk.iter().zip(got) {
                let want = f16::from_bits(*bits).to_f32();
                assert_eq!(got.to_bits(), want.to_bits(), "{bits:#06x}: {got} vs {want}");
            }
        }
    }
}
