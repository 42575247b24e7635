//! This thread's CPU time, for the engine's benchmarks that time kernels by the CPU they spend rather than the wall
//! clock (shared by path: `#[path = "support/thread_cpu_time.rs"] mod thread_cpu_time;`).

use std::time::{Duration, Instant};

/// This thread's CPU time so far (`/proc/thread-self/schedstat`), or the wall time since the first call where
/// that file is missing.
pub(crate) fn cpu_time() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat").ok();
    match schedstat.and_then(|line| line.split_whitespace().next()?.parse::<u64>().ok()) {
        Some(nanos) => Duration::from_nanos(nanos),
        None => START.get_or_init(Instant::now).elapsed(),
    }
}
