//! The sample engine's collate thread calling into Python, and the one case
//! left to the consumer: a cheap collate that draws no random numbers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::fork_gate::attach_for_thread_life;
use crate::engine::{thread_cpu_time, Collate};

/// Below this much CPU time per batch, collating on the collate thread
/// costs the loop more than it saves: the hand-over (the collate thread
/// taking the GIL, the consumer taking it back) costs the consumer about
/// what a default_collate of a batch of integers takes
/// (benchmarks/overhead.py --shuffle, benchmarks/RESULTS.md). An image
/// batch takes milliseconds.
const CHEAP_COLLATE: Duration = Duration::from_micros(150);
/// Every this many cheap batches, one is still collated on the collate
/// thread: the cost is measured afresh there, where it would run.
const REMEASURE_EVERY: u64 = 16;

type Samples = Vec<PyResult<Py<PyAny>>>;

/// What the collate thread hands the consumer.
pub(crate) enum PyBatch {
    /// Collated (and pinned): the batch, or the error of the first sample
    /// whose runner failed, or the collate stage's own result.
    Collated(PyResult<Py<PyAny>>),
    /// Cheap to collate: left for the consumer, who holds the GIL anyway.
    Deferred(Samples),
}

/// The collate stage's measured cost, shared by the collate thread and the
/// consumer.
#[derive(Clone, Default)]
pub(crate) struct CollateCost {
    /// Exponential mean of the nanoseconds a batch's collate took; 0 until
    /// one is measured.
    mean_nanos: Arc<AtomicU64>,
    batches: Arc<AtomicU64>,
}

impl CollateCost {
    fn record(&self, took: Duration) {
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
        let mean = self.mean_nanos.load(Ordering::Relaxed);
        let updated = if mean == 0 {
            took
        } else {
            (mean * 7 + took) / 8
        };
        self.mean_nanos.store(updated, Ordering::Relaxed);
    }

    /// Whether the next batch is left to the consumer. While its cost is
    /// unknown, only the first batch is, which the consumer waits
    /// for while the workers start (each taking the GIL): it then needs no
    /// hand-over. Every batch assembled before that one is collated would
    /// otherwise go to the consumer too, however costly: a prefetch of
    /// image batches collated on the training loop's thread, with its
    /// intra-op threads.
    fn defer_next(&self) -> bool {
        let mean = self.mean_nanos.load(Ordering::Relaxed);
        let batch = self.batches.fetch_add(1, Ordering::Relaxed);
        if mean == 0 {
            return batch == 0;
        }
        Duration::from_nanos(mean) < CHEAP_COLLATE && (batch + 1) % REMEASURE_EVERY != 0
    }
}

/// Calls `collate(tags, samples, error)` (the iterator's collate stage: the
/// user's `collate_fn`, then pinning) on the engine's collate thread, each
/// worker's `(tag, sample)` split here, and `error` the first sample that is
/// an `error_type` (a worker's error standing in for it), or None.
pub(crate) struct PythonCollate {
    pub collate: Py<PyAny>,
    /// torch's ExceptionWrapper, which a failed sample comes back as.
    pub error_type: Py<PyAny>,
    /// Whether a cheap batch may be left to the consumer: only for a
    /// collate that draws no random numbers and pins nothing (the
    /// thread's own generators and pinning stay off the loop's thread).
    pub deferrable: bool,
    /// Whether the worker thread completing a batch may collate it (see
    /// `Collate::any_thread`): a collate that draws no random numbers, so
    /// that the thread it runs on changes nothing it computes. The loader
    /// changes it as its workers move between threads and processes.
    pub any_thread: Arc<AtomicBool>,
    pub cost: CollateCost,
}

impl PythonCollate {
    /// Runs the collate stage on the calling thread, the GIL held.
    pub fn collate_now(
        collate: &Py<PyAny>,
        error_type: &Py<PyAny>,
        cost: &CollateCost,
        py: Python<'_>,
        samples: Samples,
    ) -> PyResult<Py<PyAny>> {
        let error_type = error_type.bind(py);
        let mut tags: Vec<Py<PyAny>> = Vec::with_capacity(samples.len());
        let mut values: Vec<Py<PyAny>> = Vec::with_capacity(samples.len());
        let mut error: Option<Py<PyAny>> = None;
        for sample in samples {
            let (tag, value): (Py<PyAny>, Py<PyAny>) = sample?.extract(py)?;
            if error.is_none() && value.bind(py).is_instance(error_type)? {
                error = Some(value.clone_ref(py));
            }
            tags.push(tag);
            values.push(value);
        }
        // The collate's own work, without the time it waited for the GIL
        // (which the worker threads hold often).
        let began = thread_cpu_time();
        let batch = collate.call1(
            py,
            (PyList::new(py, tags)?, PyList::new(py, values)?, error),
        );
        cost.record(thread_cpu_time().saturating_sub(began));
        batch
    }
}

impl Collate<PyResult<Py<PyAny>>> for PythonCollate {
    type Batch = PyBatch;

    /// Attached once for the thread's life, as a worker thread is: the GIL
    /// is held only in `collate`.
    fn enter_thread(&self, body: &mut (dyn FnMut() + Send)) {
        attach_for_thread_life(body);
    }

    fn any_thread(&self) -> bool {
        self.any_thread.load(Ordering::Relaxed)
    }

    fn collate(&self, samples: Samples) -> PyBatch {
        if self.deferrable && self.cost.defer_next() {
            return PyBatch::Deferred(samples);
        }
        PyBatch::Collated(Python::attach(|py| {
            super::gil_takes::took_gil();
            Self::collate_now(&self.collate, &self.error_type, &self.cost, py, samples)
        }))
    }
}
