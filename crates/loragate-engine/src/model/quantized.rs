//! Weight matrices kept in the GGUF block formats of small models (Q4_0, Q4_1, Q8_0) and multiplied as such, with
//! llama.cpp's arithmetic: each input row is quantized to 8 bits per block of 32 values (a scale `d`, rounded to
//! f16 as llama.cpp does, and the scaled sum `s = d·Σq`), and each block's dot product is an exact integer sum
//! scaled by both blocks' scales, plus `m·s` for a block offset `m`. Decoding one or a few rows is bound by memory
//! bandwidth, so reading 4.5–8.5 bits per weight instead of 32 is what makes it fast.
//!
//! candle's own Q4_1 kernel is scalar; this one uses AVX2 (through `pulp`'s safe intrinsics, chosen at run time,
//! [`avx2`]) and falls back to the scalar reference ([`dot_rows_scalar`]) on other CPUs. Weights are stored planar:
//! the f32 scales (and offsets) of every block, then the packed values, so the kernel never converts f16 in its
//! inner loop. Q4_0 is stored as Q4_1 with the offset `m = −8·d` (its values are `d·(q − 8)`).
//!
//! Work is split over the output features on rayon's pool when a product is large enough to pay for it.

mod avx2;
#[cfg(test)]
mod tests;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use half::f16;
use rayon::prelude::*;

/// Values per block, in every format served here.
pub(crate) const BLOCK: usize = 32;

/// How a block's values are packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Packing {
    /// 16 bytes per block: value `i` in the low nibble of byte `i`, value `16 + i` in its high nibble, each `0..=15`
    /// (Q4_0, Q4_1).
    Nibbles,
    /// 32 signed bytes per block (Q8_0).
    Bytes,
}

impl Packing {
    fn block_bytes(self) -> usize {
        match self {
            Self::Nibbles => BLOCK / 2,
            Self::Bytes => BLOCK,
        }
    }
}

/// A weight matrix `W` `(rows, cols)` = `(out, in)` in a block format.
#[derive(Debug)]
pub(crate) struct QuantizedMatrix {
    packing: Packing,
    rows: usize,
    cols: usize,
    /// Each block's scale `d`, row by row.
    scales: Vec<f32>,
    /// Each block's offset `m` (`Nibbles` only).
    offsets: Vec<f32>,
    /// The packed values, block by block.
    values: Vec<u8>,
}

impl QuantizedMatrix {
    /// The matrix of a 2-D `Q4_0`, `Q4_1` or `Q8_0` tensor; `None` for other formats (candle multiplies those).
    pub(crate) fn from_qtensor(tensor: &QTensor) -> Result<Option<Self>> {
        let (rows, cols) = tensor.shape().dims2()?;
        let (packing, header) = match tensor.dtype() {
            GgmlDType::Q4_0 => (Packing::Nibbles, 2),
            GgmlDType::Q4_1 => (Packing::Nibbles, 4),
            GgmlDType::Q8_0 => (Packing::Bytes, 2),
            _ => return Ok(None),
        };
        if cols % BLOCK != 0 {
            return Ok(None);
        }
        let data = tensor.data()?;
        let block_bytes = header + packing.block_bytes();
        let blocks = rows * cols / BLOCK;
        if data.len() != blocks * block_bytes {
            candle_core::bail!("{} bytes for {blocks} blocks of {block_bytes}", data.len());
        }
        let mut matrix = Self {
            packing,
            rows,
            cols,
            scales: Vec::with_capacity(blocks),
            offsets: Vec::with_capacity(if packing == Packing::Nibbles { blocks } else { 0 }),
            values: Vec::with_capacity(blocks * packing.block_bytes()),
        };
        let half_at = |block: &[u8], at: usize| f16::from_le_bytes([block[at], block[at + 1]]).to_f32();
        for block in data.chunks_exact(block_bytes) {
            let d = half_at(block, 0);
            matrix.scales.push(d);
            match tensor.dtype() {
                GgmlDType::Q4_0 => matrix.offsets.push(-8.0 * d),
                GgmlDType::Q4_1 => matrix.offsets.push(half_at(block, 2)),
                _ => {}
            }
            matrix.values.extend_from_slice(&block[header..]);
        }
        Ok(Some(matrix))
    }

    fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }

    /// `x·Wᵀ` for `x` `(m, cols)`, row-major: `(m, rows)`, row-major.
    pub(crate) fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let input = QuantizedInput::new(x, m, self.cols);
        // Computed transposed, `(rows, m)`, so that threads own contiguous slices of output features.
        let mut out_t = vec![0f32; self.rows * m];
        let blocks = self.rows * self.blocks_per_row() * m;
        let threads = rayon::current_num_threads();
        if threads > 1 && blocks >= PARALLEL_FROM_BLOCKS {
            let rows_per_chunk = self.rows.div_ceil(threads * 4).max(16);
            out_t.par_chunks_mut(rows_per_chunk * m).enumerate().for_each(|(chunk, out)| {
                self.dot_rows(&input, chunk * rows_per_chunk, out);
            });
        } else {
            self.dot_rows(&input, 0, &mut out_t);
        }
        if m == 1 {
            return out_t;
        }
        let mut out = vec![0f32; m * self.rows];
        for (row, values) in out_t.chunks_exact(m).enumerate() {
            for (input_row, value) in values.iter().enumerate() {
                out[input_row * self.rows + row] = *value;
            }
        }
        out
    }

    /// Fills `out_t` (`(rows, m)` from weight row `first_row` on) with the dot products of those rows with every
    /// input row.
    fn dot_rows(&self, input: &QuantizedInput, first_row: usize, out_t: &mut [f32]) {
        if avx2::dot_rows(self, input, first_row, out_t) {
            return;
        }
        dot_rows_scalar(self, input, first_row, out_t);
    }

    /// `x·Wᵀ` as a candle op on `x` `(m, cols)` (f32, CPU).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.apply_op1_no_bwd(&MatmulOp(self))
    }
}

/// Below this many block products a matmul runs on the calling thread: waking the pool costs more.
const PARALLEL_FROM_BLOCKS: usize = 16 * 1024;

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
    pub(crate) fn new(x: &[f32], rows: usize, cols: usize) -> Self {
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
        for (block, values) in x[..rows * cols].chunks_exact(BLOCK).zip(input.values.chunks_exact_mut(BLOCK)) {
            let max = block.iter().fold(0f32, |max, value| max.max(value.abs()));
            let d = max / 127.0;
            let inverse = if d == 0.0 { 0.0 } else { 1.0 / d };
            let mut sum = 0i32;
            for (value, q) in block.iter().zip(values.iter_mut()) {
                *q = (value * inverse).round() as i8;
                sum += i32::from(*q);
            }
            input.scales.push(f16::from_f32(d).to_f32());
            input.sums.push(f16::from_f32(sum as f32 * d).to_f32());
        }
        if rows >= INPUT_TILE {
            input.tiles = vec![TileBlock::default(); rows.div_ceil(INPUT_TILE) * blocks_per_row];
            for (block, values) in input.values.chunks_exact(BLOCK).enumerate() {
                let (row, column) = (block / blocks_per_row, block % blocks_per_row);
                let tile = &mut input.tiles[row / INPUT_TILE * blocks_per_row + column];
                let lane = row % INPUT_TILE;
                tile.values[lane].copy_from_slice(values);
                tile.scales[lane] = input.scales[block];
                tile.sums[lane] = input.sums[block];
            }
        }
        input
    }
}

/// The scalar reference of the kernel (and the kernel on CPUs without AVX2).
pub(crate) fn dot_rows_scalar(matrix: &QuantizedMatrix, input: &QuantizedInput, first_row: usize, out_t: &mut [f32]) {
    let blocks = matrix.blocks_per_row();
    let block_bytes = matrix.packing.block_bytes();
    for (offset, out) in out_t.chunks_exact_mut(input.rows).enumerate() {
        let row = first_row + offset;
        for (input_row, out) in out.iter_mut().enumerate() {
            let mut total = 0f32;
            for block in 0..blocks {
                let w = row * blocks + block;
                let x = input_row * input.blocks_per_row + block;
                let packed = &matrix.values[w * block_bytes..(w + 1) * block_bytes];
                let q = &input.values[x * BLOCK..(x + 1) * BLOCK];
                let integer: i32 = match matrix.packing {
                    Packing::Nibbles => (0..BLOCK / 2)
                        .map(|i| {
                            i32::from(packed[i] & 0x0F) * i32::from(q[i])
                                + i32::from(packed[i] >> 4) * i32::from(q[i + BLOCK / 2])
                        })
                        .sum(),
                    Packing::Bytes => (0..BLOCK).map(|i| i32::from(packed[i] as i8) * i32::from(q[i])).sum(),
                };
                total += matrix.scales[w] * input.scales[x] * integer as f32;
                if matrix.packing == Packing::Nibbles {
                    total += matrix.offsets[w] * input.sums[x];
                }
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
