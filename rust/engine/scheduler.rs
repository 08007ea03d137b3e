//! The engine: worker pool, task queues and delivery order behind one handle.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError};

use super::dispatch::{Dispatch, Dispatcher};
use super::error::EngineError;
use super::pool::{Pool, WorkerHooks};
use super::sequencer::{Order, Sequencer};
use super::task::{Done, Finished, Outcome, Task};

/// How an engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub num_workers: usize,
    /// Most tasks submitted and not yet delivered (queued, running, or
    /// finished and waiting for their turn). This is what bounds memory:
    /// every queue is sized to it.
    pub max_in_flight: usize,
    pub order: Order,
    pub dispatch: Dispatch,
    /// How long dropping the engine waits for a worker still inside a task.
    pub shutdown_grace: Duration,
}

/// Runs tasks on worker threads and hands their outputs back in order.
///
/// One consumer drives it (`&mut self`); the workers never touch this struct.
pub struct Engine<W: WorkerHooks> {
    pool: Arc<Pool<W>>,
    dispatcher: Dispatcher<W::Payload>,
    results: Receiver<Done<W::Output>>,
    sequencer: Sequencer<W::Output>,
    max_in_flight: usize,
    /// Submitted and whose result has not been received yet, any epoch.
    unreceived: usize,
    next_seq: u64,
    shutdown_grace: Duration,
    shut_down: bool,
}

impl<W: WorkerHooks> Engine<W> {
    /// Starts `config.num_workers` threads running `hooks`.
    pub fn start(config: EngineConfig, hooks: W) -> Result<Self, EngineError> {
        let workers = config.num_workers.max(1);
        let max_in_flight = config.max_in_flight.max(1);
        let (dispatcher, receivers) = Dispatcher::new(config.dispatch, workers, max_in_flight);
        // Every task sends exactly one result, at most `max_in_flight` tasks
        // are undelivered, and `new_epoch` drains the old epoch's results
        // before new tasks go out: workers never block on this queue.
        let (result_tx, results) = bounded(max_in_flight);
        let pool = Pool::start(hooks, receivers, result_tx)?;
        Ok(Engine {
            pool,
            dispatcher,
            results,
            sequencer: Sequencer::new(config.order),
            max_in_flight,
            unreceived: 0,
            next_seq: 0,
            shutdown_grace: config.shutdown_grace,
            shut_down: false,
        })
    }

    /// Worker threads running now.
    pub fn num_workers(&self) -> usize {
        self.pool.live_workers()
    }

    pub fn epoch(&self) -> u64 {
        self.pool.shared.epoch.load(Ordering::Acquire)
    }

    /// Whether `submit` would accept a task now.
    pub fn can_submit(&self) -> bool {
        !self.shut_down && self.pending() < self.max_in_flight
    }

    /// Tasks of the current epoch that may still deliver an output.
    pub fn pending(&self) -> usize {
        self.sequencer.pending()
    }

    /// Queues a task for the workers.
    pub fn submit(&mut self, payload: W::Payload) -> Result<(), EngineError> {
        if self.shut_down {
            return Err(EngineError::ShutDown);
        }
        if self.pending() >= self.max_in_flight {
            return Err(EngineError::Full);
        }
        let task = Task {
            seq: self.next_seq,
            epoch: self.epoch(),
            samples: 1,
            payload,
        };
        self.dispatcher.send(task)?;
        self.next_seq += 1;
        self.unreceived += 1;
        self.sequencer.submitted();
        Ok(())
    }

    /// The next output in delivery order, waiting at most `wait` for it.
    pub fn recv(&mut self, wait: Duration) -> Result<W::Output, EngineError> {
        if self.shut_down {
            return Err(EngineError::ShutDown);
        }
        loop {
            if let Some(item) = self.sequencer.pop() {
                return item;
            }
            if self.sequencer.pending() == 0 {
                return Err(EngineError::Idle);
            }
            let done = match self.results.recv_timeout(wait) {
                Ok(done) => done,
                Err(RecvTimeoutError::Timeout) => return Err(EngineError::WaitElapsed),
                Err(RecvTimeoutError::Disconnected) => return Err(EngineError::WorkersGone),
            };
            self.accept(done);
        }
    }

    fn accept(&mut self, done: Done<W::Output>) {
        self.unreceived -= 1;
        if done.epoch != self.epoch() {
            return;
        }
        let item = match done.finished {
            Finished::Ran(Outcome::Value(value)) => Some(Ok(value)),
            Finished::Ran(Outcome::Exhausted) => {
                self.dispatcher.deactivate(done.worker);
                None
            }
            // Only tasks of an ended epoch are cancelled; handled above.
            Finished::Cancelled => None,
            Finished::Panicked(message) => Some(Err(EngineError::WorkerPanicked {
                worker: done.worker,
                message,
            })),
        };
        self.sequencer.finished(done.seq, item);
    }

    /// Ends the current epoch: its queued tasks are skipped, tasks already
    /// running are waited for and their outputs dropped. Blocks until no task
    /// is outstanding, so the next epoch starts with the full in-flight budget.
    pub fn new_epoch(&mut self) -> Result<(), EngineError> {
        if self.shut_down {
            return Err(EngineError::ShutDown);
        }
        self.pool.shared.epoch.fetch_add(1, Ordering::AcqRel);
        while self.unreceived > 0 {
            match self.results.recv() {
                Ok(_) => self.unreceived -= 1,
                Err(_) => return Err(EngineError::WorkersGone),
            }
        }
        self.dispatcher.reset();
        self.sequencer.reset(self.next_seq);
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

    /// [`Self::shutdown`] with the configured `shutdown_grace`.
    pub fn shutdown_with_default_grace(&mut self) -> usize {
        self.shutdown(self.shutdown_grace)
    }
}

impl<W: WorkerHooks> Drop for Engine<W> {
    fn drop(&mut self) {
        self.shutdown_with_default_grace();
    }
}
