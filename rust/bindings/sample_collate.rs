//! The sample engine's collate thread calling into Python.

use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::engine::Collate;
use crate::thread_exit::hang_on_thread_exit;

/// Calls `collate(samples)` (the iterator's collate stage: the user's
/// `collate_fn`, then pinning) on the engine's collate thread.
pub(crate) struct PythonCollate {
    pub collate: Py<PyAny>,
}

impl Collate<PyResult<Py<PyAny>>> for PythonCollate {
    /// The collated batch, or the error of the first sample whose runner failed.
    type Batch = PyResult<Py<PyAny>>;

    /// Attached once for the thread's life, as a worker thread is (see
    /// `worker::attach_for_thread_life`): the GIL is held only in `collate`.
    fn enter_thread(&self, body: &mut (dyn FnMut() + Send)) {
        hang_on_thread_exit(|| Python::attach(|py| py.detach(body)));
    }

    fn collate(&self, samples: Vec<PyResult<Py<PyAny>>>) -> Self::Batch {
        Python::attach(|py| {
            let samples: Vec<Py<PyAny>> = samples.into_iter().collect::<PyResult<_>>()?;
            self.collate.call1(py, (PyList::new(py, samples)?,))
        })
    }
}
