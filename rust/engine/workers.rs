//! The worker side of an engine as one handle: the pool, its task queues and
//! its result queue, with epochs and shutdown. Both engines build on it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError};

use super::dispatch::{Dispatch, Dispatcher};
use super::error::EngineError;
use super::pool::{Pool, WorkerHooks};
use super::task::{Done, Task};

/// Sends tasks to worker threads and receives what they finished.
pub(crate) struct Workers<W: WorkerHooks> {
    pub pool: Arc<Pool<W>>,
    dispatcher: Dispatcher<W::Payload>,
    results: Receiver<Done<W::Output>>,
    /// Tasks sent whose result has not been received yet, any epoch.
    unreceived: usize,
    next_seq: u64,
    shutdown_grace: Duration,
    shut_down: bool,
}

impl<W: WorkerHooks> Workers<W> {
    /// Starts `workers` threads. `capacity` bounds the tasks in flight: the
    /// caller never sends more than that many tasks without receiving, and
    /// `end_epoch` drains the old epoch's results before new tasks go out,
    /// so no queue sized to it ever blocks a worker.
    pub fn start(
        hooks: W,
        dispatch: Dispatch,
        workers: usize,
        capacity: usize,
        shutdown_grace: Duration,
    ) -> Result<Self, EngineError> {
        let capacity = capacity.max(1);
        let (dispatcher, receivers) = Dispatcher::new(dispatch, workers.max(1), capacity);
        let (result_tx, results) = bounded(capacity);
        let pool = Pool::start(hooks, receivers, result_tx)?;
        Ok(Workers {
            pool,
            dispatcher,
            results,
            unreceived: 0,
            next_seq: 0,
            shutdown_grace,
            shut_down: false,
        })
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut_down
    }

    /// Worker threads running now.
    pub fn live(&self) -> usize {
        self.pool.live_workers()
    }

    pub fn epoch(&self) -> u64 {
        self.pool.shared.epoch.load(Ordering::Acquire)
    }

    /// The sequence number the next task will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Sends a task of `samples` samples; returns the worker it went to, if
    /// it went to one in particular.
    pub fn send(
        &mut self,
        payload: W::Payload,
        samples: usize,
    ) -> Result<Option<usize>, EngineError> {
        if self.shut_down {
            return Err(EngineError::ShutDown);
        }
        let task = Task {
            seq: self.next_seq,
            epoch: self.epoch(),
            samples,
            payload,
        };
        let worker = self.dispatcher.send(task)?;
        self.next_seq += 1;
        self.unreceived += 1;
        Ok(worker)
    }

    /// The next finished task, of any epoch, waiting at most `wait`.
    pub fn recv(&mut self, wait: Duration) -> Result<Done<W::Output>, EngineError> {
        let done = self.results.recv_timeout(wait).map_err(|err| match err {
            RecvTimeoutError::Timeout => EngineError::WaitElapsed,
            RecvTimeoutError::Disconnected => EngineError::WorkersGone,
        })?;
        self.unreceived -= 1;
        Ok(done)
    }

    /// Stops giving `worker` tasks until the next epoch (round-robin dispatch).
    pub fn deactivate(&mut self, worker: usize) {
        self.dispatcher.deactivate(worker);
    }

    /// Ends the current epoch: its queued tasks are skipped, tasks already
    /// running are waited for and their results dropped. Blocks until none
    /// is left, so the next epoch starts with the full in-flight budget.
    pub fn end_epoch(&mut self) -> Result<(), EngineError> {
        if self.shut_down {
            return Err(EngineError::ShutDown);
        }
        self.pool.shared.epoch.fetch_add(1, Ordering::AcqRel);
        while self.unreceived > 0 {
            self.results.recv().map_err(|_| EngineError::WorkersGone)?;
            self.unreceived -= 1;
        }
        self.dispatcher.reset();
        Ok(())
    }

    /// Stops and joins the workers, waiting at most `grace` for one still
    /// inside a task (see [`Pool::shutdown`]); idempotent. Returns how many
    /// threads were left to finish their task and exit on their own.
    pub fn shutdown(&mut self, grace: Duration) -> usize {
        if self.shut_down {
            return 0;
        }
        self.shut_down = true;
        self.dispatcher.close();
        self.pool.shutdown(grace)
    }

    /// [`Self::shutdown`] with the configured grace.
    pub fn shutdown_with_default_grace(&mut self) -> usize {
        self.shutdown(self.shutdown_grace)
    }
}

impl<W: WorkerHooks> Drop for Workers<W> {
    fn drop(&mut self) {
        self.shutdown_with_default_grace();
    }
}
