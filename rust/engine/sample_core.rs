//! The sample-level engine's state, shared by the consumer (who submits),
//! the workers (who hand in finished samples and take the batches they
//! complete) and the assembly thread (which collates those batches).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};

use super::assembler::Assembler;
use super::assembly_thread::CollateTaken;
use super::error::EngineError;
use super::fetch_times::FetchTimes;
use super::gil_contention::GilContention;
use super::monitor::{store_timeout, SharedTimeout};
use super::moved_stalls::MovedStalls;
use super::pool::{Deliver, WorkerHooks};
use super::sample_sequence::Lateness;
use super::sample_timeout::TimeoutEstimator;
use super::task::{Done, Finished, Outcome, Sample};
use super::workers::Workers;

/// A batch's assembly looks again at most this much later than the
/// moment a sample holding it may turn late: a worker wakes the assembly
/// thread sooner only for a moment earlier than that (see
/// `SampleCore::hand_ready`), not for the jitter of every result.
const LOOK_SLACK: Duration = Duration::from_millis(1);

/// The state behind the lock, and the condition the consumer waits on while
/// an epoch's running tasks finish.
pub(crate) struct SampleShared<S, W: WorkerHooks> {
    core: Mutex<SampleCore<S, W>>,
    /// Notified when the last task sent has been received: ending an epoch
    /// waits for the running ones.
    task_received: Condvar,
    /// Wakes the assembly thread: batches wait for it, the consumer must
    /// look again, or a batch may move on sooner than it planned to look.
    /// It holds one wake-up: a full queue means one is already waiting.
    wake: (Sender<()>, Receiver<()>),
    /// What collates the batches taken and queues them for the consumer:
    /// set once the assembly thread starts, before any task is sent.
    collator: OnceLock<Arc<dyn CollateTaken<S>>>,
    /// The assembly thread's passes over the state (tests).
    #[cfg(test)]
    pub passes: std::sync::atomic::AtomicUsize,
}

impl<S, W: WorkerHooks> SampleShared<S, W> {
    pub fn new(core: SampleCore<S, W>) -> Self {
        SampleShared {
            core: Mutex::new(core),
            task_received: Condvar::new(),
            wake: bounded(1),
            collator: OnceLock::new(),
            #[cfg(test)]
            passes: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Asks the assembly thread to look at the state.
    pub fn wake(&self) {
        let _ = self.wake.0.try_send(());
    }

    /// Connects the collator (see `AssemblyThread::start`).
    pub fn set_collator(&self, collator: Arc<dyn CollateTaken<S>>) {
        let _ = self.collator.set(collator);
    }

    /// Collates `batches`, taken in `epoch` with their ordinals, on the
    /// calling thread, outside the lock (collating calls the user's code),
    /// and queues them; a collate that panicked breaks the epoch. False
    /// once the consumer is gone.
    pub fn collate_taken(&self, epoch: u64, batches: Vec<(u64, Vec<S>)>) -> bool {
        let Some(collator) = self.collator.get() else {
            return true;
        };
        for (ordinal, batch) in batches {
            match collator.collate_one(epoch, ordinal, batch) {
                Err(()) => return false,
                Ok(None) => {}
                Ok(Some(panic)) => {
                    let mut core = self.lock();
                    if core.workers.epoch() == epoch {
                        core.broken = Some(EngineError::CollatorPanicked(panic));
                    }
                    drop(core);
                    if !self.tell_changed() {
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Tells the waiting consumer to look at the state again; false once
    /// it is gone.
    pub fn tell_changed(&self) -> bool {
        self.collator
            .get()
            .map_or(true, |collator| collator.changed())
    }

    /// What the assembly thread waits on.
    pub fn wake_ups(&self) -> Receiver<()> {
        self.wake.1.clone()
    }

    /// The state, locked. Neither side calls into Python while holding it
    /// (collation runs after it is released), so a thread that holds the GIL
    /// may wait for it.
    pub fn lock(&self) -> MutexGuard<'_, SampleCore<S, W>> {
        self.core
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A worker's finished task: taken in on the worker's own thread, with
    /// the batches it completes, so the assembly thread wakes per batch
    /// rather than per task. Where any thread may collate them (see
    /// `Collate::any_thread`) the worker collates those batches itself, as
    /// a whole-batch worker does, and the assembly thread wakes only for
    /// what else changed. False once the consumer is gone.
    fn deliver(&self, done: Done<Vec<Sample<S>>>) -> bool
    where
        W: WorkerHooks<Output = Vec<Sample<S>>>,
    {
        let on_workers = self.collator.get().is_some_and(|c| c.on_workers());
        let mut core = self.lock();
        core.workers.received(done.worker);
        if core.workers.unreceived() == 0 {
            self.task_received.notify_all();
        }
        core.accept(done);
        let (wake, epoch, batches) = if on_workers {
            let batches = core.take_ready();
            (core.wants_look(), core.workers.epoch(), batches)
        } else {
            (core.hand_ready(), 0, Vec::new())
        };
        drop(core);
        if wake {
            self.wake();
        }
        batches.is_empty() || self.collate_taken(epoch, batches)
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
    /// When this epoch's tasks that samples moved out of ran, once done:
    /// how often, and how long, batches loaded whole would have kept the
    /// loop waiting on them.
    pub moved_stalls: MovedStalls,
    /// Set when a worker or the collator panicked: the batches can no
    /// longer be completed.
    pub broken: Option<EngineError>,
    /// Batches of this epoch taken from the assembler that the consumer has
    /// not received yet (being collated, or waiting for it), and their samples.
    pub handed_batches: usize,
    pub handed_samples: usize,
    /// Batches taken from the assembler, with their ordinals, for the
    /// assembly thread to collate.
    pub taken: VecDeque<(u64, Vec<S>)>,
    /// The ordinal of the next batch taken this epoch: batches collated on
    /// several threads reach the consumer out of order, and it puts them
    /// back in this order.
    pub next_ordinal: u64,
    /// When the assembly thread means to look again without news: the next
    /// batch waits for a sample that may turn late by then.
    pub look_at: Option<Instant>,
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
            moved_stalls: MovedStalls::default(),
            broken: None,
            handed_batches: 0,
            handed_samples: 0,
            taken: VecDeque::new(),
            next_ordinal: 0,
            look_at: None,
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
                if self.assembler.moved_of(done.seq) > 0 {
                    self.moved_stalls.add(done.started, done.ended);
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
    /// order, with its ordinal; the consumer counts them as coming.
    pub fn take_ready(&mut self) -> Vec<(u64, Vec<S>)> {
        let workers = &self.workers;
        let late_after = self.timeout.late_after();
        let late = |task: u64| lateness(workers.task_worked(task), late_after);
        let assembler = &mut self.assembler;
        let first = self.next_ordinal;
        let batches: Vec<(u64, Vec<S>)> = std::iter::from_fn(|| assembler.pop_batch(late))
            .zip(first..)
            .map(|(batch, ordinal)| (ordinal, batch))
            .collect();
        self.next_ordinal += batches.len() as u64;
        self.handed_batches += batches.len();
        self.handed_samples += batches.iter().map(|(_, batch)| batch.len()).sum::<usize>();
        batches
    }

    /// Takes every ready batch for the assembly thread. Returns whether it
    /// must wake: batches wait for it, the consumer must look again (see
    /// [`Self::no_batch_coming`]), or the next batch may move on past a late
    /// sample well before the thread means to look.
    pub fn hand_ready(&mut self) -> bool {
        let batches = self.take_ready();
        if !batches.is_empty() {
            self.taken.extend(batches);
            return true;
        }
        if !self.taken.is_empty() {
            return false; // a wake-up is on its way
        }
        self.wants_look()
    }

    /// Whether the assembly thread must look, batches aside: the consumer
    /// must look again, or the next batch may move on past a late sample
    /// well before the thread means to look.
    pub fn wants_look(&self) -> bool {
        if self.no_batch_coming().is_some() {
            return true;
        }
        let Some(due) = self.assembler.wake_in() else {
            return false;
        };
        let moves_at = Instant::now() + due;
        self.look_at
            .map_or(true, |planned| moves_at + LOOK_SLACK < planned)
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
        self.moved_stalls.clear();
        self.taken.clear();
        self.next_ordinal = 0;
        self.handed_batches = 0;
        self.handed_samples = 0;
    }
}

/// The sample engine's end of its workers: each hands its finished task
/// straight into the shared state (see [`SampleShared::deliver`]).
pub(crate) struct Handoff<S, W: WorkerHooks> {
    /// Set once the state exists, before any task is sent; weak, for the
    /// state owns the workers.
    shared: OnceLock<Weak<SampleShared<S, W>>>,
}

impl<S, W: WorkerHooks> Handoff<S, W> {
    pub fn new() -> Self {
        Handoff {
            shared: OnceLock::new(),
        }
    }

    pub fn connect(&self, shared: &Arc<SampleShared<S, W>>) {
        let _ = self.shared.set(Arc::downgrade(shared));
    }
}

impl<S, W> Deliver<Vec<Sample<S>>> for Handoff<S, W>
where
    S: Send,
    W: WorkerHooks<Output = Vec<Sample<S>>>,
{
    fn deliver(&self, done: Done<Vec<Sample<S>>>) -> bool {
        match self.shared.get().and_then(Weak::upgrade) {
            Some(shared) => shared.deliver(done),
            None => false, // the engine is gone
        }
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
