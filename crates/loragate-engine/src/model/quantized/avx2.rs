//! The AVX2 kernel: per block, the 32 weight values as unsigned bytes (nibbles unpacked, or Q8_0's absolute values
//! with their signs moved onto the inputs), `vpmaddubsw` against the 32 signed input bytes, `vpmaddwd` to eight
//! 32-bit sums, converted and accumulated with the block's combined scale by FMA. One input row is computed against
//! four weight rows at once (four independent accumulations); four input rows or more are read in tiles of
//! [`INPUT_TILE`] rows that share each unpacked weight block, every weight row streamed once. `pulp` checks the CPU at run time and compiles this code with AVX2 and FMA enabled; its
//! intrinsics are safe functions, and unaligned loads go through `bytemuck`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{__m128, __m128i, __m256, __m256i};

use super::{BLOCK, INPUT_TILE, Packing, QuantizedInput, QuantizedMatrix};

/// Computes what [`super::dot_rows_scalar`] computes, if the CPU has AVX2 and FMA; `false` otherwise.
/// Input tiles computed against each weight row before the next: their blocks (a few kilobytes) stay in the
/// first-level cache while the weight rows stream past.
const TILES_PER_PASS: usize = 4;

#[cfg(target_arch = "x86_64")]
pub(super) fn dot_rows(matrix: &QuantizedMatrix, input: &QuantizedInput, first_row: usize, out_t: &mut [f32]) -> bool {
    let Some(simd) = pulp::x86::V3::try_new() else { return false };
    simd.vectorize(Kernel { simd, matrix, input, first_row, out_t });
    true
}

/// The kernel's body, a struct rather than a closure so that it is inlined into the function `pulp` compiles with
/// AVX2 enabled (`#[inline(always)]` on [`pulp::NullaryFnOnce::call`]).
#[cfg(target_arch = "x86_64")]
struct Kernel<'a> {
    simd: pulp::x86::V3,
    matrix: &'a QuantizedMatrix,
    input: &'a QuantizedInput,
    first_row: usize,
    out_t: &'a mut [f32],
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for Kernel<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let Self { simd, matrix, input, first_row, out_t } = self;
        if input.rows == 1 {
            let rows = Rows { matrix, input, first_row, first_input: 0 };
            match matrix.packing {
                Packing::Nibbles => rows.single::<true>(simd, out_t),
                Packing::Bytes => rows.single::<false>(simd, out_t),
            }
            return;
        }
        if input.rows < INPUT_TILE {
            for first_input in 0..input.rows {
                let rows = Rows { matrix, input, first_row, first_input };
                match matrix.packing {
                    Packing::Nibbles => rows.single::<true>(simd, out_t),
                    Packing::Bytes => rows.single::<false>(simd, out_t),
                }
            }
            return;
        }
        let rows = Rows { matrix, input, first_row, first_input: 0 };
        match matrix.packing {
            Packing::Nibbles => rows.tiles::<true>(simd, out_t),
            Packing::Bytes => rows.tiles::<false>(simd, out_t),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn dot_rows(_: &QuantizedMatrix, _: &QuantizedInput, _: usize, _: &mut [f32]) -> bool {
    false
}

/// Weight rows from `first_row` against input rows from `first_input`.
#[cfg(target_arch = "x86_64")]
struct Rows<'a> {
    matrix: &'a QuantizedMatrix,
    input: &'a QuantizedInput,
    first_row: usize,
    first_input: usize,
}

#[cfg(target_arch = "x86_64")]
impl Rows<'_> {
    /// The input row `first_input` alone against every weight row of `out_t`, four weight rows at a time: each input
    /// block is loaded once for four independent accumulations (a decode step of one sequence).
    #[inline(always)]
    fn single<const NIBBLES: bool>(&self, simd: pulp::x86::V3, out_t: &mut [f32]) {
        let rows = out_t.len() / self.input.rows;
        let mut row = 0;
        while row + 4 <= rows {
            self.single_group::<4, NIBBLES>(simd, row, out_t);
            row += 4;
        }
        while row < rows {
            self.single_group::<1, NIBBLES>(simd, row, out_t);
            row += 1;
        }
    }

    /// Weight rows `first_row + offset..first_row + offset + R` against the input row `first_input`.
    #[inline(always)]
    fn single_group<const R: usize, const NIBBLES: bool>(&self, simd: pulp::x86::V3, offset: usize, out_t: &mut [f32]) {
        let (matrix, input) = (self.matrix, self.input);
        let blocks = matrix.blocks_per_row();
        let block_bytes = matrix.packing.block_bytes();
        let first = self.first_row + offset;
        let all_values: &[u8] = bytemuck::cast_slice(&input.values);
        let x_values = &all_values[self.first_input * blocks * BLOCK..(self.first_input + 1) * blocks * BLOCK];
        let x_scales = &input.scales[self.first_input * blocks..(self.first_input + 1) * blocks];
        let x_sums = &input.sums[self.first_input * blocks..(self.first_input + 1) * blocks];
        let packed: [&[u8]; R] = std::array::from_fn(|r| {
            &matrix.values[(first + r) * blocks * block_bytes..(first + r + 1) * blocks * block_bytes]
        });
        let scales: [&[f32]; R] =
            std::array::from_fn(|r| &matrix.scales[(first + r) * blocks..(first + r + 1) * blocks]);
        let offsets: [&[f32]; R] = std::array::from_fn(|r| {
            if NIBBLES { &matrix.offsets[(first + r) * blocks..(first + r + 1) * blocks] } else { &[] }
        });
        let ones = simd.avx._mm256_set1_epi16(1);
        let low_nibbles = simd.avx._mm256_set1_epi8(0x0F);
        let mut accumulators: [__m256; R] = [simd.avx._mm256_setzero_ps(); R];
        let mut offset_terms = [0f32; R];
        for block in 0..blocks {
            let x: __m256i = bytemuck::pod_read_unaligned(&x_values[block * BLOCK..(block + 1) * BLOCK]);
            let (x_scale, x_sum) = (x_scales[block], x_sums[block]);
            for r in 0..R {
                let weights = &packed[r][block * block_bytes..(block + 1) * block_bytes];
                let (unsigned, signed) = if NIBBLES {
                    let bytes: __m128i = bytemuck::pod_read_unaligned(weights);
                    let both = simd.avx._mm256_set_m128i(simd.sse2._mm_srli_epi16::<4>(bytes), bytes);
                    (simd.avx2._mm256_and_si256(both, low_nibbles), x)
                } else {
                    let signs: __m256i = bytemuck::pod_read_unaligned(weights);
                    (simd.avx2._mm256_sign_epi8(signs, signs), simd.avx2._mm256_sign_epi8(x, signs))
                };
                let pairs = simd.avx2._mm256_maddubs_epi16(unsigned, signed);
                let sums = simd.avx._mm256_cvtepi32_ps(simd.avx2._mm256_madd_epi16(pairs, ones));
                let combined = simd.avx._mm256_set1_ps(scales[r][block] * x_scale);
                accumulators[r] = simd.fma._mm256_fmadd_ps(sums, combined, accumulators[r]);
                if NIBBLES {
                    offset_terms[r] = offsets[r][block].mul_add(x_sum, offset_terms[r]);
                }
            }
        }
        for r in 0..R {
            out_t[(offset + r) * input.rows + self.first_input] =
                horizontal_sum(simd, accumulators[r]) + offset_terms[r];
        }
    }

    /// Every input tile against every weight row of `out_t` (`NIBBLES`: Q4_0/Q4_1 packing, else Q8_0's), in passes
    /// of [`TILES_PER_PASS`] tiles: each weight row's blocks are unpacked once per tile while the row stays in the
    /// first-level cache, and the pass's tiles stay there too.
    #[inline(always)]
    fn tiles<const NIBBLES: bool>(&self, simd: pulp::x86::V3, out_t: &mut [f32]) {
        let (matrix, input) = (self.matrix, self.input);
        let blocks = matrix.blocks_per_row();
        let block_bytes = matrix.packing.block_bytes();
        let ones = simd.avx._mm256_set1_epi16(1);
        let low_nibbles = simd.avx._mm256_set1_epi8(0x0F);
        let rows = out_t.len() / input.rows;
        let first = self.first_row;
        let weight_values = &matrix.values[first * blocks * block_bytes..(first + rows) * blocks * block_bytes];
        let weight_scales = &matrix.scales[first * blocks..(first + rows) * blocks];
        let weight_offsets: &[f32] =
            if NIBBLES { &matrix.offsets[first * blocks..(first + rows) * blocks] } else { &[] };
        for (pass, pass_tiles) in input.tiles.chunks(TILES_PER_PASS * blocks).enumerate() {
            for (row, ((out, packed_row), scales)) in out_t
                .chunks_exact_mut(input.rows)
                .zip(weight_values.chunks_exact(blocks * block_bytes))
                .zip(weight_scales.chunks_exact(blocks))
                .enumerate()
            {
                let offsets = if NIBBLES { &weight_offsets[row * blocks..(row + 1) * blocks] } else { &[] };
                for (pass_tile, tile_blocks) in pass_tiles.chunks_exact(blocks).enumerate() {
                    let tile = pass * TILES_PER_PASS + pass_tile;
                    let mut accumulators: [__m256; INPUT_TILE] = [simd.avx._mm256_setzero_ps(); INPUT_TILE];
                    let mut offset_terms: __m128 = simd.sse._mm_setzero_ps();
                    for (block, ((packed, &scale), x)) in
                        packed_row.chunks_exact(block_bytes).zip(scales).zip(tile_blocks).enumerate()
                    {
                        let (unsigned, signs) = if NIBBLES {
                            let bytes: __m128i = bytemuck::pod_read_unaligned(packed);
                            let both = simd.avx._mm256_set_m128i(simd.sse2._mm_srli_epi16::<4>(bytes), bytes);
                            (simd.avx2._mm256_and_si256(both, low_nibbles), both)
                        } else {
                            let signed: __m256i = bytemuck::pod_read_unaligned(packed);
                            (simd.avx2._mm256_sign_epi8(signed, signed), signed)
                        };
                        let x_scales: __m128 = bytemuck::cast(x.scales);
                        let combined: [f32; INPUT_TILE] =
                            bytemuck::cast(simd.sse._mm_mul_ps(x_scales, simd.sse._mm_set1_ps(scale)));
                        if NIBBLES {
                            let x_sums: __m128 = bytemuck::cast(x.sums);
                            offset_terms =
                                simd.fma._mm_fmadd_ps(x_sums, simd.sse._mm_set1_ps(offsets[block]), offset_terms);
                        }
                        for lane in 0..INPUT_TILE {
                            let mut values: __m256i = bytemuck::cast(x.values[lane]);
                            if !NIBBLES {
                                values = simd.avx2._mm256_sign_epi8(values, signs);
                            }
                            let pairs = simd.avx2._mm256_maddubs_epi16(unsigned, values);
                            let sums = simd.avx._mm256_cvtepi32_ps(simd.avx2._mm256_madd_epi16(pairs, ones));
                            let combined = simd.avx._mm256_set1_ps(combined[lane]);
                            accumulators[lane] = simd.fma._mm256_fmadd_ps(sums, combined, accumulators[lane]);
                        }
                    }
                    let offset_terms: [f32; INPUT_TILE] = bytemuck::cast(offset_terms);
                    for lane in 0..INPUT_TILE {
                        if let Some(out) = out.get_mut(tile * INPUT_TILE + lane) {
                            *out = horizontal_sum(simd, accumulators[lane]) + offset_terms[lane];
                        }
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn horizontal_sum(simd: pulp::x86::V3, value: __m256) -> f32 {
    let quad = simd.sse._mm_add_ps(simd.avx._mm256_castps256_ps128(value), simd.avx._mm256_extractf128_ps::<1>(value));
    let pair = simd.sse._mm_add_ps(quad, simd.sse._mm_movehl_ps(quad, quad));
    let single = simd.sse._mm_add_ss(pair, simd.sse._mm_shuffle_ps::<0b01>(pair, pair));
    simd.sse._mm_cvtss_f32(single)
}
