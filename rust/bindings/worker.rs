//! The worker-thread side: how an engine worker calls into Python.

use pyo3::prelude::*;

use crate::engine::{Outcome, WorkerHooks};

/// Runs the Python callables of `minato._worker` on engine threads.
pub(crate) struct PythonWorker {
    /// `make_worker(worker_id) -> run`, called once on each worker thread.
    pub make_worker: Py<PyAny>,
    /// What `run(epoch, payload)` returns when its worker has no more data.
    pub exhausted: Py<PyAny>,
}

impl WorkerHooks for PythonWorker {
    type Payload = Py<PyAny>;
    type Output = PyResult<Py<PyAny>>;
    type State = PyResult<Py<PyAny>>;

    fn enter_thread(&self, _worker_id: usize, body: &mut (dyn FnMut() + Send)) {
        // Attaching once for the thread's life keeps one interpreter thread
        // state: thread-locals (the worker's WorkerInfo) persist between
        // tasks, and each task's attach only re-takes the GIL. The GIL itself
        // is released at once and held only around calls into Python.
        Python::attach(|py| py.detach(body));
    }

    fn init(&self, worker_id: usize) -> Self::State {
        Python::attach(|py| self.make_worker.call1(py, (worker_id,)))
    }

    fn run(
        &self,
        state: &mut Self::State,
        epoch: u64,
        payload: Py<PyAny>,
    ) -> Outcome<Self::Output> {
        Python::attach(|py| {
            let run = match state {
                Ok(run) => run,
                Err(err) => return Outcome::Value(Err(err.clone_ref(py))),
            };
            match run.call1(py, (epoch, payload)) {
                Ok(out) if out.is(&self.exhausted) => Outcome::Exhausted,
                result => Outcome::Value(result),
            }
        })
    }
}
