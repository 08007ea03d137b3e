//! Python bindings: argument extraction and GIL handling only; the work is
//! done by `crate::engine` with the GIL released.

mod collate;
mod engine;
mod errors;
mod io_array;
mod io_image;
mod io_source;
mod io_video;
mod locked;
mod sample_engine;
mod stats;
mod worker;

use pyo3::prelude::*;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::PyEngine>()?;
    m.add_class::<sample_engine::PySampleEngine>()?;
    m.add(
        "DecodeError",
        m.py().get_type::<errors::python::DecodeError>(),
    )?;
    collate::register(m)?;
    io_image::register(m)?;
    io_array::register(m)?;
    io_video::register(m)?;
    Ok(())
}
