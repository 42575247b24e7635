//! The CPU attention kernels over paged KV caches, in CPU time per call: SmolLM2-135M's shape (9 query heads, 3
//! key/value heads of 64), one layer, contexts of 256, 700 and 1,500 positions (the multi-turn scene's turns span
//! 120–1,300), blocks scattered through the pool.
//!
//! - `decode R×C`: the decode rows' attention of `R` sequences of `C` positions (the multi-turn scene decodes 4),
//!   with the AVX2 kernel and with the AVX-512 one, measured in alternating samples of the same run: an A/B that
//!   a shared machine's load moves alike (where the CPU lacks AVX-512 both columns run the AVX2 kernel).
//! - `chunk C`: a 128-token prefill chunk at the end of a `C`-position sequence.
//!
//! Everything runs on this thread (a one-thread pool that includes it), and the time is the thread's CPU time, read
//! from `/proc/thread-self/schedstat` (wall time where that file is missing): a descheduled thread does not count.
//!
//! `cargo bench -p loragate-engine --bench attention` (`--profile dev` builds faster; the engine is at opt-level 3
//! there too).

use std::time::{Duration, Instant};

use loragate_engine::kernel_bench::{AttentionCase, AttentionShape, Kernels};

#[path = "support/thread_cpu_time.rs"]
mod thread_cpu_time;

use self::thread_cpu_time::cpu_time;

const CONTEXTS: [usize; 3] = [256, 700, 1500];
const CHUNK: usize = 128;
/// Samples per figure; the median is printed.
const SAMPLES: usize = 15;
/// CPU time a sample aims for.
const SAMPLE_TIME: Duration = Duration::from_millis(100);

/// The CPU time of one call of `call`, averaged over `iterations` calls.
fn sample(iterations: usize, call: &mut dyn FnMut()) -> Duration {
    let start = cpu_time();
    for _ in 0..iterations {
        call();
    }
    (cpu_time() - start) / iterations as u32
}

/// Median CPU time per call of each of `calls`, sampled in turn (`A B A B …`).
fn measure(calls: &mut [&mut dyn FnMut()]) -> Vec<Duration> {
    let iterations: Vec<usize> = calls
        .iter_mut()
        .map(|call| {
            call();
            // Sized by wall time: the scheduler updates a running thread's CPU time only every few milliseconds.
            let start = Instant::now();
            for _ in 0..3 {
                call();
            }
            let once = (start.elapsed() / 3).max(Duration::from_micros(1));
            (SAMPLE_TIME.as_nanos() / once.as_nanos()).max(1) as usize
        })
        .collect();
    let mut samples = vec![Vec::with_capacity(SAMPLES); calls.len()];
    for _ in 0..SAMPLES {
        for ((call, iterations), samples) in calls.iter_mut().zip(&iterations).zip(&mut samples) {
            samples.push(sample(*iterations, *call));
        }
    }
    samples
        .into_iter()
        .map(|mut samples| {
            samples.sort();
            samples[samples.len() / 2]
        })
        .collect()
}

fn micros(time: Duration) -> String {
    format!("{:.1} µs", time.as_secs_f64() * 1e6)
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).use_current_thread().build().expect("pool");
    let shape = AttentionShape::SMOLLM2_135M;
    println!("{:<18} {:>12} {:>12} {:>8}", "case", "AVX2", "AVX-512", "ratio");
    pool.install(|| {
        for context in CONTEXTS {
            for rows in [1, 4] {
                let case = AttentionCase::new(shape, rows, context, rows).expect("case");
                let mut avx2 = || drop(case.decode(Kernels::Avx2).expect("decode"));
                let mut avx512 = || drop(case.decode(Kernels::Avx512).expect("decode"));
                let times = measure(&mut [&mut avx2, &mut avx512]);
                let ratio = times[1].as_secs_f64() / times[0].as_secs_f64();
                let name = format!("decode {rows}×{context}");
                println!("{name:<18} {:>12} {:>12} {ratio:>7.2}×", micros(times[0]), micros(times[1]));
            }
            let case = AttentionCase::new(shape, 1, context, CHUNK).expect("case");
            let mut chunk = || drop(case.chunk(CHUNK).expect("chunk"));
            let times = measure(&mut [&mut chunk]);
            println!("{:<18} {:>12}", format!("chunk {CHUNK}@{context}"), micros(times[0]));
        }
    });
}
