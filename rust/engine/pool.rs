//! Worker threads: their loop, and a shutdown that never hangs on a stuck one.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::error::EngineError;
use super::task::{Done, Finished, Task};
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
}

/// State shared by the consumer and every worker thread.
pub(crate) struct PoolShared {
    /// Set once at shutdown: workers stop taking tasks.
    pub stop: AtomicBool,
    /// The consumer's current epoch: workers skip tasks of older ones.
    pub epoch: AtomicU64,
    /// Worker threads still running their loop.
    live: Mutex<usize>,
    all_exited: Condvar,
}

/// Decrements the live count when a worker's loop ends, panic or not.
struct LiveGuard(Arc<PoolShared>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        let mut live = self.0.live.lock().unwrap_or_else(|e| e.into_inner());
        *live -= 1;
        if *live == 0 {
            self.0.all_exited.notify_all();
        }
    }
}

/// The worker threads of one engine.
pub(crate) struct Pool {
    pub shared: Arc<PoolShared>,
    handles: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts one thread per task receiver; each sends its finished tasks to `results`.
    pub fn spawn<W: WorkerHooks>(
        hooks: Arc<W>,
        task_receivers: Vec<Receiver<Task<W::Payload>>>,
        results: Sender<Done<W::Output>>,
    ) -> Result<Self, EngineError> {
        let shared = Arc::new(PoolShared {
            stop: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            live: Mutex::new(0),
            all_exited: Condvar::new(),
        });
        let mut pool = Pool {
            shared,
            handles: Vec::with_capacity(task_receivers.len()),
        };
        for (worker_id, tasks) in task_receivers.into_iter().enumerate() {
            *pool.shared.live.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            let guard = LiveGuard(pool.shared.clone());
            let hooks = hooks.clone();
            let results = results.clone();
            let spawned = thread::Builder::new()
                .name(format!("minato-worker-{worker_id}"))
                .spawn(move || worker_main(worker_id, &*hooks, &tasks, &results, guard));
            match spawned {
                Ok(handle) => pool.handles.push(handle),
                Err(err) => {
                    // The closure (and its guard) was dropped, so the count is right.
                    pool.shutdown(Duration::ZERO);
                    return Err(EngineError::Spawn(err.to_string()));
                }
            }
        }
        Ok(pool)
    }

    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Stops the workers and joins them, waiting at most `grace` for a worker
    /// still inside a task (user code cannot be interrupted). Returns how many
    /// threads were left running; they exit on their own after their task.
    /// The caller must first close the task channels so idle workers wake up.
    pub fn shutdown(&mut self, grace: Duration) -> usize {
        self.shared.stop.store(true, Ordering::Release);
        let me = thread::current().id();
        // A worker can end up here itself (a garbage collection run on a
        // worker thread drops the engine): it waits for the others only.
        let on_worker = self.handles.iter().any(|handle| handle.thread().id() == me);
        let others_live = usize::from(on_worker);
        let deadline = Instant::now() + grace;
        let all_exited = {
            let mut live = self.shared.live.lock().unwrap_or_else(|e| e.into_inner());
            while *live > others_live {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                live = self
                    .shared
                    .all_exited
                    .wait_timeout(live, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            *live == others_live
        };
        let mut left_running = 0;
        for handle in self.handles.drain(..) {
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
    results: &Sender<Done<W::Output>>,
    live: LiveGuard,
) {
    let shared = live.0.clone();
    hooks.enter_thread(worker_id, &mut || {
        let mut state = catch_unwind(AssertUnwindSafe(|| hooks.init(worker_id)))
            .map_err(|payload| panic_message(&*payload));
        while let Ok(task) = tasks.recv() {
            if shared.stop.load(Ordering::Acquire) {
                break;
            }
            let finished = if task.epoch != shared.epoch.load(Ordering::Acquire) {
                Finished::Cancelled
            } else {
                match &mut state {
                    Err(message) => Finished::Panicked(message.clone()),
                    Ok(state) => catch_unwind(AssertUnwindSafe(|| {
                        hooks.run(state, task.epoch, task.payload)
                    }))
                    .map_or_else(
                        |payload| Finished::Panicked(panic_message(&*payload)),
                        Finished::Ran,
                    ),
                }
            };
            let done = Done {
                seq: task.seq,
                epoch: task.epoch,
                worker: worker_id,
                finished,
            };
            if results.send(done).is_err() {
                break;
            }
        }
    });
    drop(live);
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}
