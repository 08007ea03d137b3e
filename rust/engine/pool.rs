//! Worker threads: their loop, a pool that can grow while it runs (a
//! replacement for a worker stuck on a slow sample) and shrink back, and a
//! shutdown that never hangs on a stuck worker.

use std::any::Any;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use super::controller::{Resize, ResizeReason, Window};
use super::cpu::{available_cores, thread_cpu_time};
use super::error::EngineError;
use super::task::{Done, Finished, Task};
use super::task_clock::TaskClock;
use super::thread_state::WorkerSite;
use super::Outcome;

/// What a worker thread runs. The engine owns the threads; an implementation
/// only says what to do with each task.
pub trait WorkerHooks: Send + Sync + 'static {
    type Payload: Send + 'static;
    type Output: Send + 'static;
    /// Per-thread state, created on the worker thread by [`Self::init`].
    type State;

    /// Wraps a worker thread's whole life. The Python bindings keep one
    /// interpreter thread state here, so thread-locals survive between tasks.
    fn enter_thread(&self, worker_id: usize, body: &mut (dyn FnMut() + Send)) {
        let _ = worker_id;
        body()
    }

    /// Runs once on the worker thread before its first task.
    fn init(&self, worker_id: usize) -> Self::State;

    /// Runs one task.
    fn run(
        &self,
        state: &mut Self::State,
        epoch: u64,
        payload: Self::Payload,
    ) -> Outcome<Self::Output>;

    /// Runs one task, reporting into `clock` the time the worker spent
    /// paused, not working on it (see [`TaskClock::pause`]): that time
    /// neither counts toward the slow-sample timeout nor into the fetch
    /// times. The engine calls this one; by default it runs [`Self::run`]
    /// and reports no pause.
    fn run_timed(
        &self,
        state: &mut Self::State,
        epoch: u64,
        payload: Self::Payload,
        clock: &TaskClock,
    ) -> Outcome<Self::Output> {
        let _ = clock;
        self.run(state, epoch, payload)
    }
}

/// Where a worker hands each task it finished.
pub(crate) trait Deliver<O>: Send + Sync {
    /// Takes `done`; false once nothing takes results any more (the worker
    /// then leaves).
    fn deliver(&self, done: Done<O>) -> bool;
}

/// A queue the consumer (or a thread on its behalf) receives from.
impl<O: Send> Deliver<O> for Sender<Done<O>> {
    fn deliver(&self, done: Done<O>) -> bool {
        self.send(done).is_ok()
    }
}

/// A task a worker is running, as the timeout monitor sees it.
struct Busy {
    /// The task's sequence number.
    seq: u64,
    started: Instant,
    /// Its worker's pauses, which do not count toward the timeout.
    clock: TaskClock,
    samples: usize,
    flagged_slow: bool,
    /// Flagged slow and given a replacement (see `PoolState::replaced`).
    replaced: bool,
    /// Where it computes (its worker's thread or process), to tell
    /// computing from blocked.
    site: Arc<WorkerSite>,
    /// Its epoch ended while it ran: a replacement serves the next one.
    orphaned: bool,
}

/// The samples of a task that has run for `running`, prorated by the time a
/// task takes on average.
fn progress(running: Duration, task_time: Duration, samples: usize) -> f64 {
    if task_time.is_zero() {
        return 0.0;
    }
    let share = (running.as_secs_f64() / task_time.as_secs_f64()).min(1.0);
    samples as f64 * share
}

impl Busy {
    /// How long the task has worked up to `now` (its pauses left out), and
    /// the samples that time is for: the sample it is on, where its worker
    /// reports each (see [`TaskClock::begin_sample`]); else the whole task
    /// and its samples.
    fn worked(&self, now: Instant) -> (Duration, usize) {
        match self.clock.sample_worked(now) {
            Some(worked) => (worked, 1),
            None => self.worked_in_all(now),
        }
    }

    /// How long the whole task has worked up to `now` (its pauses left
    /// out), and its samples.
    fn worked_in_all(&self, now: Instant) -> (Duration, usize) {
        let worked = now
            .duration_since(self.started)
            .saturating_sub(self.clock.paused(now));
        (worked, self.samples)
    }
}

/// How often an idle worker checks whether the pool has shrunk past it: a
/// pool at rest should cost nothing measurable, and a shrink only needs to
/// take effect before the next epoch's work, not at once.
const IDLE_CHECK: Duration = Duration::from_millis(500);
/// A task flagged slow gets a replacement worker only once it has run this
/// many timeouts: the automatic timeout flags about a quarter of all
/// samples, and for work that merely varies (contention for the GIL or the
/// cores spreads its times) a thread per flagged sample only adds to the
/// contention — on 2 cores, 16 workers grew to 32 and ran at a tenth of
/// their speed. Flagged samples are deferred past their batch all the same;
/// a stuck one gets its replacement a few timeouts later.
const REPLACE_AFTER_TIMEOUTS: u32 = 4;
/// Most entries kept in the worker-count history (the oldest go first).
const MAX_HISTORY: usize = 4096;

/// Appends `entry`, dropping the oldest once `MAX_HISTORY` are kept.
fn push_bounded<T>(entries: &mut Vec<T>, entry: T) {
    if entries.len() == MAX_HISTORY {
        entries.remove(0);
    }
    entries.push(entry);
}

/// Worker bookkeeping, behind one lock: it changes once or twice per task.
struct PoolState {
    /// Threads running their loop.
    live: usize,
    /// Of those, how many have not yet entered it: a thread's start (its
    /// Python thread state, the dataset's per-worker set-up) can take
    /// milliseconds each while other workers hold the GIL.
    starting: usize,
    /// Of those, how many are running a task flagged slow.
    flagged: usize,
    /// Of those, how many were given a replacement: all but the ones
    /// computing while the pool has a worker per core (see
    /// `crate::engine::thread_state`), which wait for one while they compute.
    replaced: usize,
    /// The cores this process may run on.
    cores: usize,
    /// Of those, how many are still running a task of an ended epoch (and
    /// not flagged slow).
    orphaned: usize,
    /// How many workers should be free for fast tasks.
    target: usize,
    /// Most replacements for flagged workers.
    max_slow: usize,
    busy: HashMap<usize, Busy>,
    next_worker_id: usize,
    handles: Vec<JoinHandle<()>>,
    /// (time since the pool started, target) at the start and each change.
    history: Vec<(Duration, usize)>,
    /// The adaptive controller's changes, with why (at most `MAX_HISTORY`).
    resizes: Vec<Resize>,
    /// The count the adaptive controller stands by, once it judged a window.
    settled_workers: Option<usize>,
}

/// State shared by the consumer, the monitor and every worker thread.
pub(crate) struct PoolShared {
    /// Set once at shutdown: workers stop taking tasks.
    pub stop: AtomicBool,
    /// Set when the pool's size is fixed while running (`Pool::fix_target`):
    /// the adaptive controller stops resizing it.
    pub fixed: AtomicBool,
    /// The consumer's current epoch: workers skip tasks of older ones.
    pub epoch: AtomicU64,
    /// Samples of tasks run to completion (not cancelled), every epoch.
    pub samples_done: AtomicU64,
    /// Tasks run to completion, every epoch.
    pub tasks_done: AtomicU64,
    /// Nanoseconds workers spent running tasks, every epoch: wall time,
    /// pauses included, unlike `Done::elapsed`. The Python stats report it
    /// as the fetch time the GIL wait is a share of, and the monitor's mean
    /// task time, which it prorates running tasks' wall time by, comes
    /// from it.
    pub busy_nanos: AtomicU64,
    /// The workers' own CPU time inside the tasks of `busy_nanos`.
    pub cpu_nanos: AtomicU64,
    /// Of those, each worker thread's first task: its CPU time and samples.
    /// It carries one-off costs that are no sample's (the thread's first
    /// torch op, the process's first), which made cheap samples read as
    /// costly over the few a first judgement sees.
    pub first_task_cpu_nanos: AtomicU64,
    pub first_task_samples: AtomicU64,
    started: Instant,
    state: Mutex<PoolState>,
    a_worker_exited: Condvar,
    /// A worker started a task: wakes a monitor that sleeps while the pool
    /// is idle. Bounded to one, as one wake-up is all it needs.
    work_started: (Sender<()>, Receiver<()>),
    /// Tests: new threads ask for a stack no machine has, so spawning fails
    /// the way it does at a resource limit.
    #[cfg(test)]
    pub fail_spawns: AtomicBool,
}

impl PoolState {
    /// Workers the pool should have: the target, plus a replacement for
    /// each worker stuck on a slow task that was given one, up to
    /// `max_slow`, and for each still running a task of an ended epoch.
    fn wanted(&self) -> usize {
        self.target + self.replaced.min(self.max_slow) + self.orphaned
    }

    /// Counts the calling worker out when the pool has more workers than it
    /// wants; the caller must then leave its loop.
    fn retire_if_surplus(&mut self) -> bool {
        let surplus = self.live > self.wanted();
        if surplus {
            self.live -= 1;
        }
        surplus
    }
}

impl PoolShared {
    fn state(&self) -> MutexGuard<'_, PoolState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Counts a worker out of `starting` once it enters its loop, and out of
/// `live` when its loop ends, panic or not, unless it already counted itself
/// out when it retired; its thread ending before it entered the loop counts
/// it out of both.
struct LiveGuard {
    shared: Arc<PoolShared>,
    counted: bool,
    starting: bool,
}

impl LiveGuard {
    fn entered_loop(&mut self) {
        if std::mem::take(&mut self.starting) {
            self.shared.state().starting -= 1;
        }
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        {
            let mut state = self.shared.state();
            if std::mem::take(&mut self.starting) {
                state.starting -= 1;
            }
            if self.counted {
                state.live -= 1;
            }
        }
        self.shared.a_worker_exited.notify_all();
    }
}

/// The worker threads of one engine.
pub(crate) struct Pool<W: WorkerHooks> {
    pub shared: Arc<PoolShared>,
    hooks: Arc<W>,
    results: Arc<dyn Deliver<W::Output>>,
    /// The queue every worker takes from, when there is one: workers added
    /// while running take from it too.
    shared_tasks: Option<Receiver<Task<W::Payload>>>,
}

impl<W: WorkerHooks> Pool<W> {
    /// Starts one thread per task receiver; each hands its finished tasks to
    /// `results`. With a single receiver shared by all, the pool can grow.
    pub fn start(
        hooks: W,
        task_receivers: Vec<Receiver<Task<W::Payload>>>,
        results: Arc<dyn Deliver<W::Output>>,
    ) -> Result<Arc<Self>, EngineError> {
        let target = task_receivers.len();
        let shared_tasks = match task_receivers.first() {
            Some(first) if task_receivers.iter().all(|rx| rx.same_channel(first)) => {
                Some(first.clone())
            }
            _ => None,
        };
        let pool = Arc::new(Pool {
            shared: Arc::new(PoolShared {
                stop: AtomicBool::new(false),
                fixed: AtomicBool::new(false),
                epoch: AtomicU64::new(0),
                samples_done: AtomicU64::new(0),
                tasks_done: AtomicU64::new(0),
                busy_nanos: AtomicU64::new(0),
                cpu_nanos: AtomicU64::new(0),
                first_task_cpu_nanos: AtomicU64::new(0),
                first_task_samples: AtomicU64::new(0),
                started: Instant::now(),
                state: Mutex::new(PoolState {
                    live: 0,
                    starting: 0,
                    flagged: 0,
                    replaced: 0,
                    cores: available_cores(),
                    orphaned: 0,
                    target,
                    max_slow: 0,
                    busy: HashMap::new(),
                    next_worker_id: 0,
                    handles: Vec::with_capacity(target),
                    history: vec![(Duration::ZERO, target)],
                    resizes: Vec::new(),
                    settled_workers: None,
                }),
                a_worker_exited: Condvar::new(),
                work_started: bounded(1),
                #[cfg(test)]
                fail_spawns: AtomicBool::new(false),
            }),
            hooks: Arc::new(hooks),
            results,
            shared_tasks,
        });
        for tasks in task_receivers {
            let spawned = pool.spawn_worker(&mut pool.shared.state(), tasks);
            if let Err(err) = spawned {
                pool.shutdown(Duration::ZERO);
                return Err(err);
            }
        }
        Ok(pool)
    }

    fn spawn_worker(
        &self,
        state: &mut PoolState,
        tasks: Receiver<Task<W::Payload>>,
    ) -> Result<(), EngineError> {
        let worker_id = state.next_worker_id;
        let shared = self.shared.clone();
        let hooks = self.hooks.clone();
        let results = self.results.clone();
        #[allow(unused_mut)] // tests change it
        let mut builder = thread::Builder::new().name(format!("minato-worker-{worker_id}"));
        #[cfg(test)]
        if self.shared.fail_spawns.load(Ordering::Relaxed) {
            builder = builder.stack_size(1 << 50);
        }
        // The guard that counts the worker out is made on the new thread: a
        // spawn that fails drops the closure here, with the pool's lock
        // held, and dropping a guard would take that lock again.
        let spawned = builder.spawn(move || {
            let guard = LiveGuard {
                shared,
                counted: true,
                starting: true,
            };
            worker_main(worker_id, &*hooks, &tasks, &*results, guard)
        });
        let handle = spawned.map_err(|err| EngineError::Spawn(err.to_string()))?;
        state.live += 1;
        state.starting += 1;
        state.next_worker_id += 1;
        // Threads that retired have ended: joining them releases their
        // stacks (a thread neither joined nor detached keeps its own), so a
        // pool that keeps resizing holds only the threads it runs.
        let (ended, running) = std::mem::take(&mut state.handles)
            .into_iter()
            .partition::<Vec<_>, _>(JoinHandle::is_finished);
        state.handles = running;
        for thread in ended {
            let _ = thread.join();
        }
        state.handles.push(handle);
        Ok(())
    }

    /// Handles of threads started and not yet joined (tests).
    #[cfg(test)]
    pub fn unjoined_threads(&self) -> usize {
        self.shared.state().handles.len()
    }

    /// Threads currently running their loop.
    pub fn live_workers(&self) -> usize {
        self.shared.state().live
    }

    /// How far the running tasks not flagged slow have got, in samples: each
    /// counts its samples times the share of `task_time` it has run (at
    /// most all of them).
    pub fn samples_in_progress(&self, task_time: Duration) -> f64 {
        let now = Instant::now();
        let state = self.shared.state();
        state
            .busy
            .values()
            .filter(|busy| !busy.flagged_slow)
            .map(|busy| progress(now.duration_since(busy.started), task_time, busy.samples))
            .sum()
    }

    /// Whether a task not flagged slow that started before `at`, and no
    /// more than `within` before it, is still running.
    pub fn runs_a_fast_task_started_before(&self, at: Instant, within: Duration) -> bool {
        let state = self.shared.state();
        state.busy.values().any(|busy| {
            !busy.flagged_slow && busy.started < at && at.duration_since(busy.started) <= within
        })
    }

    /// How long task `seq` has worked so far (its pauses, such as waits
    /// for the GIL, left out), and its samples, while a worker runs it;
    /// None otherwise. See [`Busy::worked`].
    pub fn task_worked(&self, seq: u64) -> Option<(Duration, usize)> {
        let now = Instant::now();
        let state = self.shared.state();
        let busy = state.busy.values().find(|busy| busy.seq == seq)?;
        Some(busy.worked(now))
    }

    /// Workers started and not yet running their loop.
    pub fn starting_workers(&self) -> usize {
        self.shared.state().starting
    }

    /// Workers running a task not flagged slow.
    pub fn busy_on_fast_tasks(&self) -> usize {
        let state = self.shared.state();
        state.busy.len().saturating_sub(state.flagged)
    }

    /// No worker is running a task.
    pub fn is_idle(&self) -> bool {
        self.shared.state().busy.is_empty()
    }

    /// Receives one message after a worker starts a task (see `is_idle`).
    pub fn work_started(&self) -> &Receiver<()> {
        &self.shared.work_started.1
    }

    /// How many workers are kept free for fast tasks.
    pub fn target(&self) -> usize {
        self.shared.state().target
    }

    /// Whether the pool can be resized: its workers share one task queue.
    pub fn resizable(&self) -> bool {
        self.shared_tasks.is_some()
    }

    /// (time since the pool started, target) at the start and each change.
    pub fn history(&self) -> Vec<(Duration, usize)> {
        self.shared.state().history.clone()
    }

    /// The adaptive controller's changes of the target, with why.
    pub fn resizes(&self) -> Vec<Resize> {
        self.shared.state().resizes.clone()
    }

    /// The count the adaptive controller stands by now (see
    /// `Controller::settled_workers`), once it judged a window; None while
    /// the pool is fixed (the controller then no longer sizes it).
    pub fn settled_workers(&self) -> Option<usize> {
        if self.is_fixed() {
            return None;
        }
        self.shared.state().settled_workers
    }

    pub(crate) fn set_settled_workers(&self, workers: usize) {
        self.shared.state().settled_workers = Some(workers);
    }

    /// Fixes the pool at `target` workers for the rest of its life: the
    /// adaptive controller no longer resizes it (the workers' kind changed
    /// to one whose start costs more, see the Python `worker_method`).
    pub fn fix_target(&self, target: usize) {
        self.shared.fixed.store(true, Ordering::Release);
        self.set_target(target);
    }

    /// Lets the adaptive controller resize the pool again after
    /// [`Self::fix_target`] (the workers stayed threads after all).
    pub fn release_target(&self) {
        self.shared.fixed.store(false, Ordering::Release);
    }

    /// Whether [`Self::fix_target`] was called, and not released since.
    pub fn is_fixed(&self) -> bool {
        self.shared.fixed.load(Ordering::Acquire)
    }

    /// Sets how many workers are kept free for fast tasks (at least one).
    /// Growing starts threads at once; shrinking lets surplus workers leave
    /// after their current task, or within [`IDLE_CHECK`] when idle. A pool
    /// whose workers own their queues keeps its size.
    pub fn set_target(&self, target: usize) {
        self.change_target(target, None);
    }

    /// [`Self::set_target`], for the adaptive controller: the change is
    /// recorded with its reason and the window that decided it.
    pub fn resize(&self, target: usize, reason: ResizeReason, window: Window) {
        self.change_target(target, Some((reason, window)));
    }

    fn change_target(&self, target: usize, why: Option<(ResizeReason, Window)>) {
        let Some(tasks) = &self.shared_tasks else {
            return;
        };
        let mut state = self.shared.state();
        let target = target.max(1);
        if target != state.target {
            state.target = target;
            let at = self.shared.started.elapsed();
            push_bounded(&mut state.history, (at, target));
            if let Some((reason, window)) = why {
                let resize = Resize {
                    at,
                    workers: target,
                    reason,
                    window,
                };
                push_bounded(&mut state.resizes, resize);
            }
        }
        self.start_wanted(&mut state, tasks);
    }

    /// Starts workers on the shared queue until the pool has as many as it
    /// wants (or no thread can be started); returns how many it started.
    fn start_wanted(&self, state: &mut PoolState, tasks: &Receiver<Task<W::Payload>>) -> usize {
        let mut started = 0;
        while state.live < state.wanted() && !self.shared.stop.load(Ordering::Acquire) {
            if self.spawn_worker(state, tasks.clone()).is_err() {
                break;
            }
            started += 1;
        }
        started
    }

    /// Takes the tasks still queued off the shared queue (an epoch ended:
    /// none of them would run); returns how many.
    pub fn drain_queued(&self) -> usize {
        self.take_queued().len()
    }

    /// Takes the tasks still queued off the shared queue, in the order they
    /// were sent (none where each worker has a queue of its own).
    pub fn take_queued(&self) -> Vec<Task<W::Payload>> {
        self.shared_tasks
            .as_ref()
            .map_or_else(Vec::new, |tasks| tasks.try_iter().collect())
    }

    /// The epoch ended while these workers run its tasks: each gets a
    /// replacement for the next epoch, and leaves once its task is done,
    /// so a stuck sample never holds the next epoch up. Returns how many
    /// replacements were started.
    pub fn orphan_running(&self) -> usize {
        let Some(tasks) = &self.shared_tasks else {
            return 0;
        };
        let mut state = self.shared.state();
        let mut orphaned = 0;
        for busy in state.busy.values_mut() {
            // A slow task that got no replacement (it was computing) gets one now.
            if !busy.replaced && !busy.orphaned {
                busy.orphaned = true;
                orphaned += 1;
            }
        }
        state.orphaned += orphaned;
        self.start_wanted(&mut state, tasks)
    }

    /// Flags every task that has run past `timeout` per sample, its pauses
    /// (see [`TaskClock`]) not counted, as slow, and starts a replacement
    /// worker for each that has run [`REPLACE_AFTER_TIMEOUTS`] times as
    /// long, up to `max_slow` of them, so that `target` workers stay free
    /// for fast tasks — except for a worker that is computing
    /// while the pool has a worker per core: another thread would only take
    /// a core from the others. It gets one once it blocks (a later call
    /// looks again). A flagged worker finishes its task and then leaves if
    /// the pool is larger than it needs to be. Returns how many
    /// replacements were started.
    pub fn flag_overdue(&self, timeout: Duration, max_slow: usize) -> usize {
        let Some(tasks) = &self.shared_tasks else {
            return 0;
        };
        let mut state = self.shared.state();
        let now = Instant::now();
        let mut newly_flagged = 0;
        // Flagged tasks due a replacement, still without one.
        let mut unreplaced: Vec<(usize, Instant, Arc<WorkerSite>)> = Vec::new();
        for (&worker, busy) in state.busy.iter_mut() {
            // The whole run against its samples' bound, not the sample it
            // is on (which decides where its batch waits, see `task_worked`):
            // on busy cores a quarter of all samples pass the automatic
            // timeout, and judged one by one, runs were flagged twice as
            // often, each flag a step toward a replacement thread that only
            // adds to the contention (benchmarks/RESULTS.md).
            let (worked, samples) = busy.worked_in_all(now);
            let limit = timeout.saturating_mul(samples.max(1) as u32);
            if !busy.flagged_slow && worked > limit {
                busy.flagged_slow = true;
                newly_flagged += 1;
            }
            if busy.flagged_slow
                && !busy.replaced
                && !busy.orphaned
                && worked > limit.saturating_mul(REPLACE_AFTER_TIMEOUTS)
            {
                unreplaced.push((worker, busy.started, busy.site.clone()));
            }
        }
        state.flagged += newly_flagged;
        state.max_slow = max_slow;
        if !unreplaced.is_empty() {
            let full = state.live >= state.cores;
            // The kernel is asked with the lock released: workers finishing
            // tasks need it.
            drop(state);
            let replace: Vec<(usize, Instant)> = unreplaced
                .into_iter()
                .filter(|(_, _, site)| !(full && site.is_computing() == Some(true)))
                .map(|(worker, started, _)| (worker, started))
                .collect();
            state = self.shared.state();
            for (worker, started) in replace {
                // Still the same task: it may have ended meanwhile.
                if let Some(busy) = state.busy.get_mut(&worker) {
                    if busy.started == started && !busy.replaced && !busy.orphaned {
                        busy.replaced = true;
                        state.replaced += 1;
                    }
                }
            }
        }
        self.start_wanted(&mut state, tasks)
    }

    /// Stops the workers and joins them, waiting at most `grace` for a worker
    /// still inside a task (user code cannot be interrupted). Returns how many
    /// threads were left running; they exit on their own after their task.
    /// The caller must first close the task channels so idle workers wake up.
    pub fn shutdown(&self, grace: Duration) -> usize {
        self.shared.stop.store(true, Ordering::Release);
        let me = thread::current().id();
        let mut state = self.shared.state();
        // A worker can end up here itself (a garbage collection run on a
        // worker thread drops the engine): it waits for the others only.
        let on_worker = state
            .handles
            .iter()
            .any(|handle| handle.thread().id() == me);
        let others_live = usize::from(on_worker);
        let deadline = Instant::now() + grace;
        while state.live > others_live {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .shared
                .a_worker_exited
                .wait_timeout(state, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        let all_exited = state.live == others_live;
        let handles = std::mem::take(&mut state.handles);
        drop(state);
        let mut left_running = 0;
        for handle in handles {
            // Joining itself would deadlock; it leaves its loop when this returns.
            if handle.thread().id() == me {
                continue;
            }
            if all_exited || handle.is_finished() {
                let _ = handle.join();
            } else {
                left_running += 1;
            }
        }
        left_running
    }
}

fn worker_main<W: WorkerHooks>(
    worker_id: usize,
    hooks: &W,
    tasks: &Receiver<Task<W::Payload>>,
    results: &dyn Deliver<W::Output>,
    mut live: LiveGuard,
) {
    let shared = live.shared.clone();
    let mut retired = false;
    let clock = TaskClock::default();
    let site = WorkerSite::register_current();
    hooks.enter_thread(worker_id, &mut || {
        let mut state = catch_unwind(AssertUnwindSafe(|| hooks.init(worker_id)))
            .map_err(|payload| panic_message(&*payload));
        live.entered_loop();
        let mut first_task = true;
        loop {
            let task = match tasks.recv_timeout(IDLE_CHECK) {
                Ok(task) => task,
                Err(RecvTimeoutError::Timeout) => {
                    // Idle: leave if the pool shrank.
                    if shared.state().retire_if_surplus() {
                        retired = true;
                        break;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            if shared.stop.load(Ordering::Acquire) {
                break;
            }
            // Reset before the monitor can see the task (below).
            clock.reset();
            let started = Instant::now();
            let cpu_started = thread_cpu_time();
            let finished = if task.epoch != shared.epoch.load(Ordering::Acquire) {
                Finished::Cancelled
            } else {
                let busy = Busy {
                    seq: task.seq,
                    started,
                    clock: clock.clone(),
                    samples: task.samples,
                    flagged_slow: false,
                    replaced: false,
                    site: site.clone(),
                    orphaned: false,
                };
                shared.state().busy.insert(worker_id, busy);
                // Full means a wake-up is already waiting.
                let _ = shared.work_started.0.try_send(());
                match &mut state {
                    Err(message) => Finished::Panicked(message.clone()),
                    Ok(state) => catch_unwind(AssertUnwindSafe(|| {
                        hooks.run_timed(state, task.epoch, task.payload, &clock)
                    }))
                    .map_or_else(
                        |payload| Finished::Panicked(panic_message(&*payload)),
                        Finished::Ran,
                    ),
                }
            };
            let ended = Instant::now();
            let wall = ended.duration_since(started);
            if matches!(finished, Finished::Ran(_)) {
                shared
                    .samples_done
                    .fetch_add(task.samples as u64, Ordering::Relaxed);
                shared.tasks_done.fetch_add(1, Ordering::Relaxed);
                let nanos = u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX);
                shared.busy_nanos.fetch_add(nanos, Ordering::Relaxed);
                let cpu = thread_cpu_time().saturating_sub(cpu_started);
                let cpu = u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX);
                shared.cpu_nanos.fetch_add(cpu, Ordering::Relaxed);
                if std::mem::take(&mut first_task) {
                    shared
                        .first_task_cpu_nanos
                        .fetch_add(cpu, Ordering::Relaxed);
                    shared
                        .first_task_samples
                        .fetch_add(task.samples as u64, Ordering::Relaxed);
                }
            }
            let slow = {
                let mut pool = shared.state();
                let busy = pool.busy.remove(&worker_id);
                let flagged = busy.as_ref().is_some_and(|busy| busy.flagged_slow);
                if flagged {
                    pool.flagged -= 1;
                }
                if busy.as_ref().is_some_and(|busy| busy.replaced) {
                    pool.replaced -= 1;
                }
                if busy.is_some_and(|busy| busy.orphaned) {
                    pool.orphaned -= 1;
                }
                // A replacement took a slow worker's place, or the pool
                // shrank: surplus workers go.
                retired = pool.retire_if_surplus();
                flagged
            };
            let paused = clock.paused(ended).min(wall);
            let done = Done {
                seq: task.seq,
                epoch: task.epoch,
                worker: worker_id,
                samples: task.samples,
                elapsed: wall - paused,
                paused,
                started,
                ended,
                slow,
                finished,
            };
            if !results.deliver(done) || retired {
                break;
            }
        }
    });
    live.counted = !retired;
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hooks whose per-thread set-up waits until `released`.
    struct SlowStart {
        released: Arc<AtomicBool>,
    }

    impl WorkerHooks for SlowStart {
        type Payload = ();
        type Output = ();
        type State = ();

        fn init(&self, _worker_id: usize) {
            while !self.released.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(1));
            }
        }

        fn run(&self, _state: &mut (), _epoch: u64, _payload: ()) -> Outcome<()> {
            Outcome::Value(())
        }
    }

    #[test]
    fn workers_count_as_starting_until_their_set_up_is_done() {
        let released = Arc::new(AtomicBool::new(false));
        let hooks = SlowStart {
            released: released.clone(),
        };
        let (task_tx, tasks) = crossbeam_channel::unbounded();
        let (results, _results_rx) = crossbeam_channel::unbounded();
        let pool = Pool::start(hooks, vec![tasks.clone(), tasks], Arc::new(results)).unwrap();
        assert_eq!(pool.starting_workers(), 2);
        pool.set_target(5);
        assert_eq!(pool.starting_workers(), 5, "added ones too");
        released.store(true, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.starting_workers() > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(pool.starting_workers(), 0);
        assert_eq!(pool.live_workers(), 5);
        drop(task_tx); // the engine's way to end its workers' loops
        assert_eq!(pool.shutdown(Duration::from_secs(10)), 0);
    }

    #[test]
    fn progress_is_prorated_and_capped() {
        let ms = Duration::from_millis;
        assert_eq!(progress(ms(1), ms(4), 2), 0.5);
        assert_eq!(progress(ms(9), ms(4), 3), 3.0);
        assert_eq!(progress(ms(9), Duration::ZERO, 3), 0.0);
    }
}
