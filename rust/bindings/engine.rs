//! `minato._minato.Engine`: the engine as the Python iterator drives it.

use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use super::errors::LoaderError;
use super::worker::PythonWorker;
use crate::engine::{Dispatch, Engine, EngineConfig, EngineError, Order};

/// How long the consumer waits with the GIL released before it looks for
/// signals: Ctrl-C leaves a waiting loop within this time.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// Worker threads running `make_worker(id)(epoch, payload)` for each submitted payload.
#[pyclass(name = "Engine", module = "minato._minato", frozen)]
pub(crate) struct PyEngine {
    inner: Mutex<Engine<PythonWorker>>,
}

impl PyEngine {
    /// The engine, locked. Callers lock inside `py.detach`, so a thread
    /// waiting for the lock never holds the GIL that the holder may need.
    fn engine(&self) -> MutexGuard<'_, Engine<PythonWorker>> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs a short, non-blocking `op` on the engine. When the lock is free
    /// it runs with the GIL held: releasing the GIL would let a worker take
    /// it, and the consumer would then wait for that worker's whole task.
    fn quick<T: Send>(
        &self,
        py: Python<'_>,
        op: impl FnOnce(&mut Engine<PythonWorker>) -> T + Send,
    ) -> T {
        match self.inner.try_lock() {
            Ok(mut engine) => op(&mut engine),
            Err(TryLockError::Poisoned(poisoned)) => op(&mut poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => py.detach(|| op(&mut self.engine())),
        }
    }
}

#[pymethods]
impl PyEngine {
    #[new]
    #[allow(clippy::too_many_arguments)] // one per keyword argument
    #[pyo3(signature = (make_worker, exhausted, *, num_workers, max_in_flight, in_order, round_robin, shutdown_grace))]
    fn new(
        py: Python<'_>,
        make_worker: Py<PyAny>,
        exhausted: Py<PyAny>,
        num_workers: usize,
        max_in_flight: usize,
        in_order: bool,
        round_robin: bool,
        shutdown_grace: f64,
    ) -> PyResult<Self> {
        let config = EngineConfig {
            num_workers,
            max_in_flight,
            order: if in_order {
                Order::Submission
            } else {
                Order::Completion
            },
            dispatch: if round_robin {
                Dispatch::RoundRobin
            } else {
                Dispatch::Shared
            },
            shutdown_grace: Duration::from_secs_f64(shutdown_grace.max(0.0)),
        };
        let hooks = PythonWorker {
            make_worker,
            exhausted,
        };
        let engine = py
            .detach(|| Engine::start(config, hooks))
            .map_err(LoaderError::from)?;
        Ok(PyEngine {
            inner: Mutex::new(engine),
        })
    }

    #[getter]
    fn num_workers(&self, py: Python<'_>) -> usize {
        self.quick(py, |engine| engine.num_workers())
    }

    /// Whether `submit` accepts a payload now (the in-flight bound).
    fn can_submit(&self, py: Python<'_>) -> bool {
        self.quick(py, |engine| engine.can_submit())
    }

    /// Submitted payloads of this epoch not yet delivered.
    fn pending(&self, py: Python<'_>) -> usize {
        self.quick(py, |engine| engine.pending())
    }

    /// Queues a payload; False when every worker is exhausted for this epoch.
    fn submit(&self, py: Python<'_>, payload: Py<PyAny>) -> PyResult<bool> {
        match self.quick(py, |engine| engine.submit(payload)) {
            Ok(()) => Ok(true),
            Err(EngineError::NoActiveWorker) => Ok(false),
            Err(err) => Err(LoaderError::from(err).into()),
        }
    }

    /// The next output. Waits with the GIL released, at most `timeout`
    /// seconds when it is positive; raises StopIteration when nothing of
    /// this epoch is pending. A worker's exception comes back as its value.
    #[pyo3(signature = (timeout))]
    fn next(&self, py: Python<'_>, timeout: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let seconds: f64 = timeout.extract()?;
        // An output already waiting is taken without giving up the GIL.
        match self.quick(py, |engine| engine.recv(Duration::ZERO)) {
            Ok(output) => return output,
            Err(EngineError::WaitElapsed) => {}
            Err(err) => return Err(LoaderError::from(err).into()),
        }
        let deadline = (seconds > 0.0).then(|| Instant::now() + Duration::from_secs_f64(seconds));
        loop {
            let wait = deadline.map_or(SIGNAL_CHECK_INTERVAL, |deadline| {
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(SIGNAL_CHECK_INTERVAL)
            });
            match py.detach(|| self.engine().recv(wait)) {
                Ok(output) => return output,
                Err(EngineError::WaitElapsed) => {
                    if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                        let timeout = timeout.str()?.to_string();
                        return Err(LoaderError::TimedOut { timeout }.into());
                    }
                    py.check_signals()?;
                }
                Err(err) => return Err(LoaderError::from(err).into()),
            }
        }
    }

    /// Ends the epoch: drops its queued work and waits for running tasks.
    fn new_epoch(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.engine().new_epoch())
            .map_err(|err| LoaderError::from(err).into())
    }

    /// Stops and joins the worker threads, waiting at most `grace` seconds
    /// for one still inside user code; returns how many were left running
    /// (each exits as soon as its current call returns).
    fn shutdown(&self, py: Python<'_>, grace: f64) -> usize {
        let grace = Duration::from_secs_f64(grace.max(0.0));
        py.detach(|| self.engine().shutdown(grace))
    }
}

impl Drop for PyEngine {
    fn drop(&mut self) {
        // Workers need the GIL to finish their current task: join them with
        // it released, or the join would wait forever.
        let engine = self
            .inner
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Python::attach(|py| py.detach(|| engine.shutdown_with_default_grace()));
    }
}
