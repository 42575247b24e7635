//! How many CPU threads candle's tensor operations use.
//!
//! Candle reads the count from the environment (`RAYON_NUM_THREADS`, `CANDLE_NUM_THREADS`) on every large op, with
//! no setter, so the only way to choose it in-process is to set those variables before any thread starts. On the
//! 2-core machine of `docs/benchmarks.md`, one compute thread decodes 1.5–4× faster than two, and refills the
//! batch after a weight swap about 3× faster.

/// `$RAYON_NUM_THREADS` if set to a positive number, else half the cores this process may use, at least 1.
pub fn default_compute_threads() -> usize {
    let from_env = std::env::var("RAYON_NUM_THREADS").ok().and_then(|raw| raw.parse::<usize>().ok());
    from_env
        .filter(|&threads| threads > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).max(1)))
}

/// Makes candle's tensor operations use `threads` CPU threads (at least 1).
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
        std::env::set_var("CANDLE_NUM_THREADS", &threads);
    }
}
