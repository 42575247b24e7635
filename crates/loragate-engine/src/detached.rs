//! Blocking work on a thread of its own, awaited with a deadline. Unlike `spawn_blocking`, a job that never
//! finishes (a read from a hung file system) holds its caller no longer than the deadline and never keeps the async
//! runtime from shutting down: the thread is detached, and whatever it produces after the deadline is dropped.

use std::time::Duration;

use tokio::sync::oneshot;

/// Why [`run_detached`] has no result.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DetachedError {
    /// The thread could not be started.
    #[error("cannot start a thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The job did not finish in time (it runs on, unobserved).
    #[error("it took longer than {0:?}")]
    TimedOut(Duration),
    /// The job panicked.
    #[error("it panicked")]
    Panicked,
}

/// Runs `job` on a new thread named `thread_name` and waits for its result for at most `limit`.
pub(crate) async fn run_detached<T, F>(thread_name: &str, limit: Duration, job: F) -> Result<T, DetachedError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    wait_detached(spawn_detached(thread_name, job)?, limit).await
}

/// Starts `job` on a new thread named `thread_name`; its result arrives on the receiver returned (to await with
/// [`wait_detached`]). Dropping the receiver drops the result, on the job's thread.
pub(crate) fn spawn_detached<T, F>(thread_name: &str, job: F) -> Result<oneshot::Receiver<T>, DetachedError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (result, receiver) = oneshot::channel();
    std::thread::Builder::new()
        .name(thread_name.to_owned())
        .spawn(move || {
            // The receiver is gone after a timeout: the result is dropped here, on this thread.
            let _ = result.send(job());
            return_freed_memory();
        })
        .map_err(DetachedError::Spawn)?;
    Ok(receiver)
}

/// Hands the pages of memory the allocator holds free back to the operating system, after a job's result was sent
/// (off its caller's path). The jobs read adapters: their temporaries (tensors of tens of KiB, under glibc's mmap
/// threshold) come from the heap of the thread's arena, where a block still in use above them (the adapter's weights)
/// keeps the freed pages resident; `malloc_trim` releases free pages anywhere in every arena. Without it, a hundred
/// pushes read as they arrived left a server up to 11 % larger. Does nothing on other C libraries.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory to the system, under the allocator's own locks.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Waits at most `limit` for the result of a job [`spawn_detached`] started.
pub(crate) async fn wait_detached<T>(receiver: oneshot::Receiver<T>, limit: Duration) -> Result<T, DetachedError> {
    match tokio::time::timeout(limit, receiver).await {
        Ok(Ok(value)) => Ok(value),
        // The sender was dropped unsent: the job unwound.
        Ok(Err(_)) => Err(DetachedError::Panicked),
        Err(_) => Err(DetachedError::TimedOut(limit)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// A runtime whose clock jumps to the next timer whenever nothing can run (so a timeout costs no wall time; a
    /// job's own thread does not count as something that can run).
    fn paused_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("runtime")
    }

    #[tokio::test]
    async fn a_job_that_finishes_gives_its_result_and_one_that_panics_says_so() {
        let limit = Duration::from_secs(3600);
        assert_eq!(run_detached("test-job", limit, || 7).await.expect("finished"), 7);
        let panicked = run_detached("test-panic", limit, || -> u32 { panic!("injected") }).await;
        assert!(matches!(panicked, Err(DetachedError::Panicked)), "{panicked:?}");
    }

    #[test]
    fn a_hung_job_times_out_and_does_not_hold_the_runtime_at_shutdown() {
        let (release, hung) = mpsc::channel::<()>();
        let runtime = paused_runtime();
        let limit = Duration::from_secs(60);
        // Paused time jumps to the deadline once nothing else can run: no wall-clock wait.
        let outcome = runtime.block_on(run_detached("test-hung", limit, move || hung.recv().is_ok()));
        assert!(matches!(outcome, Err(DetachedError::TimedOut(after)) if after == limit), "{outcome:?}");

        // A `spawn_blocking` job would make dropping the runtime wait for it; a detached thread does not.
        let (dropped, runtime_gone) = mpsc::channel();
        std::thread::spawn(move || {
            drop(runtime);
            let _ = dropped.send(());
        });
        let shut_down = runtime_gone.recv_timeout(Duration::from_secs(30));
        let _ = release.send(());
        assert!(shut_down.is_ok(), "the runtime waited for the hung job");
    }
}
