//! Buffers a compute thread keeps from one use to the next. A prefill chunk's intermediate results are hundreds of
//! KB, above glibc's mmap threshold (which `serve` pins at its default), so a fresh buffer is fresh pages, faulted
//! in and zeroed by the kernel, every time.

use std::cell::Cell;
use std::thread::LocalKey;

/// Where a thread keeps one buffer.
pub(crate) type Kept = LocalKey<Cell<Vec<f32>>>;

/// `len` zeros in the buffer `kept` holds on this thread. It is taken out meanwhile, so a task of another engine's
/// pass that this thread picks up while it waits allocates its own.
pub(crate) fn take_zeroed(kept: &'static Kept, len: usize) -> Vec<f32> {
    let mut buffer = kept.take();
    buffer.clear();
    buffer.resize(len, 0.0);
    buffer
}

/// Keeps `buffer` for the next use on this thread, unless it holds more than `max_values` (a rare large one is
/// not held for good).
pub(crate) fn keep(kept: &'static Kept, buffer: Vec<f32>, max_values: usize) {
    if buffer.capacity() <= max_values {
        kept.set(buffer);
    }
}
