//! `minato._minato.Engine`: the task-level engine as the Python iterator drives it.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::detach;
use super::errors::LoaderError;
use super::locked::Locked;
use super::stats::{self, GilWait};
use super::worker::PythonWorker;
use crate::engine::{Dispatch, Engine, EngineConfig, EngineError, Order};

/// Worker threads running `make_worker(id)(epoch, payload)` for each submitted payload.
#[pyclass(name = "Engine", module = "minato._minato", frozen)]
pub(crate) struct PyEngine {
    engine: Locked<Engine<PythonWorker>>,
    gil_wait: GilWait,
}

#[pymethods]
impl PyEngine {
    #[new]
    #[allow(clippy::too_many_arguments)] // one per keyword argument
    #[pyo3(signature = (make_worker, exhausted, *, num_workers, max_in_flight, in_order, round_robin, shutdown_grace, max_workers=None))]
    fn new(
        py: Python<'_>,
        make_worker: Py<PyAny>,
        exhausted: Py<PyAny>,
        num_workers: usize,
        max_in_flight: usize,
        in_order: bool,
        round_robin: bool,
        shutdown_grace: f64,
        max_workers: Option<usize>,
    ) -> PyResult<Self> {
        let config = EngineConfig {
            num_workers,
            max_in_flight,
            order: if in_order {
                Order::Submission
            } else {
                Order::Completion
            },
            dispatch: match (round_robin, in_order) {
                (false, _) => Dispatch::Shared,
                (true, true) => Dispatch::RoundRobin,
                (true, false) => Dispatch::FairShare,
            },
            shutdown_grace: Duration::from_secs_f64(shutdown_grace.max(0.0)),
            adaptive: stats::adaptive(num_workers, max_workers),
        };
        let gil_wait = GilWait::default();
        let hooks = PythonWorker {
            make_worker,
            exhausted,
            gil_wait: gil_wait.clone(),
        };
        let engine = detach(py, || Engine::start(config, hooks)).map_err(LoaderError::from)?;
        Ok(PyEngine {
            engine: Locked::new(engine),
            gil_wait,
        })
    }

    /// Worker threads running now.
    #[getter]
    fn num_workers(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.engine.quick(py, |engine| engine.num_workers())?)
    }

    /// Whether `submit` accepts a payload now (the in-flight bound).
    fn can_submit(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.engine.quick(py, |engine| engine.can_submit())?)
    }

    /// Submitted payloads of this epoch not yet delivered.
    fn pending(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.engine.quick(py, |engine| engine.pending())?)
    }

    /// The engine's figures, as a dict (see `minato.LoaderStats`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let snapshot = self.engine.quick(py, |engine| engine.stats())?;
        stats::to_dict(py, &snapshot, &self.gil_wait)
    }

    /// Queues a payload of `samples` samples; False when every worker is
    /// exhausted for this epoch.
    #[pyo3(signature = (payload, samples=1))]
    fn submit(&self, py: Python<'_>, payload: Py<PyAny>, samples: usize) -> PyResult<bool> {
        match self
            .engine
            .quick(py, |engine| engine.submit_samples(payload, samples))?
        {
            Ok(()) => Ok(true),
            Err(EngineError::NoActiveWorker) => Ok(false),
            Err(err) => Err(LoaderError::from(err).into()),
        }
    }

    /// The next output, waiting at most `timeout` seconds when it is
    /// positive; StopIteration when nothing of this epoch is pending. A
    /// worker's exception comes back as its value.
    fn next(&self, py: Python<'_>, timeout: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.engine.deliver(py, || {
            self.engine.wait_next(py, timeout, |engine, wait, new| {
                if new {
                    engine.recv(wait)
                } else {
                    engine.recv_again(wait)
                }
            })?
        })
    }

    /// Fixes the pool at `workers` workers from now on: the adaptive
    /// controller stops resizing it (surplus workers leave after their task).
    fn fix_workers(&self, py: Python<'_>, workers: usize) -> PyResult<()> {
        Ok(self
            .engine
            .quick(py, |engine| engine.fix_workers(workers))?)
    }

    /// Lets the adaptive controller resize the pool again after `fix_workers`.
    fn adapt_workers(&self, py: Python<'_>) -> PyResult<()> {
        Ok(self.engine.quick(py, |engine| engine.adapt_workers())?)
    }

    /// Ends the epoch: drops its queued work and waits for running tasks.
    fn new_epoch(&self, py: Python<'_>) -> PyResult<()> {
        self.engine.new_epoch(py)
    }

    /// Stops and joins the worker threads, waiting at most `grace` seconds
    /// for one still inside user code; returns how many were left running
    /// (each exits as soon as its current call returns).
    fn shutdown(&self, py: Python<'_>, grace: f64) -> usize {
        self.engine.shutdown(py, grace)
    }
}
