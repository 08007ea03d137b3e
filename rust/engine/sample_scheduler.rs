//! The sample-level engine: workers load samples, batches are assembled from
//! whichever samples are ready, and workers stuck on slow samples are
//! replaced while they finish.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use super::assembler::Assembler;
use super::controller::ControllerConfig;
use super::dispatch::Dispatch;
use super::error::EngineError;
use super::fetch_times::FetchTimes;
use super::lifecycle::Lifecycle;
use super::monitor::{store_timeout, MonitorConfig, SharedTimeout};
use super::pool::WorkerHooks;
use super::sample_timeout::{SampleTimeout, TimeoutEstimator};
use super::scheduler::FETCH_WINDOW;
use super::stats::{Ask, EngineStats};
use super::task::{Done, Finished, Outcome, Sample};
use super::workers::Workers;

/// How a sample engine is set up.
#[derive(Debug, Clone)]
pub struct SampleEngineConfig {
    /// Workers kept free for fast samples.
    pub num_workers: usize,
    /// Most samples submitted and not yet delivered with `num_workers`
    /// workers; it scales with the pool when it grows.
    pub max_samples_in_flight: usize,
    /// The largest batch `submit` will be given.
    pub max_batch_size: usize,
    pub sample_timeout: SampleTimeout,
    /// Most samples flagged slow and still running; at the bound no
    /// replacement worker is started.
    pub max_slow_in_flight: usize,
    /// How long dropping the engine waits for a worker still inside a task.
    pub shutdown_grace: Duration,
    /// Resize the pool while running.
    pub adaptive: Option<ControllerConfig>,
    /// When skipped samples leave the epoch's last batch short, drop it (the
    /// loader's drop_last: every batch is full) instead of delivering it short.
    pub drop_last: bool,
}

/// A task should take at least this long, so that the per-task cost
/// (queues, a GIL hand-over) stays small next to the work: cheap samples go
/// to workers in runs. Workers whose tasks cost more (a round trip to a
/// worker process) set a longer one (`set_run_target`).
pub const RUN_TARGET: Duration = Duration::from_micros(500);
/// Longest run of samples in one task.
const MAX_RUN: usize = 64;

/// Runs one sample task per run of indices and hands back whole batches.
///
/// `W::run` gets a run of sample payloads and returns one output per
/// payload: a sample, or a skipped sample's record (the failure policy),
/// handed over by `take_skipped`.
pub struct SampleEngine<P, S, W>
where
    W: WorkerHooks<Payload = Vec<P>, Output = Vec<Sample<S>>>,
{
    workers: Workers<W>,
    assembler: Assembler<S>,
    timeout: TimeoutEstimator,
    shared_timeout: SharedTimeout,
    fetch_times: FetchTimes,
    max_samples_in_flight: usize,
    /// The bound for the pool's size, read when the consumer receives; see
    /// `Engine`'s.
    bound: usize,
    /// Samples per task in the last batch submitted.
    last_run_length: usize,
    /// The least time a task should take (see `RUN_TARGET`).
    run_target: Duration,
    max_batch_size: usize,
    slow_samples: u64,
    /// Set when a worker panicked: the batches can no longer be completed.
    broken: Option<EngineError>,
}

impl<P, S, W> SampleEngine<P, S, W>
where
    W: WorkerHooks<Payload = Vec<P>, Output = Vec<Sample<S>>>,
{
    pub fn start(config: SampleEngineConfig, hooks: W) -> Result<Self, EngineError> {
        let max_batch_size = config.max_batch_size.max(1);
        let max_samples = config.max_samples_in_flight.max(max_batch_size);
        // Every task holds at least one sample, so tasks in flight never
        // outnumber samples in flight.
        let shared_timeout = Arc::new(AtomicU64::new(0));
        let timeout = TimeoutEstimator::new(config.sample_timeout);
        store_timeout(&shared_timeout, timeout.current());
        let workers = Workers::start(
            hooks,
            Dispatch::Shared,
            config.num_workers,
            max_samples,
            MonitorConfig {
                slow_samples: Some((shared_timeout.clone(), config.max_slow_in_flight)),
                adaptive: config.adaptive,
            },
            config.shutdown_grace,
        )?;
        Ok(SampleEngine {
            workers,
            assembler: Assembler::new(config.drop_last),
            timeout,
            shared_timeout,
            fetch_times: FetchTimes::new(FETCH_WINDOW),
            max_samples_in_flight: max_samples,
            bound: max_samples,
            last_run_length: 1,
            run_target: RUN_TARGET,
            max_batch_size,
            slow_samples: 0,
            broken: None,
        })
    }

    /// Fixes the pool at `workers` for the rest of its life: the adaptive
    /// controller no longer resizes it.
    pub fn fix_workers(&self, workers: usize) {
        self.workers.fix_workers(workers);
    }

    /// Worker threads running now, replacements included.
    pub fn num_workers(&self) -> usize {
        self.workers.live()
    }

    /// The slow-sample timeout now; None while warming up or when off.
    pub fn sample_timeout(&self) -> Option<Duration> {
        self.timeout.current()
    }

    /// Samples flagged slow so far.
    pub fn slow_samples(&self) -> u64 {
        self.slow_samples
    }

    /// The engine's figures now.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            slow_samples: self.slow_samples,
            sample_timeout: self.timeout.current(),
            ..self.workers.stats()
        }
        .with_fetch_times(&self.fetch_times)
    }

    /// Whether another batch (of at most `max_batch_size`) fits under the
    /// in-flight bound now, or is needed to fill a batch skipped samples
    /// left short.
    pub fn can_submit(&self) -> bool {
        !self.workers.is_shut_down()
            && (self.assembler.samples_in_flight() + self.max_batch_size <= self.bound
                || self.assembler.starved())
    }

    /// The consumer has submitted the epoch's last batch: the samples
    /// skipped this epoch are taken off its last batches (see `Assembler`).
    pub fn close_epoch(&mut self) {
        self.assembler.close();
    }

    /// The records of the samples skipped since the last call, this epoch.
    pub fn take_skipped(&mut self) -> Vec<S> {
        self.assembler.take_skipped()
    }

    /// Batches of this epoch submitted and not yet delivered.
    pub fn pending(&self) -> usize {
        self.assembler.pending_batches()
    }

    /// Sets the least time a task should take, from the next batch on.
    pub fn set_run_target(&mut self, run_target: Duration) {
        self.run_target = run_target;
    }

    /// Sets the floor of the automatic per-sample timeout (see
    /// `TimeoutEstimator::set_min_auto`).
    pub fn set_min_auto_timeout(&mut self, floor: Duration) {
        self.timeout.set_min_auto(floor);
        store_timeout(&self.shared_timeout, self.timeout.current());
    }

    /// Samples per task: one when samples are slow enough to be worth a
    /// task each, a run of them when they are cheap.
    pub(crate) fn run_length(&self) -> usize {
        match self.fetch_times.percentile(0.5) {
            Some(p50) if !p50.is_zero() => {
                let run = self.run_target.as_nanos() / p50.as_nanos();
                usize::try_from(run).unwrap_or(MAX_RUN).clamp(1, MAX_RUN)
            }
            Some(_) => MAX_RUN,
            None => 1,
        }
    }

    /// Queues one batch's samples; the batch delivered in its place has the
    /// same size, built from whichever samples are ready first.
    pub fn submit(&mut self, batch: Vec<P>) -> Result<(), EngineError> {
        if self.workers.is_shut_down() {
            return Err(EngineError::ShutDown);
        }
        if batch.len() > self.max_batch_size {
            return Err(EngineError::BatchTooLarge {
                size: batch.len(),
                max: self.max_batch_size,
            });
        }
        if !self.can_submit() {
            return Err(EngineError::Full);
        }
        let run_length = self.run_length();
        self.last_run_length = run_length;
        self.assembler.planned(batch.len());
        let mut samples = batch.into_iter().peekable();
        while samples.peek().is_some() {
            let run: Vec<P> = samples.by_ref().take(run_length).collect();
            let len = run.len();
            self.workers.send(run, len)?;
        }
        Ok(())
    }

    /// The next batch, waiting at most `wait` for enough samples: the
    /// consumer's request for it, counted in the occupancy signal.
    pub fn recv(&mut self, wait: Duration) -> Result<Vec<S>, EngineError> {
        self.recv_asking(wait, Ask::New)
    }

    /// As `recv`, for the same request again after a wait ran out: counted
    /// once, or a long wait would count as many requests that found nothing.
    pub fn recv_again(&mut self, wait: Duration) -> Result<Vec<S>, EngineError> {
        self.recv_asking(wait, Ask::Again)
    }

    fn recv_asking(&mut self, wait: Duration, ask: Ask) -> Result<Vec<S>, EngineError> {
        if self.workers.is_shut_down() {
            return Err(EngineError::ShutDown);
        }
        self.bound = self.workers.scaled(self.max_samples_in_flight);
        let ready =
            self.assembler.ready_samples() + self.workers.results_waiting() * self.last_run_length;
        let _waiting = self.workers.consumer_asks(ask, ready, self.bound);
        loop {
            if let Some(err) = &self.broken {
                return Err(err.clone());
            }
            if let Some(batch) = self.assembler.pop_batch() {
                self.workers.consumer_received();
                return Ok(batch);
            }
            if self.assembler.pending_batches() == 0 {
                return Err(EngineError::Idle);
            }
            if self.assembler.starved() {
                return Err(EngineError::Starved);
            }
            let done = self.workers.recv(wait)?;
            self.accept(done);
        }
    }

    fn accept(&mut self, done: Done<Vec<Sample<S>>>) {
        if done.epoch != self.workers.epoch() {
            return;
        }
        match done.finished {
            Finished::Ran(Outcome::Value(samples)) if samples.len() == done.samples => {
                let per_sample = done.elapsed / done.samples.max(1) as u32;
                self.fetch_times.record(per_sample);
                self.timeout.record(per_sample, done.samples, done.slow);
                store_timeout(&self.shared_timeout, self.timeout.current());
                if done.slow {
                    self.slow_samples += done.samples as u64;
                }
                self.assembler.finished(samples, done.slow);
            }
            Finished::Ran(_) | Finished::Cancelled => {
                self.broken = Some(EngineError::WorkerPanicked {
                    worker: done.worker,
                    message: "a sample task returned the wrong number of samples".to_owned(),
                });
            }
            Finished::Panicked(message) => {
                self.broken = Some(EngineError::WorkerPanicked {
                    worker: done.worker,
                    message,
                });
            }
        }
    }
}

impl<P, S, W> Lifecycle for SampleEngine<P, S, W>
where
    W: WorkerHooks<Payload = Vec<P>, Output = Vec<Sample<S>>>,
{
    fn new_epoch(&mut self) -> Result<(), EngineError> {
        self.workers.end_epoch()?;
        self.assembler.clear();
        Ok(())
    }

    fn shutdown(&mut self, grace: Duration) -> usize {
        self.workers.shutdown(grace)
    }

    fn shutdown_with_default_grace(&mut self) -> usize {
        self.workers.shutdown_with_default_grace()
    }
}

impl<P, S, W> Drop for SampleEngine<P, S, W>
where
    W: WorkerHooks<Payload = Vec<P>, Output = Vec<Sample<S>>>,
{
    fn drop(&mut self) {
        self.shutdown_with_default_grace();
    }
}
