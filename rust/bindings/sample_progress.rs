//! A worker thread's sample runner reports each sample of its run as it
//! begins (`minato._task.failures.load_each` calls `_sample_begins`), so
//! that the engine judges the run by the sample it is on (see
//! `crate::engine::TaskClock::begin_sample`). The task's clock is the
//! calling thread's own: Python passes nothing, and a call on a thread that
//! runs no sample task (the consumer's, a batch-level worker's, a worker
//! process's) does nothing.

use std::cell::RefCell;

use pyo3::prelude::*;

use crate::engine::TaskClock;

thread_local! {
    /// The clock of the sample task this thread is running, if any.
    static RUNNING: RefCell<Option<TaskClock>> = const { RefCell::new(None) };
}

/// Runs `run` (the call into the sample runner) with `clock` as the
/// calling thread's running task's clock.
pub(crate) fn reporting_to<R>(clock: &TaskClock, run: impl FnOnce() -> R) -> R {
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            RUNNING.with(|running| running.borrow_mut().take());
        }
    }
    RUNNING.with(|running| *running.borrow_mut() = Some(clock.clone()));
    let _clear = Clear;
    run()
}

/// The calling thread's sample task begins its next sample.
#[pyfunction]
fn _sample_begins() {
    RUNNING.with(|running| {
        if let Some(clock) = running.borrow().as_ref() {
            clock.begin_sample();
        }
    });
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_sample_begins, m)?)
}
