//! This process's own memory figures (see `crate::proc_status`).

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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_own_status_bytes, m)?)
}
