//! Freed large buffers go back to the operating system.
//!
//! glibc serves allocations of at least its mmap threshold (128 KiB) with their own mappings, unmapped on free, but
//! by default raises the threshold to the size of any such block that is freed (up to 32 MiB). The first freed
//! request body (up to the 4 MiB body limit) or connection read buffer (up to ~400 KiB) thus moves every later one
//! into the heap, whose freed pages stay with the process: a burst of 100 held 1 MiB completions left the server
//! 45 MB larger for good (issue 20). Pinning the threshold keeps such buffers in their own mappings, so freeing one
//! returns its memory at once; allocations smaller than 128 KiB are unaffected.

/// glibc's default mmap threshold, pinned.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Pins glibc's mmap threshold at its default (see the module documentation), unless the operator chose one with
/// `MALLOC_MMAP_THRESHOLD_`. Does nothing on other C libraries.
pub fn return_large_frees_to_the_os() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: `mallopt` only changes the allocator's parameters (under its own lock); it is called with a valid
        // parameter and value, from the main thread.
        #[allow(unsafe_code)]
        let _ = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
    }
}
