//! Python bindings: argument extraction and GIL handling only; the work is
//! done by `crate::engine` with the GIL released.

mod arenas;
mod collate;
mod engine;
mod errors;
mod fork_gate;
mod gil_takes;
mod inherit;
mod io_array;
mod io_image;
mod io_source;
mod io_video;
mod locked;
mod proc_status;
mod sample_collate;
mod sample_engine;
mod sample_ledger;
mod sample_progress;
mod sample_seed;
mod slots;
mod spare_cores;
mod stats;
mod wire;
mod worker;

use pyo3::marker::Ungil;
use pyo3::prelude::*;

use crate::thread_exit::hang_on_thread_exit;

/// `py.detach(f)`, as every binding releases the GIL. A thread that wants it
/// back once the interpreter finalizes (a daemon thread waiting on a loader,
/// or decoding, at exit) blocks there instead of being unwound through these
/// frames, which would abort the process (see `crate::thread_exit`).
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    let result = hang_on_thread_exit(|| py.detach(f));
    gil_takes::took_gil();
    result
}

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
    wire::register(m)?;
    slots::register(m)?;
    arenas::register(m)?;
    gil_takes::register(m)?;
    fork_gate::register(m)?;
    inherit::register(m)?;
    sample_seed::register(m)?;
    sample_ledger::register(m)?;
    sample_progress::register(m)?;
    spare_cores::register(m)?;
    proc_status::register(m)?;
    Ok(())
}
