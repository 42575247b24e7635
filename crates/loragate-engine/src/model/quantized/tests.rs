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
