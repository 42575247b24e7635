//! A decode step's quantized products, in time per step: SmolLM2-135M's shape (30 layers of Q4_1 matrices, q/k/v,
//! output, gate/up and down, and the LM head in Q8_0, as its GGUF file has them), seeded random weights, one and
//! four input rows (a step of one and of four sequences).
//!
//! - `… 1 thread`: on this thread alone (a one-thread pool that includes it), in this thread's CPU time (from
//!   `/proc/thread-self/schedstat`): what the kernels cost, whatever else runs on the machine.
//! - `… 2 threads`: on a pool of two threads, in wall time (what a step waits for; noisy on a shared machine).
//!
//! `LORAGATE_SIMD=avx2|portable` caps the kernels as in the engine. `cargo bench -p loragate-engine --bench
//! products` (`--profile dev` builds faster; the engine is at opt-level 3 there too).

use std::time::{Duration, Instant};

use candle_core::quantized::GgmlDType;
use loragate_engine::kernel_bench::{ProductShape, ProductsCase};

#[path = "support/thread_cpu_time.rs"]
mod thread_cpu_time;

use self::thread_cpu_time::cpu_time;

/// Samples per figure; the median is printed.
const SAMPLES: usize = 15;
/// Time a sample aims for.
const SAMPLE_TIME: Duration = Duration::from_millis(200);

/// The median time per call of `call`, by `clock`.
fn measure(clock: fn() -> Duration, call: &mut dyn FnMut() -> f32) -> Duration {
    let start = Instant::now();
    std::hint::black_box(call());
    let iterations = (SAMPLE_TIME.as_nanos() / start.elapsed().as_nanos().max(1)).max(1) as u32;
    let mut samples: Vec<Duration> = (0..SAMPLES)
        .map(|_| {
            let start = clock();
            for _ in 0..iterations {
                std::hint::black_box(call());
            }
            (clock() - start) / iterations
        })
        .collect();
    samples.sort();
    samples[SAMPLES / 2]
}

fn wall_time() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

fn millis(time: Duration) -> String {
    format!("{:.3} ms", time.as_secs_f64() * 1e3)
}

fn main() {
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).use_current_thread().build().expect("pool");
    let two = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
    println!("{:<28} {:>14} {:>14}", "products per step", "1 thread CPU", "2 threads wall");
    for rows in [1, 4] {
        let case = ProductsCase::new(ProductShape::SMOLLM2_135M, GgmlDType::Q4_1, rows).expect("case");
        let layers = (
            one.install(|| measure(cpu_time, &mut || case.layers())),
            two.install(|| measure(wall_time, &mut || case.layers())),
        );
        println!("{:<28} {:>14} {:>14}", format!("{rows} row(s): 30 layers, Q4_1"), millis(layers.0), millis(layers.1));
        let head = (
            one.install(|| measure(cpu_time, &mut || case.lm_head())),
            two.install(|| measure(wall_time, &mut || case.lm_head())),
        );
        println!("{:<28} {:>14} {:>14}", format!("{rows} row(s): LM head, Q8_0"), millis(head.0), millis(head.1));
    }
}
