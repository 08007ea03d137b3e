//! The worker-thread side: how an engine worker calls into Python.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::fork_gate::attach_for_thread_life;
use super::sample_progress::reporting_to;
use super::stats::GilWait;
use crate::engine::{Outcome, Sample, TaskClock, WorkerHooks};

/// Calls `make_worker(worker_id)` on the worker thread; its result (the
/// per-thread runner, or the worker_init_fn's exception) is the thread's state.
fn make_runner(make_worker: &Py<PyAny>, worker_id: usize) -> PyResult<Py<PyAny>> {
    Python::attach(|py| make_worker.call1(py, (worker_id,)))
}

/// Runs the Python callables of `minato._task.runner` on engine threads.
pub(crate) struct PythonWorker {
    /// `make_worker(worker_id) -> run`, called once on each worker thread.
    pub make_worker: Py<PyAny>,
    /// What `run(epoch, payload)` returns when its worker has no more data.
    pub exhausted: Py<PyAny>,
    pub gil_wait: GilWait,
}

impl WorkerHooks for PythonWorker {
    type Payload = Py<PyAny>;
    type Output = PyResult<Py<PyAny>>;
    type State = PyResult<Py<PyAny>>;

    fn enter_thread(&self, _worker_id: usize, body: &mut (dyn FnMut() + Send)) {
        attach_for_thread_life(body);
    }

    fn init(&self, worker_id: usize) -> Self::State {
        make_runner(&self.make_worker, worker_id)
    }

    /// The engine calls [`Self::run_timed`]; this is for a caller without a
    /// task clock.
    fn run(
        &self,
        state: &mut Self::State,
        epoch: u64,
        payload: Py<PyAny>,
    ) -> Outcome<Self::Output> {
        self.run_timed(state, epoch, payload, &TaskClock::default())
    }

    /// Runs the task; the wait for the GIL is a pause on `clock`.
    fn run_timed(
        &self,
        state: &mut Self::State,
        epoch: u64,
        payload: Py<PyAny>,
        clock: &TaskClock,
    ) -> Outcome<Self::Output> {
        self.gil_wait.attach(clock, |py| {
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

/// One sample of a task as the engine holds it: its position in the epoch
/// (its identity in the ledger), the sampler's index, and the epoch's seed.
/// The worker thread that runs it hands the runner `(position, index,
/// seed)`: the training thread, which submits it, builds no Python object
/// per sample.
pub(crate) struct SampleTask {
    pub position: u64,
    pub index: Py<PyAny>,
    pub seed: Arc<Py<PyAny>>,
}

impl SampleTask {
    /// The runner's tuple, taking the index's reference: consumed with the
    /// GIL held, so no reference is left to drop without it (pyo3 queues
    /// such a decref on a lock that every thread's next attach takes).
    fn into_python(self, py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
        let position = self.position.into_pyobject(py)?.into_any();
        PyTuple::new(
            py,
            [
                position,
                self.index.into_bound(py),
                self.seed.bind(py).clone(),
            ],
        )
    }
}

/// Runs `minato._task.runner`'s sample runner: `run(epoch, tasks) -> samples`,
/// one sample (or an ExceptionWrapper, or a skipped sample's record) per
/// `(position, index, seed)` task.
pub(crate) struct PythonSampleWorker {
    /// `make_worker(worker_id) -> run`, called once on each worker thread.
    pub make_worker: Py<PyAny>,
    /// The type of the records `run` returns for samples it skipped.
    pub skipped_type: Py<PyAny>,
    pub gil_wait: GilWait,
}

impl WorkerHooks for PythonSampleWorker {
    type Payload = Vec<SampleTask>;
    type Output = Vec<Sample<PyResult<Py<PyAny>>>>;
    type State = PyResult<Py<PyAny>>;

    fn enter_thread(&self, _worker_id: usize, body: &mut (dyn FnMut() + Send)) {
        attach_for_thread_life(body);
    }

    fn init(&self, worker_id: usize) -> Self::State {
        make_runner(&self.make_worker, worker_id)
    }

    /// The engine calls [`Self::run_timed`]; this is for a caller without a
    /// task clock.
    fn run(
        &self,
        state: &mut Self::State,
        epoch: u64,
        indices: Self::Payload,
    ) -> Outcome<Self::Output> {
        self.run_timed(state, epoch, indices, &TaskClock::default())
    }

    /// Runs the task; the wait for the GIL is a pause on `clock`.
    fn run_timed(
        &self,
        state: &mut Self::State,
        epoch: u64,
        indices: Self::Payload,
        clock: &TaskClock,
    ) -> Outcome<Self::Output> {
        self.gil_wait.attach(clock, |py| {
            let count = indices.len();
            let samples: PyResult<Vec<Py<PyAny>>> = state
                .as_ref()
                .map_err(|err| err.clone_ref(py))
                .and_then(|run| {
                    let tasks = indices
                        .into_iter()
                        .map(|task| task.into_python(py))
                        .collect::<PyResult<Vec<_>>>()?;
                    let indices = PyList::new(py, tasks)?;
                    let samples = reporting_to(clock, || run.bind(py).call1((epoch, indices)))?;
                    samples
                        .try_iter()?
                        .map(|sample| sample.map(Bound::unbind))
                        .collect()
                });
            // Every index gets an output, so the batch accounting holds even
            // when the runner itself failed.
            let skipped_type = self.skipped_type.bind(py);
            Outcome::Value(match samples {
                Ok(samples) => samples
                    .into_iter()
                    .map(|sample| {
                        if sample.bind(py).is_instance(skipped_type).unwrap_or(false) {
                            Sample::Skipped(Ok(sample))
                        } else {
                            Sample::Loaded(Ok(sample))
                        }
                    })
                    .collect(),
                Err(err) => (0..count)
                    .map(|_| Sample::Loaded(Err(err.clone_ref(py))))
                    .collect(),
            })
        })
    }
}
