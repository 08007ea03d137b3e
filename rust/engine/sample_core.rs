//! The sample-level engine's state, shared by the consumer (who submits)
//! and the assembly thread (which receives finished samples, builds the
//! batches and hands them to the collator).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::assembler::Assembler;
use super::error::EngineError;
use super::fetch_times::FetchTimes;
use super::gil_contention::GilContention;
use super::monitor::{store_timeout, SharedTimeout};
use super::pool::WorkerHooks;
use super::sample_sequence::Lateness;
use super::sample_timeout::TimeoutEstimator;
use super::task::{Done, Finished, Outcome, Sample};
use super::workers::Workers;

/// The state behind the lock, and the condition the consumer waits on while
/// an epoch's running tasks finish.
pub(crate) struct SampleShared<S, W: WorkerHooks> {
    core: Mutex<SampleCore<S, W>>,
    /// Notified each time the assembly thread takes a task off the result
    /// queue: ending an epoch waits for the running ones.
    task_received: Condvar,
}

impl<S, W: WorkerHooks> SampleShared<S, W> {
    pub fn new(core: SampleCore<S, W>) -> Self {
        SampleShared {
            core: Mutex::new(core),
            task_received: Condvar::new(),
        }
    }

    /// The state, locked. Neither side calls into Python while holding it
    /// (collation runs after it is released), so a thread that holds the GIL
    /// may wait for it.
    pub fn lock(&self) -> MutexGuard<'_, SampleCore<S, W>> {
        self.core
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn notify_received(&self) {
        self.task_received.notify_all();
    }

    /// Waits until every task sent has been received, or `deadline`
    /// passes (None: no deadline).
    pub fn wait_all_received<'a>(
        &self,
        mut core: MutexGuard<'a, SampleCore<S, W>>,
        deadline: Option<Instant>,
    ) -> MutexGuard<'a, SampleCore<S, W>> {
        while core.workers.unreceived() > 0 {
            core = match deadline {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    self.task_received
                        .wait_timeout(core, left)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0
                }
                None => self
                    .task_received
                    .wait(core)
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            };
        }
        core
    }
}

pub(crate) struct SampleCore<S, W: WorkerHooks> {
    pub workers: Workers<W>,
    pub assembler: Assembler<S>,
    pub timeout: TimeoutEstimator,
    pub shared_timeout: SharedTimeout,
    pub fetch_times: FetchTimes,
    /// The tasks' waits to enter the dataset's code (see `run_length`).
    pub gil_contention: GilContention,
    pub slow_samples: u64,
    /// Set when a worker or the collator panicked: the batches can no
    /// longer be completed.
    pub broken: Option<EngineError>,
    /// Batches of this epoch taken from the assembler that the consumer has
    /// not received yet (being collated, or waiting for it), and their samples.
    pub handed_batches: usize,
    pub handed_samples: usize,
}

impl<S, W> SampleCore<S, W>
where
    W: WorkerHooks<Output = Vec<Sample<S>>>,
{
    pub fn new(
        workers: Workers<W>,
        assembler: Assembler<S>,
        timeout: TimeoutEstimator,
        shared_timeout: SharedTimeout,
        fetch_times: FetchTimes,
    ) -> Self {
        SampleCore {
            workers,
            assembler,
            timeout,
            shared_timeout,
            fetch_times,
            gil_contention: GilContention::default(),
            slow_samples: 0,
            broken: None,
            handed_batches: 0,
            handed_samples: 0,
        }
    }

    /// Takes in a finished task's samples (a stale epoch's are dropped).
    pub fn accept(&mut self, done: Done<Vec<Sample<S>>>) {
        if done.epoch != self.workers.epoch() {
            return;
        }
        match done.finished {
            Finished::Ran(Outcome::Value(samples)) if samples.len() == done.samples => {
                let per_sample = done.elapsed / done.samples.max(1) as u32;
                self.fetch_times.record(per_sample);
                self.gil_contention.record(done.paused);
                self.timeout.record(per_sample, done.samples, done.slow);
                store_timeout(&self.shared_timeout, self.timeout.current());
                if done.slow {
                    self.slow_samples += done.samples as u64;
                }
                self.assembler.finished(done.seq, samples, done.slow);
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

    /// Every batch whose samples are ready, taken from the assembler in
    /// order; the consumer counts them as coming.
    pub fn take_ready(&mut self) -> Vec<Vec<S>> {
        let workers = &self.workers;
        let late_after = self.timeout.late_after();
        let late = |task: u64| lateness(workers.task_worked(task), late_after);
        let assembler = &mut self.assembler;
        let batches: Vec<Vec<S>> = std::iter::from_fn(|| assembler.pop_batch(late)).collect();
        self.handed_batches += batches.len();
        self.handed_samples += batches.iter().map(Vec::len).sum::<usize>();
        batches
    }

    /// The consumer received a batch of `samples` samples.
    pub fn delivered(&mut self, samples: usize) {
        self.handed_batches -= 1;
        self.handed_samples -= samples;
        self.workers.consumer_received();
    }

    /// Batches of this epoch not yet received by the consumer.
    pub fn pending(&self) -> usize {
        self.assembler.pending_batches() + self.handed_batches
    }

    /// Samples submitted this epoch and not yet received: what bounds memory.
    pub fn samples_in_flight(&self) -> usize {
        self.assembler.samples_in_flight() + self.handed_samples
    }

    /// Why the consumer, with no batch coming, should stop waiting: the
    /// engine is broken, nothing is pending, or only more submissions can
    /// complete the next batch. None while a batch is on its way.
    pub fn no_batch_coming(&self) -> Option<EngineError> {
        if let Some(err) = &self.broken {
            return Some(err.clone());
        }
        if self.handed_batches > 0 {
            return None;
        }
        if self.assembler.pending_batches() == 0 {
            return Some(EngineError::Idle);
        }
        self.assembler.starved().then_some(EngineError::Starved)
    }

    /// Samples that left their batch, in the sampler's order, while late.
    pub fn moved_samples(&self) -> u64 {
        self.assembler.moved()
    }

    /// Forgets the epoch's batches (the workers' epoch moved on first).
    pub fn clear_epoch(&mut self) {
        self.assembler.clear();
        self.handed_batches = 0;
        self.handed_samples = 0;
    }
}

/// Where a task stands against `late_after` (per sample: a run of samples
/// may take as many times as long), from how long it has worked and its
/// samples (None: still queued, to be looked at again).
fn lateness(worked: Option<(Duration, usize)>, late_after: Option<Duration>) -> Lateness {
    let Some(late_after) = late_after else {
        return Lateness::Never;
    };
    let Some((worked, samples)) = worked else {
        return Lateness::DueIn(late_after);
    };
    let limit = late_after.saturating_mul(u32::try_from(samples.max(1)).unwrap_or(u32::MAX));
    if worked > limit {
        Lateness::Late
    } else {
        Lateness::DueIn(limit - worked)
    }
}
