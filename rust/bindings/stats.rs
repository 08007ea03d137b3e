//! An engine's figures as the Python dict `minato.LoaderStats` is built from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::engine::{ControllerConfig, EngineStats, TaskClock};

/// Nanoseconds worker threads spent waiting to take the GIL, shared by an
/// engine's worker hooks and its Python handle.
#[derive(Clone, Default)]
pub(crate) struct GilWait(Arc<AtomicU64>);

impl GilWait {
    /// Runs `f` attached to the interpreter, counting the wait for the GIL,
    /// and reporting it to the task's `clock` as a pause: a worker waiting
    /// for the GIL is not slow, and no replacement thread would help it.
    pub fn attach<T>(&self, clock: &TaskClock, f: impl for<'py> FnOnce(Python<'py>) -> T) -> T {
        let pause = clock.pause();
        Python::attach(|py| {
            super::gil_takes::took_gil();
            let waited = u64::try_from(pause.end().as_nanos()).unwrap_or(u64::MAX);
            self.0.fetch_add(waited, Ordering::Relaxed);
            f(py)
        })
    }

    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

/// The adaptive controller's bounds, or None for a fixed pool.
pub(crate) fn adaptive(num_workers: usize, max_workers: Option<usize>) -> Option<ControllerConfig> {
    max_workers.map(|max| ControllerConfig::new(1, max.max(num_workers)))
}

fn seconds(duration: Option<Duration>) -> Option<f64> {
    duration.map(|d| d.as_secs_f64())
}

/// `stats` plus the GIL wait, as a dict of plain Python values.
pub(crate) fn to_dict<'py>(
    py: Python<'py>,
    stats: &EngineStats,
    gil_wait: &GilWait,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("workers", stats.workers)?;
    let history: Vec<(f64, usize)> = stats
        .worker_history
        .iter()
        .map(|&(at, count)| (at.as_secs_f64(), count))
        .collect();
    dict.set_item("worker_history", history)?;
    let resizes: Vec<_> = stats
        .resizes
        .iter()
        .map(|resize| {
            let window = &resize.window;
            (
                resize.at.as_secs_f64(),
                resize.workers,
                resize.reason.describe(),
                window.throughput,
                window.occupancy,
                window.compute,
                window.cpu,
                window.step,
            )
        })
        .collect();
    dict.set_item("resizes", resizes)?;
    dict.set_item("settled_workers", stats.settled_workers)?;
    dict.set_item("samples_loaded", stats.samples_loaded)?;
    dict.set_item("busy", stats.busy.as_secs_f64())?;
    dict.set_item("cpu", stats.cpu.as_secs_f64())?;
    dict.set_item("first_task_cpu", stats.first_task_cpu.as_secs_f64())?;
    dict.set_item("first_task_samples", stats.first_task_samples)?;
    dict.set_item("gil_wait", gil_wait.total().as_secs_f64())?;
    dict.set_item("queue_occupancy", stats.occupancy)?;
    dict.set_item("queue_asks", stats.asks)?;
    dict.set_item("loop_step", stats.loop_step.map(|step| step.as_secs_f64()))?;
    dict.set_item("slow_samples", stats.slow_samples)?;
    dict.set_item("moved_samples", stats.moved_samples)?;
    dict.set_item("moved_running", stats.moved_running)?;
    dict.set_item("moved_stalls", stats.moved_stalls)?;
    dict.set_item("longest_moved", seconds(stats.longest_moved))?;
    dict.set_item("sample_timeout", seconds(stats.sample_timeout))?;
    dict.set_item("fetch_p50", seconds(stats.fetch_p50))?;
    dict.set_item("fetch_p90", seconds(stats.fetch_p90))?;
    dict.set_item("fetch_p99", seconds(stats.fetch_p99))?;
    Ok(dict)
}
