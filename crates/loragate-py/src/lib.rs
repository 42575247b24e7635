//! `loragate._native`: the Python package's extension module, built from the Rust clients of `loragate-client`
//! with PyO3 (maturin builds it: `pip install ./crates/loragate-py`; the package `loragate` in `python/` re-exports
//! it). See `docs/python.md`.
//!
//! - [`sampling::SamplingClient`]: the retry client. `sample` blocks with the GIL released; `sample_async` is an
//!   asyncio awaitable running on the module's tokio runtime.
//! - [`trainer::TrainerClient`]: push, swap, pause, resume, wait, staleness, list.
//! - [`results`]: what the calls answer, as frozen Python objects.
//! - [`errors`]: every failure becomes one of `loragate.errors`' exceptions, in one place.

mod errors;
mod results;
mod runtime;
mod sampling;
mod tensors;
mod trainer;
mod words;

use pyo3::prelude::*;

/// The extension module: the clients and their result types (the package's `__init__.py` re-exports them).
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<sampling::SamplingClient>()?;
    module.add_class::<trainer::TrainerClient>()?;
    module.add_class::<results::SampleResult>()?;
    module.add_class::<results::Sequence>()?;
    module.add_class::<results::Segment>()?;
    module.add_class::<results::SwapResult>()?;
    module.add_class::<results::PauseResult>()?;
    module.add_class::<results::ResumeResult>()?;
    module.add_class::<results::Staleness>()?;
    module.add_class::<results::AdapterStatus>()?;
    module.add_class::<results::AdapterPause>()?;
    module.add_class::<results::AdapterVersion>()?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
