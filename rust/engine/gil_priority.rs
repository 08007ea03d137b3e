//! The interpreter's lock (the GIL) goes to the threads that serve the training loop (the loop's
//! own thread back from waiting for a batch, the collate thread) before a
//! worker thread's next task.
//!
//! CPython gives a released GIL to whichever thread takes it first. A
//! worker that ends one task and enters the next retakes it at once, so a
//! thread waiting for it is woken for nothing at each task's end (a futex
//! wake: about 10 µs of the worker's CPU on a VM) and loses the race
//! again; and since the GIL keeps changing hands, CPython's switch interval
//! never hands it over. Workers hold back only at their own entry into
//! Python, between tasks, where a torch worker process would not compete
//! with the training process at all; what a task does inside Python is
//! CPython's to schedule. Plain atomics: the bindings mark who wants the
//! GIL and call the workers' side before each task.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Threads that want the GIL ahead of the workers' next tasks.
static WANTED: AtomicUsize = AtomicUsize::new(0);
static GATE: Mutex<()> = Mutex::new(());
static OPEN: Condvar = Condvar::new();

/// The longest a worker holds back. A thread that wants the GIL gets it as
/// the task running in Python ends; this only bounds the wait on one that
/// is slow to be scheduled.
const MOST_HELD_BACK: Duration = Duration::from_millis(2);

/// Held by a thread from just before it asks for the GIL until it has it.
#[must_use]
pub struct GilWanted(());

/// Marks the calling thread as wanting the GIL next; drop the result once
/// it holds it.
pub fn want_gil() -> GilWanted {
    WANTED.fetch_add(1, Ordering::SeqCst);
    GilWanted(())
}

impl Drop for GilWanted {
    fn drop(&mut self) {
        if WANTED.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Taken so that a worker between its look and its wait is not
            // missed.
            let _gate = GATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            OPEN.notify_all();
        }
    }
}

/// Called by a worker before it enters Python for a task: waits while a
/// thread serving the training loop wants the GIL (at most
/// `MOST_HELD_BACK`). One atomic load when none does.
pub fn let_gil_wanters_go_first() {
    hold_back(MOST_HELD_BACK);
}

fn hold_back(most: Duration) {
    if WANTED.load(Ordering::SeqCst) == 0 {
        return;
    }
    let deadline = Instant::now() + most;
    let mut gate = GATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    while WANTED.load(Ordering::SeqCst) > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        gate = OPEN
            .wait_timeout(gate, left)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::thread;

    // One test: the state is process-wide.
    #[test]
    fn a_worker_holds_back_while_the_gil_is_wanted_within_its_bound() {
        hold_back(Duration::from_secs(3600)); // nobody wants it: returns

        // Wanted and never given up: the bound lets the worker go.
        let wanted = want_gil();
        let started = Instant::now();
        let_gil_wanters_go_first();
        assert!(started.elapsed() >= MOST_HELD_BACK);

        // Given up: a worker waiting on a bound far past the test's
        // timeout goes as the thread that wanted it has it.
        let (entering, entered) = channel();
        let worker = thread::spawn(move || {
            entering.send(()).unwrap();
            hold_back(Duration::from_secs(3600));
        });
        entered.recv().unwrap();
        drop(wanted);
        worker.join().unwrap();
        assert_eq!(WANTED.load(Ordering::SeqCst), 0);
    }
}
