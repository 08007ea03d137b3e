//! A count of the times minato's bindings take the GIL: a worker's task
//! entering Python, a batch's collate, and every return from a GIL-free
//! wait (a socket, a decode, the consumer's wait for a batch). Python's own
//! hand-overs between its threads are not seen here. benchmarks/manycore.py
//! reports it per batch.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;

static TAKES: AtomicU64 = AtomicU64::new(0);

/// Counts one take of the GIL.
pub(crate) fn took_gil() {
    TAKES.fetch_add(1, Ordering::Relaxed);
}

/// The GIL takes counted since the module was loaded.
#[pyfunction]
fn _gil_takes() -> u64 {
    TAKES.load(Ordering::Relaxed)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_gil_takes, m)?)
}
