//! The task-level engine: each task's output is delivered as it is, in
//! submission or completion order.

use std::time::Duration;

use super::controller::ControllerConfig;
use super::dispatch::Dispatch;
use super::error::EngineError;
use super::fetch_times::FetchTimes;
use super::lifecycle::Lifecycle;
use super::monitor::MonitorConfig;
use super::pool::WorkerHooks;
use super::sequencer::{Order, Sequencer};
use super::stats::{Ask, EngineStats};
use super::task::{Done, Finished, Outcome};
use super::workers::{ResultsTo, Workers};

/// How an engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub num_workers: usize,
    /// Most tasks submitted and not yet delivered (queued, running, or
    /// finished and waiting for their turn) with `num_workers` workers; it
    /// scales with the pool when it grows. This is what bounds memory:
    /// every queue is sized to its largest value.
    pub max_in_flight: usize,
    pub order: Order,
    pub dispatch: Dispatch,
    /// Resize the pool while running (shared dispatch only).
    pub adaptive: Option<ControllerConfig>,
    /// How long dropping the engine waits for a worker still inside a task.
    pub shutdown_grace: Duration,
}

/// Per-sample fetch times kept for the percentiles.
pub(crate) const FETCH_WINDOW: usize = 1024;

/// Runs tasks on worker threads and hands their outputs back in order.
///
/// One consumer drives it (`&mut self`); the workers never touch this struct.
pub struct Engine<W: WorkerHooks> {
    workers: Workers<W>,
    sequencer: Sequencer<W::Output>,
    max_in_flight: usize,
    /// The bound for the pool's size, read when the consumer receives: the
    /// monitor may resize the pool at any time, and `can_submit` followed
    /// by `submit` must agree.
    bound: usize,
    fetch_times: FetchTimes,
}

impl<W: WorkerHooks> Engine<W> {
    /// Starts `config.num_workers` threads running `hooks`.
    pub fn start(config: EngineConfig, hooks: W) -> Result<Self, EngineError> {
        let max_in_flight = config.max_in_flight.max(1);
        let workers = Workers::start(
            hooks,
            config.dispatch,
            config.num_workers,
            max_in_flight,
            MonitorConfig {
                slow_samples: None,
                adaptive: config.adaptive,
            },
            config.shutdown_grace,
            ResultsTo::Queue,
        )?;
        Ok(Engine {
            workers,
            sequencer: Sequencer::new(config.order),
            max_in_flight,
            bound: max_in_flight,
            fetch_times: FetchTimes::new(FETCH_WINDOW),
        })
    }

    /// Fixes the pool at `workers` for the rest of its life: the adaptive
    /// controller no longer resizes it.
    pub fn fix_workers(&self, workers: usize) {
        self.workers.fix_workers(workers);
    }

    /// Lets the adaptive controller resize the pool again after `fix_workers`.
    pub fn adapt_workers(&self) {
        self.workers.adapt_workers();
    }

    /// Worker threads running now.
    pub fn num_workers(&self) -> usize {
        self.workers.live()
    }

    /// Whether `submit` would accept a task now.
    pub fn can_submit(&self) -> bool {
        self.workers.can_send() && self.pending() < self.bound
    }

    #[cfg(test)]
    pub(crate) fn workers_for_tests(&self) -> &Workers<W> {
        &self.workers
    }

    /// The engine's figures now.
    pub fn stats(&self) -> EngineStats {
        self.workers.stats().with_fetch_times(&self.fetch_times)
    }

    /// Tasks of the current epoch that may still deliver an output.
    pub fn pending(&self) -> usize {
        self.sequencer.pending()
    }

    /// Queues a task of one sample.
    pub fn submit(&mut self, payload: W::Payload) -> Result<(), EngineError> {
        self.submit_samples(payload, 1)
    }

    /// Queues a task of `samples` samples: its fetch time is shared among
    /// them, and they count towards the throughput.
    pub fn submit_samples(
        &mut self,
        payload: W::Payload,
        samples: usize,
    ) -> Result<(), EngineError> {
        if self.workers.is_shut_down() {
            return Err(EngineError::ShutDown);
        }
        if self.pending() >= self.bound {
            return Err(EngineError::Full);
        }
        self.workers.send(payload, samples.max(1))?;
        self.sequencer.submitted();
        Ok(())
    }

    /// The next output in delivery order, waiting at most `wait` for it:
    /// the consumer's request for it, counted in the occupancy signal.
    pub fn recv(&mut self, wait: Duration) -> Result<W::Output, EngineError> {
        self.recv_asking(wait, Ask::New)
    }

    /// As `recv`, for the same request again after a wait ran out: counted
    /// once, or a long wait would count as many requests that found nothing.
    pub fn recv_again(&mut self, wait: Duration) -> Result<W::Output, EngineError> {
        self.recv_asking(wait, Ask::Again)
    }

    fn recv_asking(&mut self, wait: Duration, ask: Ask) -> Result<W::Output, EngineError> {
        if self.workers.is_shut_down() {
            return Err(EngineError::ShutDown);
        }
        self.bound = self.workers.scaled(self.max_in_flight);
        let ready = self.sequencer.ready() + self.workers.results_waiting();
        let _waiting = self.workers.consumer_asks(ask, ready, self.bound);
        loop {
            if let Some(item) = self.sequencer.pop() {
                self.workers.consumer_received();
                return item;
            }
            if self.sequencer.pending() == 0 {
                return Err(EngineError::Idle);
            }
            let done = self.workers.recv(wait)?;
            self.accept(done);
        }
    }

    fn accept(&mut self, done: Done<W::Output>) {
        if done.epoch != self.workers.epoch() {
            return;
        }
        if matches!(done.finished, Finished::Ran(_)) {
            self.fetch_times
                .record(done.elapsed / done.samples.max(1) as u32);
        }
        let item = match done.finished {
            Finished::Ran(Outcome::Value(value)) => Some(Ok(value)),
            Finished::Ran(Outcome::Exhausted) => {
                self.workers.deactivate(done.worker);
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
}

impl<W: WorkerHooks> Lifecycle for Engine<W> {
    /// Round-robin dispatch starts again at worker 0.
    fn new_epoch(&mut self) -> Result<(), EngineError> {
        self.workers.end_epoch()?;
        self.sequencer.reset(self.workers.next_seq());
        Ok(())
    }

    fn shutdown(&mut self, grace: Duration) -> usize {
        self.workers.shutdown(grace)
    }

    fn shutdown_with_default_grace(&mut self) -> usize {
        self.workers.shutdown_with_default_grace()
    }
}
