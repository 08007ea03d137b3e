//! minato's Rust core: a framework-agnostic worker-thread engine (`engine`),
//! decoders (`io`), batch assembly (`collate`), the thread pool those two
//! share (`parallel`), fork detection (`process`), this process's own
//! memory figures (`proc_status`), keeping forks and threads' first attach
//! to Python apart (`fork_gate`), keeping threads from being unwound at
//! interpreter exit (`thread_exit`), the worker-process wire (`wire`) and,
//! behind the `python` feature, thin Python bindings (`bindings`).

pub mod collate;
pub mod engine;
pub mod fork_gate;
pub mod io;
pub mod parallel;
pub mod proc_status;
pub mod process;
pub mod thread_exit;
#[cfg(unix)]
pub mod wire;

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
