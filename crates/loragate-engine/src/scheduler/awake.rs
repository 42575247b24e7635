//! The compute pool's other workers kept awake for the length of a step ([`AwakeWorkers`]).
//!
//! A decode step of a few rows is some two hundred parallel regions (a layer's q/k/v products, its output
//! projection, its gate/up products, its down projection, then the LM head), each tens of microseconds, separated by
//! short serial work on the step's thread (norms, RoPE, attention of short contexts, sampling). Rayon's idle workers
//! go to sleep after a few microseconds without work, so each region had to wake a worker through the kernel, and
//! by the time it was running the step's thread had done most of the region alone: profiling one stream of
//! SmolLM2-135M on two threads, the step's thread took 88 % of the engine's samples and the other worker 4.5 %.
//!
//! So while a step runs, every other worker of the pool runs a broadcast job that takes pending work the moment it
//! appears (`rayon::yield_now`, which steals from the step's thread) and otherwise spins (`spin_loop`), until the
//! step ends (the guard is dropped) or no work came for [`MAX_IDLE`]. That is one wake-up per worker and step
//! instead of one per region; llama.cpp's workers likewise spin between the operations of a graph. Between steps,
//! and whenever the engine is idle, the workers sleep as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a worker keeps spinning without finding work before it goes back to sleep, in case a step does a long
/// serial stretch (the step's end stops it at once either way).
const MAX_IDLE: Duration = Duration::from_millis(1);

/// `spin_loop` hints between two looks for work: a look reads the other workers' deques, which the step's thread
/// writes as it splits its work.
const SPINS_BETWEEN_LOOKS: usize = 16;

/// Looks for work between two readings of the clock.
const LOOKS_BETWEEN_CLOCKS: usize = 64;

/// While held, the calling worker's pool's other workers stay awake, taking its parallel work as soon as it is
/// split off (see the module's documentation).
pub(super) struct AwakeWorkers {
    done: Arc<AtomicBool>,
}

impl AwakeWorkers {
    /// Keeps the other workers of the current thread's pool awake until the guard is dropped; `None` outside a pool
    /// or in a pool of one thread (nothing to keep awake).
    pub(super) fn engage() -> Option<Self> {
        let step_thread = rayon::current_thread_index()?;
        if rayon::current_num_threads() < 2 {
            return None;
        }
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        // Every worker gets the job, this one too (it runs it the next time it waits for stolen work, or at a later
        // step, and returns at once).
        rayon::spawn_broadcast(move |context| {
            if context.index() != step_thread {
                help_until(&flag);
            }
        });
        Some(Self { done })
    }
}

impl Drop for AwakeWorkers {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
    }
}

/// Runs the pool's pending work until `done` is set or none came for [`MAX_IDLE`].
fn help_until(done: &AtomicBool) {
    let mut idle_since: Option<Instant> = None;
    let mut looks = 0usize;
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            idle_since = None;
            continue;
        }
        looks += 1;
        if looks.is_multiple_of(LOOKS_BETWEEN_CLOCKS) {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= MAX_IDLE {
                return;
            }
        }
        for _ in 0..SPINS_BETWEEN_LOOKS {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[test]
    fn nothing_to_keep_awake_outside_a_pool_or_in_a_pool_of_one() {
        assert!(AwakeWorkers::engage().is_none(), "the test's own thread is no worker");
        let single = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
        assert!(single.install(AwakeWorkers::engage).is_none());
    }

    #[test]
    fn awake_workers_take_split_work_and_stop_when_released() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
        let workers_used = pool.install(|| {
            let awake = AwakeWorkers::engage().expect("a pool of three");
            let used: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            // Many small regions, as a decode step has: each one's tasks run on whichever worker takes them.
            for _ in 0..200 {
                rayon::scope(|scope| {
                    for _ in 0..8 {
                        scope.spawn(|_| {
                            let index = rayon::current_thread_index().expect("a worker");
                            used[index].fetch_add(1, Ordering::Relaxed);
                            std::hint::black_box((0..2_000u64).sum::<u64>());
                        });
                    }
                });
            }
            drop(awake);
            used.iter().map(|count| count.load(Ordering::Relaxed)).collect::<Vec<_>>()
        });
        assert_eq!(workers_used.iter().sum::<usize>(), 1600, "every task ran once: {workers_used:?}");
        // Released, the helpers return: a broadcast that needs every worker completes.
        let reached: Vec<usize> = pool.broadcast(|context| context.index());
        assert_eq!(reached, vec![0, 1, 2]);
    }
}
