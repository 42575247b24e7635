//! The module's tokio runtime (pyo3-async-runtimes' own, so that `sample_async` and the blocking calls share it),
//! and blocking on it from Python with the GIL released.

use std::future::Future;
use std::time::Duration;

use pyo3::prelude::*;

/// How often a blocking call looks at Python's signals (so that Ctrl-C interrupts it).
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// The module's runtime.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// Runs `future` to its end on the module's runtime with the GIL released, so that other Python threads run
/// meanwhile. Every [`SIGNAL_POLL`] it takes the GIL for a moment to run Python's signal handlers: a
/// `KeyboardInterrupt` (on the main thread) drops the future, which cancels its calls, and is raised.
pub(crate) fn block_on<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    py.detach(|| {
        runtime().block_on(async {
            let mut future = std::pin::pin!(future);
            loop {
                tokio::select! {
                    output = &mut future => return Ok(output),
                    () = tokio::time::sleep(SIGNAL_POLL) => Python::attach(|py| py.check_signals())?,
                }
            }
        })
    })
}
