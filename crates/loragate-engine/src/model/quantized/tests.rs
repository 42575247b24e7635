use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::model::random_tensor;

fn random(rows: usize, cols: usize, seed: u64) -> Tensor {
    random_tensor(&mut StdRng::seed_from_u64(seed), (rows, cols), 1.0, &Device::Cpu).expect("random")
}

/// `x·Wᵀ` with the dequantized weights and unquantized inputs.
fn dense_product(weights: &QTensor, x: &Tensor) -> Vec<f32> {
    let dense = weights.dequantize(&Device::Cpu).expect("dequantize");
    x.matmul(&dense.t().expect("t")).and_then(|y| y.flatten_all()).and_then(|y| y.to_vec1()).expect("product")
}

#[test]
fn the_kernel_computes_the_product_with_inputs_quantized_to_8_bits_per_block() {
    for format in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0] {
        // 70 output features: not a multiple of any tile or chunk; 5 input rows: a tile of 4 and one of 1.
        let weights = QTensor::quantize(&random(70, 96, 1), format).expect("quantize");
        let matrix = QuantizedMatrix::from_qtensor(&weights).expect("read").expect("a served format");
        for rows in [1, 2, 3, 4, 5, 9] {
            let x = random(rows, 96, 2);
            let values: Vec<f32> = x.flatten_all().and_then(|x| x.to_vec1()).expect("values");
            let ours = matrix.matmul(&values, rows);
            let expected = dense_product(&weights, &x);
            // Quantizing inputs of up to √3 to steps of √3/127 errs by up to 0.007 per value (standard deviation
            // 0.004); over 96 products of weights of standard deviation 1 that is 0.04, against products of standard
            // deviation 10 (a wrong nibble order or scale errs by about that much).
            for (index, (got, want)) in ours.iter().zip(&expected).enumerate() {
                assert!((got - want).abs() < 0.25, "{format:?}, {rows} rows, #{index}: {got} vs {want}");
            }
            // The vectorised kernel and the scalar reference add the same integer sums in another order.
            let input = QuantizedInput::new(&values, rows, 96, false);
            // The kernels fill whole row groups: 72 rows, the last two zero.
            let mut reference = vec![0f32; matrix.padded_rows() * rows];
            dot_rows_scalar(&matrix, &input, 0, &mut reference);
            let mut kernel = vec![0f32; matrix.padded_rows() * rows];
            matrix.dot_rows(&input, 0, &mut kernel);
            for (got, want) in kernel.iter().zip(&reference) {
                assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{format:?}: {got} vs {want}");
            }
        }
    }
}

#[test]
fn the_candle_op_checks_its_input_and_gives_rows_by_output_features() {
    let weights = QTensor::quantize(&random(40, 64, 3), GgmlDType::Q4_1).expect("quantize");
    let matrix = QuantizedMatrix::from_qtensor(&weights).expect("read").expect("served");
    let x = random(3, 64, 4);
    let y = matrix.forward(&x).expect("forward");
    assert_eq!(y.dims(), [3, 40]);
    assert!(matrix.forward(&random(3, 32, 5)).is_err(), "wrong input width");
    assert!(matrix.forward(&x.t().expect("t")).is_err(), "a transposed input");
    let other = QTensor::quantize(&random(40, 256, 6), GgmlDType::Q4K).expect("q4k");
    assert!(QuantizedMatrix::from_qtensor(&other).expect("read").is_none(), "k-quants stay with candle");
}

#[test]
fn large_products_split_over_threads_give_the_same_values() {
    let weights = QTensor::quantize(&random(1536, 576, 7), GgmlDType::Q4_1).expect("quantize");
    let matrix = QuantizedMatrix::from_qtensor(&weights).expect("read").expect("served");
    // 2 rows: one at a time; 6: a tile and a padded one; 37: inputs quantized in three parallel tasks, the last one
    // short, into tiles of which the last is padded. The second product on each thread reuses its kept buffer.
    for rows in [2, 6, 37, 37] {
        let x = random(rows, 576, 8);
        let values: Vec<f32> = x.flatten_all().and_then(|x| x.to_vec1()).expect("values");
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
        let parallel = pool.install(|| matrix.matmul(&values, rows));
        let single = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool")
            .install(|| matrix.matmul(&values, rows));
        assert_eq!(parallel, single, "{rows} rows");
    }
}

#[test]
fn products_computed_together_are_each_products_bits() {
    // A layer's q, k and v shapes (scaled down) and a Q8_0 matrix beside them: one input, several matrices, split
    // together over a pool of 3 threads or computed on one; each product must equal its own `matmul`, bit for bit.
    let formats = [GgmlDType::Q4_1, GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0];
    let shapes = [(576, 31), (192, 32), (192, 33), (70, 34)];
    let matrices: Vec<QuantizedMatrix> = formats
        .iter()
        .zip(shapes)
        .map(|(format, (rows, seed))| {
            let weights = QTensor::quantize(&random(rows, 576, seed), *format).expect("quantize");
            QuantizedMatrix::from_qtensor(&weights).expect("read").expect("a served format")
        })
        .collect();
    let all: Vec<&QuantizedMatrix> = matrices.iter().collect();
    for rows in [1, 2, 5, 37] {
        let values: Vec<f32> = random(rows, 576, 35).flatten_all().and_then(|x| x.to_vec1()).expect("values");
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
            let together = pool.install(|| QuantizedMatrix::matmul_many(&all, &values, rows));
            let alone = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .expect("pool")
                .install(|| all.iter().map(|matrix| matrix.matmul(&values, rows)).collect::<Vec<_>>());
            assert_eq!(together, alone, "{rows} rows on {threads} threads");
        }
    }
    let x = random(3, 576, 36);
    let tensors = QuantizedMatrix::forward_many(&all, &x).expect("forward");
    let dims: Vec<&[usize]> = tensors.iter().map(|tensor| tensor.dims()).collect();
    assert_eq!(dims, [[3, 576], [3, 192], [3, 192], [3, 70]]);
    assert!(QuantizedMatrix::forward_many(&all, &random(3, 96, 37)).is_err(), "wrong input width");
    assert!(QuantizedMatrix::forward_many(&all, &random(576, 3, 38).t().expect("t")).is_err(), "not contiguous");
}

#[test]
fn the_vectorised_input_quantization_equals_the_scalar_reference() {
    // Random rows, a zero block, exact ties (values at half steps) and a single large value.
    let mut x: Vec<f32> = random(5, 96, 11).flatten_all().and_then(|x| x.to_vec1()).expect("values");
    x[32..64].fill(0.0);
    for (i, value) in x[64..96].iter_mut().enumerate() {
        *value = (i as f32 - 16.0) * 0.5;
    }
    x[100] = 1e4;
    let mut scalar = vec![0i8; x.len()];
    let reference = quantize_blocks_scalar(&x, &mut scalar);
    let mut vectorised = vec![0i8; x.len()];
    let Some(blocks) = avx2::quantize_blocks(&x, &mut vectorised) else { return };
    assert_eq!(blocks, reference);
    assert_eq!(vectorised, scalar);
    assert!(scalar[32..64].iter().all(|&q| q == 0), "a zero block stays zero");
}

#[test]
fn every_kernel_the_cpu_has_equals_the_scalar_reference() {
    for format in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0] {
        // 70 and 13 output features: ragged row groups; 96 and 576 inputs: 3 and 18 blocks.
        for (features, inputs) in [(70, 96), (13, 576)] {
            let weights = QTensor::quantize(&random(features, inputs, 21), format).expect("quantize");
            let matrix = QuantizedMatrix::from_qtensor(&weights).expect("read").expect("a served format");
            for rows in [1, 3, 4, 5, 17] {
                let values: Vec<f32> =
                    random(rows, inputs, 22).flatten_all().and_then(|x| x.to_vec1()).expect("values");
                let input = QuantizedInput::new(&values, rows, inputs, false);
                let mut reference = vec![0f32; matrix.padded_rows() * rows];
                dot_rows_scalar(&matrix, &input, 0, &mut reference);
                for kernel in [Simd::Avx2, Simd::Avx512Vnni] {
                    let mut got = vec![0f32; matrix.padded_rows() * rows];
                    let used = matrix.dot_rows_with(kernel, &input, 0, &mut got);
                    if used != kernel {
                        println!("skipped: this CPU has no {kernel:?} kernel (fell back to {used:?})");
                        continue;
                    }
                    // The integer sums are exact; only the order of the scaled f32 additions differs.
                    for (index, (got, want)) in got.iter().zip(&reference).enumerate() {
                        assert!(
                            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{kernel:?} {format:?} {features}x{inputs}, {rows} rows, #{index}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn the_vnni_kernel_gives_the_avx2_kernels_bits() {
    // Both sum the same exact integer quads in the same order: not merely close, identical.
    for format in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0] {
        let weights = QTensor::quantize(&random(70, 576, 23), format).expect("quantize");
        let matrix = QuantizedMatrix::from_qtensor(&weights).expect("read").expect("a served format");
        for rows in [1, 6, 33] {
            let values: Vec<f32> = random(rows, 576, 24).flatten_all().and_then(|x| x.to_vec1()).expect("values");
            let input = QuantizedInput::new(&values, rows, 576, false);
            let mut avx2 = vec![0f32; matrix.padded_rows() * rows];
            let mut vnni = vec![0f32; matrix.padded_rows() * rows];
            let (narrow, wide) = (
                matrix.dot_rows_with(Simd::Avx2, &input, 0, &mut avx2),
                matrix.dot_rows_with(Simd::Avx512Vnni, &input, 0, &mut vnni),
            );
            if (narrow, wide) != (Simd::Avx2, Simd::Avx512Vnni) {
                println!("skipped: this CPU has no AVX2 or no AVX-512 VNNI kernel ({narrow:?}, {wide:?})");
                return;
            }
            assert_eq!(avx2, vnni, "{format:?}, {rows} rows");
        }
    }
}

#[test]
fn the_simd_variable_parses_its_three_levels_and_nothing_else() {
    assert_eq!(Simd::parse(""), Some(Simd::Avx512Vnni));
    assert_eq!(Simd::parse("avx512"), Some(Simd::Avx512Vnni));
    assert_eq!(Simd::parse(" AVX2 "), Some(Simd::Avx2));
    assert_eq!(Simd::parse("portable"), Some(Simd::Portable));
    assert_eq!(Simd::parse("sse4"), None);
}
