//! An engine behind a lock, with the GIL handling every binding needs.

use std::mem::ManuallyDrop;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use super::detach;
use super::errors::LoaderError;
use crate::engine::{EngineError, Lifecycle};
use crate::process::Process;

/// How long the consumer waits with the GIL released before it looks for
/// signals: Ctrl-C leaves a waiting loop within this time. Each look takes
/// the GIL from the workers, so it is rare: twice a second.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// An engine shared by the Python threads that hold its handle.
///
/// In a fork child the engine is refused (`LoaderError::Forked`) before its
/// lock is touched, and never dropped: its worker threads are not in the
/// child, and a lock one of the parent's threads held at the fork stays held
/// there for good, so locking, joining or closing its channels could hang.
pub(crate) struct Locked<E: Lifecycle + Send> {
    inner: ManuallyDrop<Mutex<E>>,
    /// The process whose threads run the engine.
    process: Process,
    /// An output received as a signal (Ctrl-C) was raised: the next call
    /// delivers it, so that a loop that catches the KeyboardInterrupt and
    /// goes on loses nothing.
    held: Mutex<Option<Py<PyAny>>>,
}

impl<E: Lifecycle + Send> Locked<E> {
    /// Wraps an engine started by this process.
    pub fn new(engine: E) -> Self {
        Locked {
            inner: ManuallyDrop::new(Mutex::new(engine)),
            process: Process::current(),
            held: Mutex::new(None),
        }
    }

    /// The error for every use in a fork child (see the type's docs).
    fn check_process(&self) -> Result<(), LoaderError> {
        if self.process.is_current() {
            Ok(())
        } else {
            Err(LoaderError::Forked {
                pid: self.process.pid(),
            })
        }
    }

    /// The engine, locked. Callers lock inside `detach`, so a thread
    /// waiting for the lock never holds the GIL that the holder may need.
    /// Only after [`Self::check_process`].
    fn lock(&self) -> MutexGuard<'_, E> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Ends the epoch with the GIL released: running tasks need it to finish.
    pub fn new_epoch(&self, py: Python<'_>) -> PyResult<()> {
        self.check_process()?;
        self.take_held();
        detach(py, || self.lock().new_epoch()).map_err(|err| LoaderError::from(err).into())
    }

    /// Stops the workers with the GIL released (see [`Lifecycle::shutdown`]).
    /// In a fork child there are none to stop: nothing is done.
    pub fn shutdown(&self, py: Python<'_>, grace: f64) -> usize {
        if self.check_process().is_err() {
            return 0;
        }
        let grace = Duration::from_secs_f64(grace.max(0.0));
        detach(py, || self.lock().shutdown(grace))
    }

    fn take_held(&self) -> Option<Py<PyAny>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }

    /// The output held back by a signal, else `receive`'s. A signal that
    /// arrived while `receive` waited is raised here, its output held back:
    /// raised later, in the caller's Python, it would lose the output.
    pub fn deliver(
        &self,
        py: Python<'_>,
        receive: impl FnOnce() -> PyResult<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        if let Some(output) = self.take_held() {
            return Ok(output);
        }
        let output = receive()?;
        if let Err(signal) = py.check_signals() {
            *self
                .held
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(output);
            return Err(signal);
        }
        Ok(output)
    }

    /// Runs a short, non-blocking `op` on the engine. When the lock is free
    /// it runs with the GIL held: releasing the GIL would let a worker take
    /// it, and the consumer would then wait for that worker's whole task.
    pub fn quick<T: Send>(
        &self,
        py: Python<'_>,
        op: impl FnOnce(&mut E) -> T + Send,
    ) -> Result<T, LoaderError> {
        self.check_process()?;
        Ok(match self.inner.try_lock() {
            Ok(mut engine) => op(&mut engine),
            Err(TryLockError::Poisoned(poisoned)) => op(&mut poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => detach(py, || op(&mut self.lock())),
        })
    }

    /// Waits for `recv`'s next output with the GIL released, at most
    /// `timeout` seconds when it is positive (then torch's timeout error),
    /// looking for signals meanwhile. An output already waiting (or about
    /// to arrive: `recv` with no wait spins briefly, never yielding the
    /// core, see rust/engine/look.rs) is taken without giving up the GIL.
    /// `recv`'s flag says whether the call is the consumer's new request
    /// (the first) or the same one again.
    pub fn wait_next<T: Send>(
        &self,
        py: Python<'_>,
        timeout: &Bound<'_, PyAny>,
        recv: impl Fn(&mut E, Duration, bool) -> Result<T, EngineError> + Sync,
    ) -> PyResult<T> {
        let seconds: f64 = timeout.extract()?;
        match self.quick(py, |engine| recv(engine, Duration::ZERO, true))? {
            Err(EngineError::WaitElapsed) => {}
            ready => return ready.map_err(|err| LoaderError::from(err).into()),
        }
        let deadline = (seconds > 0.0).then(|| Instant::now() + Duration::from_secs_f64(seconds));
        loop {
            let wait = deadline.map_or(SIGNAL_CHECK_INTERVAL, |deadline| {
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(SIGNAL_CHECK_INTERVAL)
            });
            match detach(py, || recv(&mut self.lock(), wait, false)) {
                Err(EngineError::WaitElapsed) => {
                    if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                        let timeout = timeout.str()?.to_string();
                        return Err(LoaderError::TimedOut { timeout }.into());
                    }
                    py.check_signals()?;
                }
                ready => return ready.map_err(|err| LoaderError::from(err).into()),
            }
        }
    }
}

impl<E: Lifecycle + Send> Drop for Locked<E> {
    fn drop(&mut self) {
        if !self.process.is_current() {
            // A fork child's copy: leaked (see the type's docs).
            return;
        }
        // Workers need the GIL to finish their current task: join them with
        // it released, or the join would wait forever.
        let engine = self
            .inner
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Python::attach(|py| detach(py, || engine.shutdown_with_default_grace()));
        // SAFETY: `inner` is dropped once, here, and never used after.
        unsafe { ManuallyDrop::drop(&mut self.inner) };
    }
}
