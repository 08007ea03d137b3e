//! minato's Rust core: a framework-agnostic worker-thread engine (`engine`) and,
//! behind the `python` feature, its thin Python bindings (`bindings`).

pub mod collate;
pub mod engine;
pub mod io;
pub mod thread_exit;

#[cfg(feature = "python")]
mod bindings;

#[cfg(feature = "python")]
use pyo3::prelude::*;

/// The private extension module `minato._minato`.
#[cfg(feature = "python")]
#[pymodule(gil_used = false)]
fn _minato(m: &Bound<'_, PyModule>) -> PyResult<()> {
    bindings::register(m)
}
