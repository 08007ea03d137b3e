//! Python bindings: argument extraction and GIL handling only; the work is
//! done by `crate::engine` with the GIL released.

mod engine;
mod errors;
mod locked;
mod sample_engine;
mod stats;
mod worker;

use pyo3::prelude::*;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::PyEngine>()?;
    m.add_class::<sample_engine::PySampleEngine>()?;
    Ok(())
}
