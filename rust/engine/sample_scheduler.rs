//! The sample-level engine: workers load samples, batches are assembled from
//! whichever samples are ready and collated on the engine's assembly thread,
//! and workers stuck on slow samples are replaced while they finish.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};

use super::assembler::Assembler;
use super::assembly_thread::{AssemblyThread, Output};
use super::collate::{Collate, Uncollated};
use super::controller::ControllerConfig;
use super::dispatch::Dispatch;
use super::error::EngineError;
use super::fetch_times::FetchTimes;
use super::gil_contention::MAX_CONTENDED_RUN;
use super::lifecycle::Lifecycle;
use super::look::receive;
use super::monitor::{store_timeout, MonitorConfig};
use super::pool::WorkerHooks;
use super::sample_core::{Handoff, SampleCore, SampleShared};
use super::sample_timeout::{SampleTimeout, TimeoutEstimator};
use super::scheduler::FETCH_WINDOW;
use super::stats::{Ask, EngineStats};
use super::task::Sample;
use super::workers::{ResultsTo, Workers};
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
    /// Batches keep the sampler's order, but for a sample running late (past
    /// `TimeoutEstimator::late_after`), which joins a later batch; otherwise
    /// each batch takes whichever samples finished first.
    pub in_sequence: bool,
}

/// A task should take at least this long, so that the per-task cost
/// (queues, a GIL hand-over) stays small next to the work: cheap samples go
/// to workers in runs. Workers whose tasks cost more (a round trip to a
/// worker process) set a longer one (`set_run_target`); where workers wait
/// long to enter the dataset's code, runs grow too (`GilContention`).
pub const RUN_TARGET: Duration = Duration::from_micros(500);
/// Longest run of samples in one task.
const MAX_RUN: usize = 64;
/// Most tasks a second a pool should be given, all its workers together.
/// Each task costs the consumer's process a hand-over or two of the GIL,
/// paid there for every worker: past this rate, runs of samples carry that
/// cost instead of single samples (see [`pooled_run_target`]).
const MAX_TASK_RATE: f64 = 4000.0;

/// Runs one sample task per run of indices and hands back whole batches,
/// collated by `C` off the consumer's thread.
///
/// `W::run` gets a run of sample payloads and returns one output per
/// payload: a sample, or a skipped sample's record (the failure policy),
/// handed over by `take_skipped`.
pub struct SampleEngine<P, S, W, C = Uncollated>
where
    W: WorkerHooks<Payload = Vec<P>, Output = Vec<Sample<S>>>,
    C: Collate<S>,
{
    shared: Arc<SampleShared<S, W>>,
    assembly: AssemblyThread,
    output: Receiver<Output<C::Batch>>,
    max_samples_in_flight: usize,
    /// The bound for the pool's size, read when the consumer receives; see
    /// `Engine`'s.
    bound: usize,
    /// The least time a task should take (see `RUN_TARGET`).
    run_target: Duration,
    max_batch_size: usize,
    /// Batches of this epoch received ahead of their turn (collated on
    /// several threads), by ordinal, with their samples.
    early: BTreeMap<u64, (usize, C::Batch)>,
    /// The ordinal of the batch the consumer gets next.
    next_ordinal: u64,
    payloads: PhantomData<fn(P)>,
}

impl<P, S, W> SampleEngine<P, S, W, Uncollated>
where
    P: Send + 'static,
    S: Send + 'static,
    W: WorkerHooks<Payload = Vec<P>, Output = Vec<Sample<S>>>,
{
    /// An engine that delivers each batch as its list of samples.
    pub fn start(config: SampleEngineConfig, hooks: W) -> Result<Self, EngineError> {
        Self::start_collating(config, hooks, Uncollated)
    }
}

impl<P, S, W, C> SampleEngine<P, S, W, C>
where
    P: Send + 'static,
    S: Send + 'static,
    W: WorkerHooks<Payload = Vec<P>, Output = Vec<Sample<S>>>,
    C: Collate<S>,
{
    pub fn start_collating(
        config: SampleEngineConfig,
        hooks: W,
        collate: C,
    ) -> Result<Self, EngineError> {
        let max_batch_size = config.max_batch_size.max(1);
        let max_samples = config.max_samples_in_flight.max(max_batch_size);
        // Every task holds at least one sample, so tasks in flight never
        // outnumber samples in flight.
        let shared_timeout = Arc::new(AtomicU64::new(0));
        let timeout = TimeoutEstimator::new(config.sample_timeout);
        store_timeout(&shared_timeout, timeout.current());
        // A batch that skipped samples left short may be filled past the
        // bound (`has_room`): only while the samples not yet handed over
        // are fewer than one batch, so at most two batches more are ever in
        // flight. The queues hold that many tasks too, or a send would find
        // them full.
        let max_tasks = max_samples + 2 * max_batch_size;
        let handoff = Arc::new(Handoff::new());
        let workers = Workers::start(
            hooks,
            Dispatch::Shared,
            config.num_workers,
            max_tasks,
            MonitorConfig {
                slow_samples: Some((shared_timeout.clone(), config.max_slow_in_flight)),
                adaptive: config.adaptive,
            },
            config.shutdown_grace,
            ResultsTo::Sink(handoff.clone()),
        )?;
        let core = SampleCore::new(
            workers,
            Assembler::new(config.drop_last, config.in_sequence),
            timeout,
            shared_timeout,
            FetchTimes::new(FETCH_WINDOW),
        );
        let shared = Arc::new(SampleShared::new(core));
        handoff.connect(&shared);
        let (assembly, output) = match AssemblyThread::start(shared.clone(), collate) {
            Ok(started) => started,
            Err(err) => {
                shared.lock().workers.shutdown(Duration::ZERO);
                return Err(err);
            }
        };
        Ok(SampleEngine {
            shared,
            assembly,
            output,
            max_samples_in_flight: max_samples,
            bound: max_samples,
            run_target: RUN_TARGET,
            max_batch_size,
            early: BTreeMap::new(),
            next_ordinal: 0,
            payloads: PhantomData,
        })
    }

    /// Fixes the pool at `workers` for the rest of its life: the adaptive
    /// controller no longer resizes it.
    pub fn fix_workers(&self, workers: usize) {
        self.shared.lock().workers.fix_workers(workers);
    }

    /// Lets the adaptive controller resize the pool again after `fix_workers`.
    pub fn adapt_workers(&self) {
        self.shared.lock().workers.adapt_workers();
    }

    /// Worker threads running now, replacements included.
    pub fn num_workers(&self) -> usize {
        self.shared.lock().workers.live()
    }

    /// The slow-sample timeout now; None while warming up or when off.
    pub fn sample_timeout(&self) -> Option<Duration> {
        self.shared.lock().timeout.current()
    }

    /// Samples flagged slow so far.
    pub fn slow_samples(&self) -> u64 {
        self.shared.lock().slow_samples
    }

    /// The engine's figures now.
    pub fn stats(&self) -> EngineStats {
        let core = self.shared.lock();
        EngineStats {
            slow_samples: core.slow_samples,
            moved_samples: core.moved_samples(),
            moved_running: core.assembler.moved_running(),
            moved_stalls: core.moved_stalls.count(),
            longest_moved: core.moved_stalls.longest(),
            sample_timeout: core.timeout.current(),
            ..core.workers.stats()
        }
        .with_fetch_times(&core.fetch_times)
    }

    /// Whether another batch (of at most `max_batch_size`) fits under the
    /// in-flight bound now, or is needed to fill a batch skipped samples
    /// left short.
    pub fn can_submit(&self) -> bool {
        let core = self.shared.lock();
        !core.workers.is_shut_down() && self.has_room(&core)
    }

    /// Whether a batch of `max_batch_size` fits under the bound, or is
    /// needed to fill a batch skipped samples left short.
    fn has_room(&self, core: &SampleCore<S, W>) -> bool {
        core.samples_in_flight() + self.max_batch_size <= self.bound || core.assembler.starved()
    }

    /// The consumer has submitted the epoch's last batch: the samples
    /// skipped this epoch are taken off its last batches (see `Assembler`).
    pub fn close_epoch(&mut self) {
        self.shared.lock().assembler.close();
        // A batch cut short may be complete now.
        self.shared.wake();
    }

    /// The records of the samples skipped since the last call, this epoch.
    pub fn take_skipped(&mut self) -> Vec<S> {
        self.shared.lock().assembler.take_skipped()
    }

    /// Batches of this epoch submitted and not yet delivered.
    pub fn pending(&self) -> usize {
        self.shared.lock().pending()
    }

    /// Sets the least time a task should take, from the next batch on.
    pub fn set_run_target(&mut self, run_target: Duration) {
        self.run_target = run_target;
    }

    /// Sets the floor of the automatic per-sample timeout (see
    /// `TimeoutEstimator::set_min_auto`).
    pub fn set_min_auto_timeout(&mut self, floor: Duration) {
        let mut core = self.shared.lock();
        core.timeout.set_min_auto(floor);
        store_timeout(&core.shared_timeout, core.timeout.current());
    }

    /// Samples per task now (see [`run_length`]).
    #[cfg(test)]
    pub(crate) fn run_length(&self) -> usize {
        let core = self.shared.lock();
        run_length(&core.fetch_times, self.task_target(&core)).unwrap_or(1)
    }

    /// The least time a task should take now: the run target, or longer
    /// where workers contend to enter the dataset's code or are many.
    fn task_target(&self, core: &SampleCore<S, W>) -> Duration {
        core.gil_contention
            .run_target(self.run_target)
            .max(pooled_run_target(core.workers.target()))
    }

    /// The assembly thread's passes over the state so far.
    #[cfg(test)]
    pub(crate) fn assembly_passes(&self) -> usize {
        self.shared
            .passes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Queues one batch's samples; the batch delivered in its place has the
    /// same size, built from its own samples in order (but for late ones),
    /// or from whichever samples are ready first.
    pub fn submit(&mut self, batch: Vec<P>) -> Result<(), EngineError> {
        let mut core = self.shared.lock();
        if core.workers.is_shut_down() {
            return Err(EngineError::ShutDown);
        }
        if batch.len() > self.max_batch_size {
            return Err(EngineError::BatchTooLarge {
                size: batch.len(),
                max: self.max_batch_size,
            });
        }
        if !self.has_room(&core) {
            return Err(EngineError::Full);
        }
        // Runs long enough for a task's own cost, for its wait to enter the
        // dataset's code where workers contend for it, and for the pool's
        // task rate. Before any sample is timed, only a task's known cost
        // groups them.
        let run_length =
            run_length(&core.fetch_times, self.task_target(&core)).unwrap_or_else(|| {
                untimed_run_length(self.run_target, batch.len(), core.workers.live())
            });
        // Samples already waiting (made up for skipped ones) may fill it.
        let check = core.assembler.ready_samples() > 0;
        core.assembler.planned(batch.len());
        let mut samples = batch.into_iter().peekable();
        while samples.peek().is_some() {
            let run: Vec<P> = samples.by_ref().take(run_length).collect();
            let len = run.len();
            let task = core.workers.next_seq();
            core.workers.send(run, len)?;
            core.assembler.sent(task, len);
        }
        drop(core);
        if check {
            self.shared.wake();
        }
        Ok(())
    }

    /// Takes back the last batches submitted whose samples no worker has
    /// started, each as submitted (its samples in order); the engine then
    /// delivers only the batches before them. For an epoch that hands its
    /// next batches to another engine: those go there at once instead of
    /// being loaded here first. Nothing is taken back where batches take
    /// whichever samples finish first, or skipped or late samples changed
    /// the plan.
    pub fn withdraw_unstarted(&mut self) -> Result<Vec<Vec<P>>, EngineError> {
        let mut core = self.shared.lock();
        let mut queued = core.workers.take_queued();
        let runs: Vec<(u64, usize)> = queued.iter().map(|task| (task.seq, task.samples)).collect();
        let (tasks, sizes) = core.assembler.withdraw(&runs);
        let withdrawn = queued.split_off(queued.len() - tasks);
        core.workers.send_again(queued)?;
        drop(core);
        // The batch being assembled may be the last one now.
        self.shared.wake();
        let mut samples = withdrawn.into_iter().flat_map(|task| task.payload);
        Ok(sizes
            .into_iter()
            .map(|size| samples.by_ref().take(size).collect())
            .collect())
    }

    /// The next batch, waiting at most `wait` for it: the consumer's
    /// request for it, counted in the occupancy signal.
    pub fn recv(&mut self, wait: Duration) -> Result<C::Batch, EngineError> {
        self.recv_asking(wait, Ask::New)
    }

    /// As `recv`, for the same request again after a wait ran out: counted
    /// once, or a long wait would count as many requests that found nothing.
    pub fn recv_again(&mut self, wait: Duration) -> Result<C::Batch, EngineError> {
        self.recv_asking(wait, Ask::Again)
    }

    fn recv_asking(&mut self, wait: Duration, ask: Ask) -> Result<C::Batch, EngineError> {
        let deadline = Instant::now() + wait;
        let _waiting = {
            let core = self.shared.lock();
            if core.workers.is_shut_down() {
                return Err(EngineError::ShutDown);
            }
            self.bound = core.workers.scaled(self.max_samples_in_flight);
            let ready = core.assembler.ready_samples() + core.handed_samples;
            core.workers.consumer_asks(ask, ready, self.bound)
        };
        loop {
            if let Some((samples, batch)) = self.early.remove(&self.next_ordinal) {
                self.next_ordinal += 1;
                self.shared.lock().delivered(samples);
                return Ok(batch);
            }
            let output = match self.output.try_recv() {
                Ok(output) => output,
                Err(TryRecvError::Disconnected) => return Err(EngineError::WorkersGone),
                Err(TryRecvError::Empty) => {
                    if let Some(err) = self.shared.lock().no_batch_coming() {
                        return Err(err);
                    }
                    // With no time left, only a look, made with the GIL held.
                    receive(
                        &self.output,
                        deadline.saturating_duration_since(Instant::now()),
                    )?
                }
            };
            if let Output::Batch {
                epoch,
                ordinal,
                samples,
                batch,
            } = output
            {
                let mut core = self.shared.lock();
                // A batch of an epoch that has ended is dropped.
                if epoch != core.workers.epoch() {
                    continue;
                }
                // The batch due now is delivered under the same lock.
                if ordinal == self.next_ordinal {
                    self.next_ordinal += 1;
                    core.delivered(samples);
                    return Ok(batch);
                }
                drop(core);
                self.early.insert(ordinal, (samples, batch));
            }
        }
    }
}

/// Samples per task for `fetch_times`: one when samples are slow enough to
/// be worth a task each, a run of them when they are cheap; None before any
/// sample was timed.
fn run_length(fetch_times: &FetchTimes, run_target: Duration) -> Option<usize> {
    match fetch_times.percentile(0.5) {
        Some(p50) if !p50.is_zero() => {
            let run = run_target.as_nanos() / p50.as_nanos();
            Some(usize::try_from(run).unwrap_or(MAX_RUN).clamp(1, MAX_RUN))
        }
        Some(_) => Some(MAX_RUN),
        None => None,
    }
}

/// The least time a task should take for `workers` workers together to be
/// given at most [`MAX_TASK_RATE`] tasks a second, up to the bound on
/// contended runs: a slow sample holds little behind it in its run. The
/// pool's target, not its live threads: replacements for slow samples
/// would otherwise lengthen the runs that slow samples hold up.
fn pooled_run_target(workers: usize) -> Duration {
    Duration::from_secs_f64(workers as f64 / MAX_TASK_RATE).min(MAX_CONTENDED_RUN)
}

/// Samples per task before any sample was timed: one, unless a task is
/// known to cost more than the default run target (a worker process's
/// round trip). Then a batch is spread over the `workers`, one run each:
/// every worker is busy and each pays one round trip per batch, where
/// samples one by one would each pay it (the first epoch's whole prefetch
/// goes out before any sample is timed).
fn untimed_run_length(run_target: Duration, batch: usize, workers: usize) -> usize {
    if run_target <= RUN_TARGET {
        return 1;
    }
    batch.div_ceil(workers.max(1)).clamp(1, MAX_RUN)
}

impl<P, S, W, C> Lifecycle for SampleEngine<P, S, W, C>
where
    W: WorkerHooks<Payload = Vec<P>, Output = Vec<Sample<S>>>,
    C: Collate<S>,
{
    fn new_epoch(&mut self) -> Result<(), EngineError> {
        let mut core = self.shared.lock();
        let deadline = core.workers.begin_epoch_end()?;
        // The workers hand in their running tasks' results.
        core = self.shared.wait_all_received(core, deadline);
        core.workers.finish_epoch_end();
        core.clear_epoch();
        drop(core);
        // Batches of the old epoch already collated; any still being
        // collated are dropped when they arrive.
        while self.output.try_recv().is_ok() {}
        self.early.clear();
        self.next_ordinal = 0;
        Ok(())
    }

    fn shutdown(&mut self, grace: Duration) -> usize {
        // Waited for unlocked: a worker ending its task hands it in under
        // the lock.
        let stopping = self.shared.lock().workers.stop_sending();
        let left = stopping.map_or(0, |stopping| stopping.wait_for_workers(grace));
        left + self.assembly.stop(grace)
    }

    fn shutdown_with_default_grace(&mut self) -> usize {
        let grace = self.shared.lock().workers.shutdown_grace();
        self.shutdown(grace)
    }
}

impl<P, S, W, C> Drop for SampleEngine<P, S, W, C>
where
    W: WorkerHooks<Payload = Vec<P>, Output = Vec<Sample<S>>>,
    C: Collate<S>,
{
    fn drop(&mut self) {
        self.shutdown_with_default_grace();
    }
}

#[cfg(test)]
mod untimed_tests {
    use super::*;

    #[test]
    fn many_workers_share_a_task_rate_up_to_the_contended_runs_bound() {
        assert!(pooled_run_target(2) <= RUN_TARGET);
        let for_32 = pooled_run_target(32);
        assert!((for_32.as_secs_f64() - 0.008).abs() < 1e-6, "{for_32:?}");
        assert_eq!(pooled_run_target(1000), MAX_CONTENDED_RUN);
    }

    #[test]
    fn untimed_samples_go_one_by_one_unless_tasks_are_known_to_cost_more() {
        assert_eq!(untimed_run_length(RUN_TARGET, 64, 16), 1);
        let long = Duration::from_millis(50);
        assert_eq!(untimed_run_length(long, 64, 16), 4);
        assert_eq!(untimed_run_length(long, 64, 5), 13);
        assert_eq!(untimed_run_length(long, 3, 16), 1);
        assert_eq!(untimed_run_length(long, 64, 0), 64.min(MAX_RUN));
    }
}
