//! The engine's background thread: it flags tasks that run past the
//! slow-sample timeout and, when adaptive, resizes the worker pool.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, RecvTimeoutError, Sender};

use super::consumer_steps::ConsumerSteps;
use super::controller::{Controller, ControllerConfig, Window};
use super::cpu::{available_cores, process_cpu_time, CpuSampler};
use super::error::EngineError;
use super::pool::{Pool, WorkerHooks};
use super::stats::Occupancy;

/// The timeout the monitor applies, in nanoseconds; 0 means none yet.
pub(crate) type SharedTimeout = Arc<AtomicU64>;

pub(crate) fn store_timeout(shared: &AtomicU64, timeout: Option<Duration>) {
    let nanos = timeout.map_or(0, |t| {
        u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(1)
    });
    shared.store(nanos, Ordering::Release);
}

fn load_timeout(shared: &AtomicU64) -> Option<Duration> {
    match shared.load(Ordering::Acquire) {
        0 => None,
        nanos => Some(Duration::from_nanos(nanos)),
    }
}

/// Checks the running tasks a few times per timeout period.
fn tick_for(timeout: Option<Duration>) -> Duration {
    timeout.map_or(Duration::from_millis(20), |t| {
        (t / 4).clamp(Duration::from_millis(1), Duration::from_millis(20))
    })
}

/// While no task runs there is nothing to flag or measure: the monitor
/// sleeps until a worker starts one, waking this often regardless.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// What the consumer shows of its needs: the ready queue's occupancy when
/// it asks, and its steps between asks.
pub(crate) type ConsumerSignals = (Arc<Occupancy>, Arc<ConsumerSteps>);

/// What the monitor watches for.
pub(crate) struct MonitorConfig {
    /// The slow-sample timeout and the most replacements for slow workers.
    pub slow_samples: Option<(SharedTimeout, usize)>,
    /// Resize the pool within these bounds.
    pub adaptive: Option<ControllerConfig>,
}

/// A window lasts at least this long...
const MIN_WINDOW: Duration = Duration::from_millis(5);
/// ...and two mean task durations, so that every worker finishes tasks in it...
const TASKS_PER_WINDOW: u32 = 2;
/// ...and sees this many samples finish per worker (fewer make the rate a
/// matter of where the window's edges fell), unless it reaches the maximum.
const SAMPLES_PER_WORKER: u64 = 2;
const MIN_SAMPLES: u64 = 8;
const MAX_WINDOW: Duration = Duration::from_secs(1);

/// The pool's running totals at the start of a window.
#[derive(Clone, Copy)]
struct Mark {
    at: Instant,
    samples: u64,
    tasks: u64,
    busy_nanos: u64,
    cpu_nanos: u64,
    /// The whole process's CPU time, where its clock can be read, for the
    /// marks a window starts or ends at (see `with_process_cpu`).
    process_cpu: Option<Duration>,
}

impl Mark {
    /// The pool's totals now, without the process's CPU time: the monitor
    /// looks several times a window, and that clock sums every thread's.
    fn now<W: WorkerHooks>(pool: &Pool<W>) -> Self {
        let shared = &pool.shared;
        Mark {
            at: Instant::now(),
            samples: shared.samples_done.load(Ordering::Relaxed),
            tasks: shared.tasks_done.load(Ordering::Relaxed),
            busy_nanos: shared.busy_nanos.load(Ordering::Relaxed),
            cpu_nanos: shared.cpu_nanos.load(Ordering::Relaxed),
            process_cpu: None,
        }
    }

    /// This mark, with the process's CPU time read now: a window starts or
    /// ends at it.
    fn with_process_cpu(self) -> Self {
        Mark {
            process_cpu: process_cpu_time(),
            ..self
        }
    }
}

/// The adaptive half of the monitor: measures windows, asks the controller.
struct Adapter {
    controller: Controller,
    cpu: CpuSampler,
    occupancy: Arc<Occupancy>,
    steps: Arc<ConsumerSteps>,
    start: Mark,
    /// Mean task duration, from the last window that finished tasks.
    task_time: Duration,
    /// The window after a resize only lets the new count take effect: it is
    /// not measured, or a step would be judged on a pool still starting.
    /// So is the first one: the pool's first workers are starting then, and
    /// a loop waiting for its first batch would read as starving.
    settling: bool,
    /// How far running tasks had got, in samples, when the window started.
    start_progress: f64,
    /// The cores this process may run on.
    cores: f64,
}

impl Adapter {
    fn new(controller: Controller, signals: ConsumerSignals, start: Mark) -> Self {
        let (occupancy, steps) = signals;
        Adapter {
            controller,
            cpu: CpuSampler::new(),
            occupancy,
            steps,
            start,
            task_time: Duration::ZERO,
            settling: true,
            start_progress: 0.0,
            cores: available_cores() as f64,
        }
    }

    /// Checks often enough that a window ends within a quarter of a task
    /// of its due time: each resize step is a settling window and a
    /// measured one, so late ends slow the ramp to a good count.
    fn tick_period(&self) -> Duration {
        (self.task_time / 4).clamp(Duration::from_millis(1), MIN_WINDOW)
    }

    /// Starts a fresh window after a rest: one that spanned it would
    /// measure the rest, not the pool.
    fn restart<W: WorkerHooks>(&mut self, pool: &Pool<W>) {
        self.start = Mark::now(pool).with_process_cpu();
        self.start_progress = 0.0;
        self.settling = false;
        self.occupancy.take_window();
        self.steps.take_window();
    }

    /// The process's CPU use since the window started, as a share of its
    /// cores: from its clock where it has one (any window, the first one
    /// included), else from the sampler.
    fn process_cpu_use(&mut self, now: &Mark, elapsed: Duration) -> Option<f64> {
        match (self.start.process_cpu, now.process_cpu) {
            (Some(before), Some(after)) if !elapsed.is_zero() => {
                let used = after.saturating_sub(before).as_secs_f64();
                Some((used / (elapsed.as_secs_f64() * self.cores)).clamp(0.0, 1.0))
            }
            _ => self.cpu.usage(),
        }
    }

    fn tick<W: WorkerHooks>(&mut self, pool: &Pool<W>) {
        let now = Mark::now(pool);
        let elapsed = now.at.duration_since(self.start.at);
        let finished = now.samples.saturating_sub(self.start.samples);
        let tasks = now.tasks.saturating_sub(self.start.tasks);
        let busy = now.busy_nanos.saturating_sub(self.start.busy_nanos);
        // The tasks finished so far in this window tell its length: after
        // the warm-up, or a resize that changed how many samples a task
        // gets, the last window's tasks are of another shape (the warm-up's
        // single samples made windows shorter than the runs that followed,
        // which not every worker then finished one of).
        let task_time = busy
            .checked_div(tasks)
            .map_or(self.task_time, Duration::from_nanos);
        if self.settling {
            // Settled once as many workers as the pool should have are on
            // a task (after a shrink, once the surplus ones have finished
            // theirs: meanwhile fewer tasks are issued, and a window judged
            // then took a good step back), or, when tasks are scarce, after
            // one task's time; never while added workers are still starting
            // (threads started beside as many busy ones take many
            // milliseconds to start on 2 cores).
            let at_target = pool.busy_on_fast_tasks() == pool.target();
            let one_task = MIN_WINDOW.max(self.task_time).min(MAX_WINDOW);
            let starting = pool.starting_workers() > 0 && elapsed < MAX_WINDOW;
            if starting || (!at_target && elapsed < one_task) {
                return;
            }
        } else if elapsed
            < MIN_WINDOW
                .max(task_time * TASKS_PER_WINDOW)
                .max(self.steps.mean().unwrap_or_default())
                .min(MAX_WINDOW)
        {
            // A window also spans one of the loop's steps, so that every
            // growth step is judged on what it did to the loop too.
            return;
        } else if elapsed < MAX_WINDOW
            && pool.runs_a_fast_task_started_before(self.start.at, MAX_WINDOW)
        {
            // ...and the tasks that were running at its start: where task
            // times have a long tail, the mean of the tasks finished so far
            // is that of the short ones, and a window of a few of them
            // measures workers that have not yet met a long one (at the
            // start, or after a growth step, every worker is fresh: such
            // windows judged a pool of 12 at more than its steady rate, and
            // a doubling was taken back against it). Not one that had run
            // for a whole window already: a sample that hangs, unflagged
            // without a sample timeout, would make every window the longest.
            return;
        }
        self.task_time = task_time;
        if self.settling {
            self.settling = false;
            self.occupancy.take_window();
            self.steps.take_window();
            self.start = now.with_process_cpu();
            self.start_progress = pool.samples_in_progress(self.task_time);
            return;
        }
        let workers = self.controller.workers() as u64;
        let enough = (SAMPLES_PER_WORKER * workers).max(MIN_SAMPLES);
        if finished < enough && elapsed < MAX_WINDOW {
            return;
        }
        let now = now.with_process_cpu();
        // Counting only finished samples, a window's edges fall mid-task for
        // every worker: ±1 task each, too noisy to tell a 10% gain at 20
        // workers. Counting the running tasks' progress at both edges too
        // takes that noise out.
        let progress = pool.samples_in_progress(self.task_time);
        let samples = (finished as f64 + progress - self.start_progress).max(0.0);
        let consumer = self.steps.take_window();
        let cpu = now.cpu_nanos.saturating_sub(self.start.cpu_nanos);
        let window = Window {
            throughput: samples / elapsed.as_secs_f64(),
            occupancy: self.occupancy.take_window(),
            cpu: self.process_cpu_use(&now, elapsed),
            compute: (busy > 0).then(|| cpu as f64 / busy as f64),
            step: consumer.step,
            wait: consumer.wait,
            busy_workers: Some(busy as f64 / elapsed.as_nanos().max(1) as f64),
        };
        let decided = self.controller.observe(window);
        pool.set_settled_workers(self.controller.settled_workers());
        if pool.is_fixed() {
            // The pool's size was fixed meanwhile: measure, never resize.
        } else if decided != pool.target() {
            match self.controller.reason() {
                Some(reason) => pool.resize(decided, reason, window),
                None => pool.set_target(decided),
            }
            self.settling = true;
        }
        self.start = now;
        self.start_progress = progress;
    }
}

#[derive(Debug, PartialEq)]
enum Rest {
    /// Tasks were running, or the pool rested briefly (between two of the
    /// consumer's requests): the window goes on.
    Busy,
    /// The pool rested longer than a window lasts: the loop stopped asking.
    Rested,
    Stop,
}

/// Waits while no worker runs a task, so that a loader at rest (between
/// epochs, or a loop that stopped asking) costs no CPU.
fn rest_while_idle<W: WorkerHooks>(
    pool: &Pool<W>,
    stopped: &Receiver<()>,
    idle_tick: Duration,
) -> Rest {
    let began = Instant::now();
    loop {
        // A wake-up left from a task that has ended would cut the next
        // rest short: drop it before looking.
        while pool.work_started().try_recv().is_ok() {}
        if !pool.is_idle() {
            return if began.elapsed() >= MAX_WINDOW {
                Rest::Rested
            } else {
                Rest::Busy
            };
        }
        select! {
            recv(stopped) -> _ => return Rest::Stop,
            recv(pool.work_started()) -> _ => {}
            default(idle_tick) => {}
        }
    }
}

/// A running monitor; stopped and joined on drop.
pub(crate) struct Monitor {
    stop: Option<Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts the thread, or nothing when there is nothing to watch.
    pub fn start<W: WorkerHooks>(
        pool: Arc<Pool<W>>,
        config: MonitorConfig,
        signals: ConsumerSignals,
    ) -> Result<Self, EngineError> {
        let adaptive = config.adaptive.filter(|_| pool.resizable());
        if config.slow_samples.is_none() && adaptive.is_none() {
            return Ok(Monitor {
                stop: None,
                handle: None,
            });
        }
        let mut adapter = adaptive.map(|controller| {
            let controller = Controller::new(controller, pool.target());
            Adapter::new(controller, signals, Mark::now(&pool).with_process_cpu())
        });
        let slow_samples = config.slow_samples;
        let (stop, stopped) = bounded::<()>(0);
        let handle = thread::Builder::new()
            .name("minato-monitor".to_owned())
            .spawn(move || loop {
                match rest_while_idle(&pool, &stopped, IDLE_TICK) {
                    Rest::Stop => return,
                    Rest::Rested => {
                        if let Some(adapter) = &mut adapter {
                            adapter.restart(&pool);
                        }
                    }
                    Rest::Busy => {}
                }
                let timeout = slow_samples
                    .as_ref()
                    .and_then(|(shared, _)| load_timeout(shared));
                let mut tick = tick_for(timeout);
                if let Some(adapter) = &adapter {
                    tick = tick.min(adapter.tick_period());
                }
                match stopped.recv_timeout(tick) {
                    Err(RecvTimeoutError::Timeout) => {
                        if let (Some(timeout), Some((_, max_slow))) = (timeout, &slow_samples) {
                            pool.flag_overdue(timeout, *max_slow);
                        }
                        if let Some(adapter) = &mut adapter {
                            adapter.tick(&pool);
                        }
                    }
                    _ => return,
                }
            })
            .map_err(|err| EngineError::Spawn(err.to_string()))?;
        Ok(Monitor {
            stop: Some(stop),
            handle: Some(handle),
        })
    }

    pub fn stop(&mut self) {
        self.stop.take();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::super::task::{Outcome, Task};
    use super::*;

    #[test]
    fn the_shared_timeout_round_trips_and_zero_means_none() {
        let shared = AtomicU64::new(0);
        assert_eq!(load_timeout(&shared), None);
        store_timeout(&shared, Some(Duration::from_millis(7)));
        assert_eq!(load_timeout(&shared), Some(Duration::from_millis(7)));
        store_timeout(&shared, Some(Duration::ZERO));
        assert_eq!(load_timeout(&shared), Some(Duration::from_nanos(1)));
        store_timeout(&shared, None);
        assert_eq!(load_timeout(&shared), None);
    }

    #[test]
    fn the_tick_is_a_quarter_timeout_within_bounds() {
        assert_eq!(tick_for(None), Duration::from_millis(20));
        assert_eq!(
            tick_for(Some(Duration::from_millis(8))),
            Duration::from_millis(2)
        );
        assert_eq!(
            tick_for(Some(Duration::from_micros(10))),
            Duration::from_millis(1)
        );
        assert_eq!(
            tick_for(Some(Duration::from_secs(2))),
            Duration::from_millis(20)
        );
    }

    /// Runs each task until the test releases it.
    struct Gated {
        release: Receiver<()>,
    }

    impl WorkerHooks for Gated {
        type Payload = ();
        type Output = ();
        type State = ();

        fn init(&self, _worker_id: usize) {}

        fn run(&self, _state: &mut (), _epoch: u64, _payload: ()) -> Outcome<()> {
            let _ = self.release.recv();
            Outcome::Value(())
        }
    }

    #[test]
    fn a_resting_monitor_wakes_when_a_worker_starts_a_task() {
        let (release, gate) = bounded::<()>(0);
        let (submit, tasks) = bounded::<Task<()>>(1);
        let (results, finished) = bounded(1);
        let pool = Pool::start(Gated { release: gate }, vec![tasks], Arc::new(results)).unwrap();
        let (_stop, stopped) = bounded::<()>(0);
        // A tick of an hour: only the wake-up can end this rest.
        let resting = {
            let pool = pool.clone();
            thread::spawn(move || rest_while_idle(&pool, &stopped, Duration::from_secs(3600)))
        };
        thread::sleep(Duration::from_millis(50));
        assert!(!resting.is_finished(), "an idle pool rests");
        let task = Task {
            seq: 0,
            epoch: 0,
            samples: 1,
            payload: (),
        };
        submit.send(task).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !resting.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert!(resting.is_finished(), "the task's start woke the monitor");
        // The rest was short: the window it interrupted goes on.
        assert_eq!(resting.join().unwrap(), Rest::Busy);
        release.send(()).unwrap();
        finished.recv_timeout(Duration::from_secs(10)).unwrap();
        drop(submit);
        pool.shutdown(Duration::from_secs(10));
    }

    #[test]
    fn a_resting_monitor_stops_at_once() {
        let (_release, gate) = bounded::<()>(0);
        let (submit, tasks) = bounded::<Task<()>>(1);
        let (results, _finished) = bounded(1);
        let pool = Pool::start(Gated { release: gate }, vec![tasks], Arc::new(results)).unwrap();
        let (stop, stopped) = bounded::<()>(0);
        let resting = {
            let pool = pool.clone();
            thread::spawn(move || rest_while_idle(&pool, &stopped, Duration::from_secs(3600)))
        };
        drop(stop);
        assert_eq!(resting.join().unwrap(), Rest::Stop);
        drop(submit);
        pool.shutdown(Duration::from_secs(10));
    }
}
