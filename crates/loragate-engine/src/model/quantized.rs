//! Weight matrices kept in the GGUF block formats of small models (Q4_0, Q4_1, Q8_0) and multiplied as such, with
//! llama.cpp's arithmetic: each input row is quantized to 8 bits per block of 32 values (a scale `d`, rounded to
//! f16 as llama.cpp does, and the scaled sum `s = d·Σq`), and each block's dot product is an exact integer sum
//! scaled by both blocks' scales, plus `m·s` for a block offset `m`. Decoding one or a few rows is bound by memory
//! bandwidth, so reading 4.5–8.5 bits per weight instead of 32 is what makes it fast.
//!
//! candle's own Q4_1 kernel is scalar; this one is chosen at run time ([`Simd`]): AVX-512 VNNI where the CPU has it,
//! AVX2 otherwise (both in [`avx2`], through `pulp`), the scalar reference ([`dot_rows_scalar`]) last;
//! `LORAGATE_SIMD=avx2|portable` caps the choice. Weights are stored in
//! groups of [`ROW_GROUP`] rows, block by block ([`NibbleGroup`], [`ByteGroup`]): the four rows' f16 scales (and
//! offsets, as the file has them), then their packed values, so that a kernel reads one contiguous stream, loads the
//! four rows' scales (and offsets) as one vector, and sums the four rows' integer products with one horizontal
//! reduction per block. The scales stay f16 because a decode step is bound by reading the weights: f32 scales made
//! a Q4_1 block 24 bytes instead of 20 and a step read 15% more than llama.cpp's. Q4_0 is stored as Q4_1 with the offset `m = −8·d` (its values are `d·(q − 8)`).
//!
//! Work is split over the output features on rayon's pool when a product is large enough to pay for it.

mod avx2;
#[cfg(test)]
mod tests;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use half::f16;
use rayon::prelude::*;

use super::scratch;

/// The widest kernels the quantized products may use, in order: each falls back to the next narrower one the CPU
/// has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Simd {
    /// The scalar reference.
    Portable,
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512 VNNI and VL on 256-bit vectors, with AVX2 and FMA.
    Avx512Vnni,
}

impl Simd {
    /// The environment variable that caps the choice: `avx512` (the default: the widest the CPU has), `avx2`
    /// or `portable`, to compare kernels or to rule one out.
    pub(crate) const VARIABLE: &str = "LORAGATE_SIMD";

    /// The cap set by [`Self::VARIABLE`], read once (an unknown value is logged and ignored).
    pub(crate) fn chosen() -> Self {
        static CHOSEN: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let value = std::env::var(Self::VARIABLE).unwrap_or_default();
            Self::parse(&value).unwrap_or_else(|| {
                tracing::warn!(
                    variable = Self::VARIABLE,
                    value,
                    "unknown SIMD level, expected avx512, avx2 or portable"
                );
                Self::Avx512Vnni
            })
        })
    }

    /// `avx512`, `avx2`, `portable` (or empty: the widest); `None` for anything else.
    fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "avx512" => Some(Self::Avx512Vnni),
            "avx2" => Some(Self::Avx2),
            "portable" | "scalar" => Some(Self::Portable),
            _ => None,
        }
    }
}

/// Values per block, in every format served here.
pub(crate) const BLOCK: usize = 32;

/// Weight rows stored together, block by block: the kernels read one group's blocks as one stream and sum four
/// rows' products with one horizontal reduction.
pub(crate) const ROW_GROUP: usize = 4;

/// Block `b` of [`ROW_GROUP`] consecutive rows in a nibble format (Q4_0, Q4_1): their scales, offsets and values,
/// 20 bytes per row and block (as in the file), contiguous.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct NibbleGroup {
    /// Each row's block scale `d` (finite).
    pub(crate) scales: [f16; ROW_GROUP],
    /// Each row's block offset `m` (finite).
    pub(crate) offsets: [f16; ROW_GROUP],
    /// Each row's 32 values: value `i` in the low nibble of byte `i`, value `16 + i` in its high nibble, `0..=15`.
    pub(crate) values: [[u8; BLOCK / 2]; ROW_GROUP],
}

/// Block `b` of [`ROW_GROUP`] consecutive rows in Q8_0: their scales and signed values.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct ByteGroup {
    /// Each row's block scale `d` (finite).
    pub(crate) scales: [f16; ROW_GROUP],
    /// Each row's 32 signed values.
    pub(crate) values: [[i8; BLOCK]; ROW_GROUP],
}

/// A matrix's row groups, group by group and within a group block by block (`group · blocks_per_row + block`);
/// the rows past the last are zero.
#[derive(Debug)]
pub(crate) enum RowGroups {
    /// Q4_0 and Q4_1 (Q4_0 with the offset `m = −8·d`).
    Nibbles(Vec<NibbleGroup>),
    /// Q8_0.
    Bytes(Vec<ByteGroup>),
}

/// A weight matrix `W` `(rows, cols)` = `(out, in)` in a block format.
#[derive(Debug)]
pub(crate) struct QuantizedMatrix {
    rows: usize,
    cols: usize,
    groups: RowGroups,
}

impl QuantizedMatrix {
    /// The matrix of a 2-D `Q4_0`, `Q4_1` or `Q8_0` tensor; `None` for other formats, and for a scale or offset
    /// that is not finite (candle multiplies those).
    pub(crate) fn from_qtensor(tensor: &QTensor) -> Result<Option<Self>> {
        let (rows, cols) = tensor.shape().dims2()?;
        let header = match tensor.dtype() {
            GgmlDType::Q4_0 | GgmlDType::Q8_0 => 2,
            GgmlDType::Q4_1 => 4,
            _ => return Ok(None),
        };
        if cols % BLOCK != 0 {
            return Ok(None);
        }
        let data = tensor.data()?;
        let packed_bytes = if tensor.dtype() == GgmlDType::Q8_0 { BLOCK } else { BLOCK / 2 };
        let block_bytes = header + packed_bytes;
        let blocks_per_row = cols / BLOCK;
        if data.len() != rows * blocks_per_row * block_bytes {
            candle_core::bail!("{} bytes for {} blocks of {block_bytes}", data.len(), rows * blocks_per_row);
        }
        let half_at = |block: &[u8], at: usize| f16::from_le_bytes([block[at], block[at + 1]]);
        // GGUF's block `column` of row `row`, and where it goes: group `row / ROW_GROUP`, lane `row % ROW_GROUP`.
        let blocks = data.chunks_exact(block_bytes).enumerate().map(|(index, block)| {
            let (row, column) = (index / blocks_per_row, index % blocks_per_row);
            (row / ROW_GROUP * blocks_per_row + column, row % ROW_GROUP, block)
        });
        let group_count = rows.div_ceil(ROW_GROUP) * blocks_per_row;
        // The kernels convert the scales with integer arithmetic, exact for finite values only; `−8·d` (Q4_0's
        // offset) is exact in f16 unless it overflows.
        let finite = data.chunks_exact(block_bytes).all(|block| {
            let d = half_at(block, 0);
            d.is_finite()
                && (tensor.dtype() != GgmlDType::Q4_0 || (d * f16::from_f32(-8.0)).is_finite())
                && (tensor.dtype() != GgmlDType::Q4_1 || half_at(block, 2).is_finite())
        });
        if !finite {
            return Ok(None);
        }
        let groups = match tensor.dtype() {
            GgmlDType::Q8_0 => {
                let mut groups = vec![ByteGroup::default(); group_count];
                for (group, lane, block) in blocks {
                    let group = &mut groups[group];
                    group.scales[lane] = half_at(block, 0);
                    for (value, byte) in group.values[lane].iter_mut().zip(&block[header..]) {
                        *value = *byte as i8;
                    }
                }
                RowGroups::Bytes(groups)
            }
            format => {
                let mut groups = vec![NibbleGroup::default(); group_count];
                for (group, lane, block) in blocks {
                    let group = &mut groups[group];
                    let d = half_at(block, 0);
                    group.scales[lane] = d;
                    group.offsets[lane] =
                        if format == GgmlDType::Q4_1 { half_at(block, 2) } else { d * f16::from_f32(-8.0) };
                    group.values[lane].copy_from_slice(&block[header..]);
                }
                RowGroups::Nibbles(groups)
            }
        };
        Ok(Some(Self { rows, cols, groups }))
    }

    fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }

    /// The rows the groups hold: `rows` rounded up to whole groups.
    fn padded_rows(&self) -> usize {
        self.rows.next_multiple_of(ROW_GROUP)
    }

    /// `x·Wᵀ` for `x` `(m, cols)`, row-major: `(m, rows)`, row-major.
    pub(crate) fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        Self::matmul_many(&[self], x, m).pop().expect("one product per matrix")
    }

    /// `x·Wᵢᵀ` for each matrix `Wᵢ` of `matrices` (all of `cols` columns), `x` `(m, cols)`: `(m, rowsᵢ)` each,
    /// row-major. `x` is quantized once for all of them, and their products run as one parallel region of the
    /// pool (a layer's q, k and v projections, or its gate and up ones): one fork and join instead of one per
    /// matrix, and products too small to split alone are split together. Each product's values are exactly those
    /// of [`Self::matmul`] alone: every weight row's dot products are computed by the same kernel whatever the
    /// split.
    pub(crate) fn matmul_many(matrices: &[&Self], x: &[f32], m: usize) -> Vec<Vec<f32>> {
        let Some(cols) = matrices.first().map(|matrix| matrix.cols) else { return Vec::new() };
        assert!(matrices.iter().all(|matrix| matrix.cols == cols), "matrices of one input width");
        let padded_rows: usize = matrices.iter().map(|matrix| matrix.padded_rows()).sum();
        let threads = rayon::current_num_threads();
        let parallel = threads > 1 && padded_rows * (cols / BLOCK) * m >= PARALLEL_FROM_BLOCKS;
        let input = QuantizedInput::new(x, m, cols, parallel);
        // Computed transposed, `(padded rows, m)`, the matrices' rows one after the other, so that threads own
        // contiguous slices of output features, into a buffer this thread keeps for its next product.
        let mut out_t = scratch::take_zeroed(&TRANSPOSED_PRODUCT, padded_rows * m);
        let rows_per_chunk = padded_rows.div_ceil(threads * 4).max(16).next_multiple_of(ROW_GROUP);
        let mut tasks = Vec::new();
        let mut rest = out_t.as_mut_slice();
        for matrix in matrices {
            let (own, after) = rest.split_at_mut(matrix.padded_rows() * m);
            rest = after;
            if parallel {
                let chunks = own.chunks_mut(rows_per_chunk * m).enumerate();
                tasks.extend(chunks.map(|(chunk, out)| (*matrix, chunk * rows_per_chunk, out)));
            } else {
                tasks.push((*matrix, 0, own));
            }
        }
        if parallel {
            tasks.into_par_iter().for_each(|(matrix, first_row, out)| matrix.dot_rows(&input, first_row, out));
        } else {
            tasks.into_iter().for_each(|(matrix, first_row, out)| matrix.dot_rows(&input, first_row, out));
        }
        let mut products = Vec::with_capacity(matrices.len());
        let mut first = 0;
        for matrix in matrices {
            let own = &out_t[first * m..(first + matrix.padded_rows()) * m];
            first += matrix.padded_rows();
            let mut out = vec![0f32; m * matrix.rows];
            let transpose = |(input_row, out): (usize, &mut [f32])| {
                for (row, value) in out.iter_mut().enumerate() {
                    *value = own[row * m + input_row];
                }
            };
            if parallel && m > 1 {
                out.par_chunks_mut(matrix.rows).enumerate().for_each(transpose);
            } else {
                out.chunks_mut(matrix.rows).enumerate().for_each(transpose);
            }
            products.push(out);
        }
        scratch::keep(&TRANSPOSED_PRODUCT, out_t, KEPT_PRODUCT_VALUES);
        products
    }

    /// Fills `out_t` (`(rows, m)` from weight row `first_row` on, both whole groups) with the dot products of those
    /// rows with every input row.
    fn dot_rows(&self, input: &QuantizedInput, first_row: usize, out_t: &mut [f32]) {
        self.dot_rows_with(Simd::chosen(), input, first_row, out_t);
    }

    /// [`Self::dot_rows`] with the widest kernel up to `limit` that the CPU has; the kernel it used.
    fn dot_rows_with(&self, limit: Simd, input: &QuantizedInput, first_row: usize, out_t: &mut [f32]) -> Simd {
        if limit >= Simd::Avx512Vnni && avx2::dot_rows_vnni(self, input, first_row, out_t) {
            return Simd::Avx512Vnni;
        }
        if limit >= Simd::Avx2 && avx2::dot_rows(self, input, first_row, out_t) {
            return Simd::Avx2;
        }
        dot_rows_scalar(self, input, first_row, out_t);
        Simd::Portable
    }

    /// `x·Wᵀ` as a candle op on `x` `(m, cols)` (f32, CPU).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.apply_op1_no_bwd(&MatmulOp(self))
    }

    /// [`Self::matmul_many`] on `x` `(m, cols)` (f32, CPU, contiguous): `(m, rowsᵢ)` for each matrix.
    pub(crate) fn forward_many(matrices: &[&Self], x: &Tensor) -> Result<Vec<Tensor>> {
        let (m, cols) = x.dims2()?;
        if let Some(matrix) = matrices.iter().find(|matrix| matrix.cols != cols) {
            candle_core::bail!("input of {cols} features for a matrix of {}", matrix.cols);
        }
        let products = {
            let (storage, layout) = x.storage_and_layout();
            let Some((start, end)) = layout.contiguous_offsets() else {
                candle_core::bail!("the input of a quantized matmul must be contiguous");
            };
            let candle_core::Storage::Cpu(CpuStorage::F32(values)) = &*storage else {
                candle_core::bail!("the input of a quantized matmul must be f32 on the CPU");
            };
            Self::matmul_many(matrices, &values[start..end], m)
        };
        matrices.iter().zip(products).map(|(matrix, out)| Tensor::from_vec(out, (m, matrix.rows), x.device())).collect()
    }
}

/// Below this many block products a matmul runs on the calling thread: waking the pool costs more. (A decode
/// step's attention output projection of SmolLM2-135M, 576 × 576 weights, is 10,368 block products: split.)
const PARALLEL_FROM_BLOCKS: usize = 8 * 1024;

/// The largest transposed product a thread keeps for its next one (4 MiB: every product of a prefill chunk's
/// layers; a chunk's logits over a whole vocabulary are allocated each time instead of held).
const KEPT_PRODUCT_VALUES: usize = 1024 * 1024;

/// Input rows quantized per parallel task.
const QUANTIZE_TASK_ROWS: usize = 16;

thread_local! {
    /// [`QuantizedMatrix::matmul`]'s transposed product, kept for the next product on this thread ([`scratch`]).
    static TRANSPOSED_PRODUCT: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Input rows the multi-row kernel reads together: one weight block is unpacked once for all of them.
pub(crate) const INPUT_TILE: usize = 4;

/// Input rows quantized llama.cpp's way (`quantize_row_q8_1`): per block of 32 values, the scale
/// `d = max|x| / 127` (rounded to f16), the values `q = round(x / d)`, and `s = d·Σq` (rounded to f16).
pub(crate) struct QuantizedInput {
    rows: usize,
    blocks_per_row: usize,
    scales: Vec<f32>,
    sums: Vec<f32>,
    values: Vec<i8>,
    /// For [`INPUT_TILE`] rows or more, the same rows in tiles of [`INPUT_TILE`], block by block (the last tile
    /// padded with zero rows): the layout the multi-row kernel reads as one stream.
    tiles: Vec<TileBlock>,
}

/// One block of [`INPUT_TILE`] input rows.
#[derive(Clone, Copy, Default)]
pub(crate) struct TileBlock {
    values: [[i8; BLOCK]; INPUT_TILE],
    scales: [f32; INPUT_TILE],
    sums: [f32; INPUT_TILE],
}

impl QuantizedInput {
    /// Quantizes the `rows` rows of `x`, [`QUANTIZE_TASK_ROWS`] at a time on the pool's threads when `parallel`.
    pub(crate) fn new(x: &[f32], rows: usize, cols: usize, parallel: bool) -> Self {
        let blocks_per_row = cols / BLOCK;
        let blocks = rows * blocks_per_row;
        let mut input = Self {
            rows,
            blocks_per_row,
            scales: Vec::with_capacity(blocks),
            sums: Vec::with_capacity(blocks),
            values: vec![0; blocks * BLOCK],
            tiles: Vec::new(),
        };
        let x = &x[..rows * cols];
        let quantize = |(x, values): (&[f32], &mut [i8])| {
            let vectorised = if Simd::chosen() >= Simd::Avx2 { avx2::quantize_blocks(x, values) } else { None };
            vectorised.unwrap_or_else(|| quantize_blocks_scalar(x, values))
        };
        let task = QUANTIZE_TASK_ROWS * cols;
        let blocks: Vec<Vec<(f32, i32)>> = if parallel {
            x.par_chunks(task).zip(input.values.par_chunks_mut(task)).map(quantize).collect()
        } else {
            vec![quantize((x, &mut input.values))]
        };
        for (d, sum) in blocks.into_iter().flatten() {
            input.scales.push(f16::from_f32(d).to_f32());
            input.sums.push(f16::from_f32(sum as f32 * d).to_f32());
        }
        if rows >= INPUT_TILE {
            input.tiles = vec![TileBlock::default(); rows.div_ceil(INPUT_TILE) * blocks_per_row];
            let fill = |(tile_row, tiles): (usize, &mut [TileBlock])| {
                for lane in 0..INPUT_TILE.min(rows - tile_row * INPUT_TILE) {
                    let row = tile_row * INPUT_TILE + lane;
                    for (column, tile) in tiles.iter_mut().enumerate() {
                        let block = row * blocks_per_row + column;
                        tile.values[lane].copy_from_slice(&input.values[block * BLOCK..][..BLOCK]);
                        tile.scales[lane] = input.scales[block];
                        tile.sums[lane] = input.sums[block];
                    }
                }
            };
            let mut tiles = std::mem::take(&mut input.tiles);
            if parallel {
                tiles.par_chunks_mut(blocks_per_row).enumerate().for_each(fill);
            } else {
                tiles.chunks_mut(blocks_per_row).enumerate().for_each(fill);
            }
            input.tiles = tiles;
        }
        input
    }
}

/// Quantizes `x` block by block into `values` the way llama.cpp's vectorised `quantize_row_q8_1` does: per block,
/// `q = round(x · 127 / max|x|)` (ties to even) and `(d, Σq)` with `d = max|x| / 127` (before rounding to f16).
/// The scalar reference of [`avx2::quantize_blocks`] (and the quantization on CPUs without AVX2).
pub(crate) fn quantize_blocks_scalar(x: &[f32], values: &mut [i8]) -> Vec<(f32, i32)> {
    let mut blocks = Vec::with_capacity(x.len() / BLOCK);
    for (block, values) in x.chunks_exact(BLOCK).zip(values.chunks_exact_mut(BLOCK)) {
        let max = block.iter().fold(0f32, |max, value| max.max(value.abs()));
        let inverse = if max == 0.0 { 0.0 } else { 127.0 / max };
        let mut sum = 0i32;
        for (value, q) in block.iter().zip(values.iter_mut()) {
            *q = (value * inverse).round_ties_even() as i8;
            sum += i32::from(*q);
        }
        blocks.push((max / 127.0, sum));
    }
    blocks
}

/// The scalar reference of the kernel (and the kernel on CPUs without AVX2).
pub(crate) fn dot_rows_scalar(matrix: &QuantizedMatrix, input: &QuantizedInput, first_row: usize, out_t: &mut [f32]) {
    let blocks = matrix.blocks_per_row();
    for (offset, out) in out_t.chunks_exact_mut(input.rows).enumerate() {
        let row = first_row + offset;
        let (group, lane) = (row / ROW_GROUP, row % ROW_GROUP);
        for (input_row, out) in out.iter_mut().enumerate() {
            let mut total = 0f32;
            for block in 0..blocks {
                let w = group * blocks + block;
                let x = input_row * input.blocks_per_row + block;
                let q = &input.values[x * BLOCK..(x + 1) * BLOCK];
                let (scale, offset, integer): (f32, f32, i32) = match &matrix.groups {
                    RowGroups::Nibbles(groups) => {
                        let group = &groups[w];
                        let packed = &group.values[lane];
                        let integer = (0..BLOCK / 2)
                            .map(|i| {
                                i32::from(packed[i] & 0x0F) * i32::from(q[i])
                                    + i32::from(packed[i] >> 4) * i32::from(q[i + BLOCK / 2])
                            })
                            .sum();
                        (group.scales[lane].to_f32(), group.offsets[lane].to_f32(), integer)
                    }
                    RowGroups::Bytes(groups) => {
                        let group = &groups[w];
                        let integer = (0..BLOCK).map(|i| i32::from(group.values[lane][i]) * i32::from(q[i])).sum();
                        (group.scales[lane].to_f32(), 0.0, integer)
                    }
                };
                total += scale * input.scales[x] * integer as f32 + offset * input.sums[x];
            }
            *out = total;
        }
    }
}

/// [`QuantizedMatrix::matmul`] as a candle op.
struct MatmulOp<'a>(&'a QuantizedMatrix);

impl CustomOp1 for MatmulOp<'_> {
    fn name(&self) -> &'static str {
        "loragate-quantized-matmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (m, cols) = layout.shape().dims2()?;
        if cols != self.0.cols {
            candle_core::bail!("input of {cols} features for a matrix of {}", self.0.cols);
        }
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("the input of a quantized matmul must be contiguous");
        };
        let CpuStorage::F32(values) = storage else {
            candle_core::bail!("the input of a quantized matmul must be f32");
        };
        let out = self.0.matmul(&values[start..end], m);
        Ok((CpuStorage::F32(out), Shape::from((m, self.0.rows))))
    }
}
