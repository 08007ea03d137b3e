//! minato's threads attach to the interpreter apart from any fork (see
//! `crate::fork_gate`): the hook Python's `os.register_at_fork` calls before
//! one, and the attach it guards (the fork's ends are `pthread_atfork`
//! handlers).

use std::time::Duration;

use pyo3::prelude::*;

use crate::fork_gate;
use crate::thread_exit::hang_on_thread_exit;

/// Longest a fork waits for minato's threads to finish attaching: each
/// waits only for the GIL, which the fork gives up meanwhile.
const FORK_WAIT: Duration = Duration::from_secs(1);

/// Runs a thread's whole life attached to the interpreter, its thread state
/// created apart from any fork.
///
/// Attaching once keeps one interpreter thread state: thread-locals (a
/// worker's WorkerInfo) persist between tasks, and each task's attach only
/// re-takes the GIL. The GIL itself is released at once and held only around
/// calls into Python.
///
/// A thread that wants the GIL once the interpreter finalizes (still in the
/// dataset's code at exit, or leaving after it) blocks for good instead of
/// being unwound by CPython's `pthread_exit`, which would abort the process
/// (see `crate::thread_exit`).
pub(crate) fn attach_for_thread_life(body: &mut (dyn FnMut() + Send)) {
    hang_on_thread_exit(|| {
        let attaching = fork_gate::enter();
        Python::attach(|py| {
            drop(attaching);
            py.detach(body)
        })
    });
}

/// Before a fork: waits, with the GIL released, for minato's threads to
/// finish attaching, and holds new ones back until the fork is done.
/// Python's before-fork callbacks run in the parent only.
#[pyfunction]
fn _before_fork(py: Python<'_>) {
    py.detach(|| fork_gate::before_fork(FORK_WAIT));
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_before_fork, m)?)
}
