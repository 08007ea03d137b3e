//! Whether cores are spare: how long threads waited for a core, which
//! worker_method="auto" reads to tell threads that lack cores (a busy
//! machine) from threads that wait for each other (the GIL), and how busy
//! the cores this process may run on are, whatever runs on them.

use pyo3::prelude::*;

use crate::engine;

/// Seconds this process's live threads have spent runnable but waiting for
/// a core, or None where the kernel does not report it. Reads a file per
/// thread: the GIL is released meanwhile.
#[pyfunction]
fn _runnable_wait(py: Python<'_>) -> Option<f64> {
    super::detach(py, engine::runnable_wait).map(|waited| waited.as_secs_f64())
}

/// The same for the calling thread alone. The GIL is kept (one short read):
/// it is read around a measured hand-over of the GIL, which releasing it
/// here would add to.
#[pyfunction]
fn _thread_runnable_wait() -> Option<f64> {
    engine::thread_runnable_wait().map(|waited| waited.as_secs_f64())
}

/// Seconds the cores this process may run on have spent busy so far, every
/// process's work counted, or None where the kernel does not report it.
#[pyfunction]
fn _cores_busy_time() -> Option<f64> {
    engine::cores_busy_time().map(|busy| busy.as_secs_f64())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_cores_busy_time, m)?)?;
    m.add_function(wrap_pyfunction!(_runnable_wait, m)?)?;
    m.add_function(wrap_pyfunction!(_thread_runnable_wait, m)?)
}
