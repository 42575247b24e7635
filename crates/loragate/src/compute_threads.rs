//! How many CPU threads candle's tensor operations use.
//!
//! Candle reads the count from the environment (`RAYON_NUM_THREADS`) on every large op, with no setter, so the only
//! way to choose it in-process is to set the variable before any thread starts. The engine builds its own compute
//! pool of that many threads and runs its steps on it (the quantized products and candle's matmuls split there).
//! Candle's element-wise ops have a second pool of their own (`CANDLE_NUM_THREADS`) whose workers spin while they
//! wait; beside the compute pool on a few cores those spinning workers take the cores the products need (a quarter
//! of a profile of a swap), so it is set to one thread: element-wise ops run on the step's own thread.

/// `$RAYON_NUM_THREADS` if set to a positive number, else every core this process may use (as llama.cpp and vLLM
/// do): decoding is bound by reading the weights, and one core alone reads them more slowly than all of them, while
/// the compute pool's workers sleep once they run out of work, so the control plane's threads still get the cores
/// between a step's products (see `--compute-threads` in `serve --help` for the measurements).
pub fn default_compute_threads() -> usize {
    let from_env = std::env::var("RAYON_NUM_THREADS").ok().and_then(|raw| raw.parse::<usize>().ok());
    from_env
        .filter(|&threads| threads > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get))
}

/// Makes candle's tensor operations use `threads` CPU threads (at least 1), and its element-wise ops the calling
/// thread alone.
///
/// # Safety
///
/// Changes the process environment, so it must run before the process starts any other thread (first thing in
/// `main`, before the async runtime): see [`std::env::set_var`].
#[allow(unsafe_code)]
pub unsafe fn set_compute_threads(threads: usize) {
    let threads = threads.max(1).to_string();
    // SAFETY: the caller guarantees that no other thread exists yet, so nothing reads the environment concurrently.
    unsafe {
        std::env::set_var("RAYON_NUM_THREADS", &threads);
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}
