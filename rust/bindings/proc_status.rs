//! Memory figures from `/proc` (see `crate::proc_status`).

use pyo3::prelude::*;

use crate::proc_status;

/// The `field` line of `/proc/self/status` in bytes, or None where the
/// kernel does not tell. The GIL is kept (a read of microseconds): released,
/// it would be taken back only after a switch interval of each worker
/// thread that holds it, tens of milliseconds beside pure-Python datasets.
#[pyfunction]
fn _own_status_bytes(field: &str) -> Option<u64> {
    proc_status::own_status_bytes(field)
}

/// The pages process `pid` alone has written, in bytes, or None where the
/// kernel does not tell or the process is gone. The GIL is released: the
/// kernel walks the process's page tables (milliseconds for a large one).
#[pyfunction]
fn _private_dirty_bytes(py: Python<'_>, pid: u32) -> Option<u64> {
    super::detach(py, || proc_status::private_dirty_bytes(pid))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_own_status_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(_private_dirty_bytes, m)?)
}
