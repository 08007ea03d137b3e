//! `minato._minato.SampleEngine`: the sample-level engine as the Python
//! iterator drives it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::detach;
use super::errors::LoaderError;
use super::locked::Locked;
use super::sample_collate::{CollateCost, PyBatch, PythonCollate};
use super::sample_ledger::PySampleLedger;
use super::stats::{self, GilWait};
use super::worker::{PythonSampleWorker, SampleTask};
use crate::engine::{SampleEngine, SampleEngineConfig, SampleTimeout};

type Engine = SampleEngine<SampleTask, PyResult<Py<PyAny>>, PythonSampleWorker, PythonCollate>;

/// Worker threads loading single samples (`make_worker(id)(epoch, indices)`),
/// delivering batches built from whichever samples are ready first, each
/// made by `collate(tags, samples, error)` on the engine's collate thread
/// (see `PythonCollate`) or, with `collate_anywhere`, on the worker thread
/// that completes it; or, where `collate_here` is given, a cheap batch by
/// `collate_here(tags, samples, error)` on the
/// consumer's thread (a function that leaves that thread's settings alone).
#[pyclass(name = "SampleEngine", module = "minato._minato", frozen)]
pub(crate) struct PySampleEngine {
    engine: Locked<Engine>,
    gil_wait: GilWait,
    /// The consumer's collate stage, for the batches left to it (none are
    /// without `collate_here`: then this is the collate thread's, unused).
    collate_here: Py<PyAny>,
    /// What a failed sample comes back as (torch's ExceptionWrapper).
    error_type: Py<PyAny>,
    collate_cost: CollateCost,
    /// Whether the workers collate the batches they complete (see
    /// `PythonCollate::any_thread`).
    collate_anywhere: Arc<AtomicBool>,
}

#[pymethods]
impl PySampleEngine {
    #[new]
    #[allow(clippy::too_many_arguments)] // one per keyword argument
    #[pyo3(signature = (make_worker, collate, *, collate_here, skipped_type, error_type, in_sequence, num_workers, max_samples_in_flight, max_batch_size, sample_timeout, timeout_warmup, max_slow_in_flight, shutdown_grace, max_workers=None, drop_last=false, collate_anywhere=false))]
    fn new(
        py: Python<'_>,
        make_worker: Py<PyAny>,
        collate: Py<PyAny>,
        collate_here: Option<Py<PyAny>>,
        skipped_type: Py<PyAny>,
        error_type: Py<PyAny>,
        in_sequence: bool,
        num_workers: usize,
        max_samples_in_flight: usize,
        max_batch_size: usize,
        sample_timeout: Option<&Bound<'_, PyAny>>,
        timeout_warmup: u64,
        max_slow_in_flight: usize,
        shutdown_grace: f64,
        max_workers: Option<usize>,
        drop_last: bool,
        collate_anywhere: bool,
    ) -> PyResult<Self> {
        let sample_timeout = match sample_timeout {
            None => SampleTimeout::Off,
            Some(value) if value.extract::<&str>().is_ok_and(|text| text == "auto") => {
                SampleTimeout::Auto {
                    warmup: timeout_warmup,
                }
            }
            Some(value) => {
                SampleTimeout::Fixed(Duration::try_from_secs_f64(value.extract()?).map_err(
                    |err| pyo3::exceptions::PyValueError::new_err(format!("sample_timeout: {err}")),
                )?)
            }
        };
        let config = SampleEngineConfig {
            num_workers,
            max_samples_in_flight,
            max_batch_size,
            sample_timeout,
            max_slow_in_flight,
            shutdown_grace: Duration::from_secs_f64(shutdown_grace.max(0.0)),
            adaptive: stats::adaptive(num_workers, max_workers),
            drop_last,
            in_sequence,
        };
        let gil_wait = GilWait::default();
        let hooks = PythonSampleWorker {
            make_worker,
            skipped_type,
            gil_wait: gil_wait.clone(),
        };
        let collate_cost = CollateCost::default();
        let deferrable = collate_here.is_some();
        let collate_here = collate_here.unwrap_or_else(|| collate.clone_ref(py));
        let collate_anywhere = Arc::new(AtomicBool::new(collate_anywhere));
        let stage = PythonCollate {
            collate,
            error_type: error_type.clone_ref(py),
            deferrable,
            any_thread: collate_anywhere.clone(),
            cost: collate_cost.clone(),
        };
        let engine = detach(py, || Engine::start_collating(config, hooks, stage))
            .map_err(LoaderError::from)?;
        Ok(PySampleEngine {
            engine: Locked::new(engine),
            gil_wait,
            collate_here,
            error_type,
            collate_cost,
            collate_anywhere,
        })
    }

    /// Whether the worker thread completing a batch collates it from now
    /// on, or the engine's collate thread does (batches already taken are
    /// collated where they were going to be).
    fn set_collate_anywhere(&self, anywhere: bool) {
        self.collate_anywhere.store(anywhere, Ordering::Relaxed);
    }

    /// Worker threads running now, replacements for slow samples included.
    #[getter]
    fn num_workers(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.engine.quick(py, |engine| engine.num_workers())?)
    }

    /// The slow-sample timeout in seconds now; None while warming up or off.
    #[getter]
    fn sample_timeout(&self, py: Python<'_>) -> PyResult<Option<f64>> {
        let timeout = self.engine.quick(py, |engine| engine.sample_timeout())?;
        Ok(timeout.map(|t| t.as_secs_f64()))
    }

    /// Samples flagged slow so far.
    #[getter]
    fn slow_samples(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.engine.quick(py, |engine| engine.slow_samples())?)
    }

    /// The engine's figures, as a dict (see `minato.LoaderStats`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let snapshot = self.engine.quick(py, |engine| engine.stats())?;
        stats::to_dict(py, &snapshot, &self.gil_wait)
    }

    /// Whether `submit` accepts a batch now (the in-flight bound).
    fn can_submit(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.engine.quick(py, |engine| engine.can_submit())?)
    }

    /// Batches of this epoch submitted and not yet delivered.
    fn pending(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.engine.quick(py, |engine| engine.pending())?)
    }

    /// Queues one batch: `from_queue` units queued in `ledger`, then the
    /// `fresh` indices, each handed out by the ledger at its position and
    /// run as the task `(position, index, seed)` (the epoch's `seed` is the
    /// same for all; the worker thread builds the tuple); always True (the
    /// signature of `Engine.submit`).
    #[pyo3(signature = (ledger, fresh, seed, from_queue=0))]
    fn submit(
        &self,
        py: Python<'_>,
        ledger: &Bound<'_, PySampleLedger>,
        fresh: &Bound<'_, PyAny>,
        seed: &Bound<'_, PyAny>,
        from_queue: usize,
    ) -> PyResult<bool> {
        let seed = Arc::new(seed.clone().unbind());
        let tasks: Vec<SampleTask> = ledger
            .get()
            .hand_out(py, from_queue, fresh)?
            .into_iter()
            .map(|(position, index)| SampleTask {
                position,
                index,
                seed: Arc::clone(&seed),
            })
            .collect();
        self.engine
            .quick(py, |engine| engine.submit(tasks))?
            .map_err(LoaderError::from)?;
        Ok(true)
    }

    /// Takes back the last batches submitted that no worker has started,
    /// as `[(positions, indices), ...]` in the order submitted; the engine
    /// delivers only the batches before them (see
    /// `SampleEngine::withdraw_unstarted`).
    fn withdraw_unstarted<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let batches = self
            .engine
            .quick(py, |engine| engine.withdraw_unstarted())?
            .map_err(LoaderError::from)?;
        let out = PyList::empty(py);
        for batch in batches {
            let positions = PyList::empty(py);
            let indices = PyList::empty(py);
            for task in batch {
                positions.append(task.position)?;
                indices.append(task.index)?;
            }
            out.append((positions, indices))?;
        }
        Ok(out)
    }

    /// The next batch, as `collate` made it, waiting at most `timeout`
    /// seconds when it is positive; StopIteration when nothing is pending.
    fn next(&self, py: Python<'_>, timeout: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.engine.deliver(py, || {
            let batch = self.engine.wait_next(py, timeout, |engine, wait, new| {
                if new {
                    engine.recv(wait)
                } else {
                    engine.recv_again(wait)
                }
            })?;
            match batch {
                PyBatch::Collated(batch) => batch,
                PyBatch::Deferred(samples) => PythonCollate::collate_now(
                    &self.collate_here,
                    &self.error_type,
                    &self.collate_cost,
                    py,
                    samples,
                ),
            }
        })
    }

    /// The epoch's last batch is submitted: samples skipped this epoch are
    /// taken off its last batches.
    fn close_epoch(&self, py: Python<'_>) -> PyResult<()> {
        Ok(self.engine.quick(py, |engine| engine.close_epoch())?)
    }

    /// The records of the samples skipped since the last call (this epoch's).
    fn take_skipped<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let skipped = self.engine.quick(py, |engine| engine.take_skipped())?;
        let skipped: Vec<Py<PyAny>> = skipped.into_iter().collect::<PyResult<_>>()?;
        PyList::new(py, skipped)
    }

    /// For workers whose tasks and replacements cost more (worker
    /// processes): cheap samples go to workers in runs of at least
    /// `run_target` seconds, and the automatic per-sample timeout is at
    /// least `min_timeout` seconds.
    fn set_task_costs(&self, py: Python<'_>, run_target: f64, min_timeout: f64) -> PyResult<()> {
        let seconds = |value: f64, what: &str| {
            Duration::try_from_secs_f64(value)
                .map_err(|err| pyo3::exceptions::PyValueError::new_err(format!("{what}: {err}")))
        };
        let run_target = seconds(run_target, "run_target")?;
        let min_timeout = seconds(min_timeout, "min_timeout")?;
        Ok(self.engine.quick(py, |engine| {
            engine.set_run_target(run_target);
            engine.set_min_auto_timeout(min_timeout);
        })?)
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

    /// Stops the workers; see `Engine.shutdown`.
    fn shutdown(&self, py: Python<'_>, grace: f64) -> usize {
        self.engine.shutdown(py, grace)
    }
}
