//! The worker side of an engine as one handle: the pool, its task queues and
//! its result queue, with epochs and shutdown. Both engines build on it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError};

use super::consumer_steps::ConsumerSteps;
use super::dispatch::{Dispatch, Dispatcher};
use super::error::EngineError;
use super::look::receive;
use super::monitor::{Monitor, MonitorConfig};
use super::pool::{Deliver, Pool, WorkerHooks};
use super::stats::{Ask, ConsumerWaiting, EngineStats, Occupancy};
use super::task::{Done, Task};

/// Where the workers put the tasks they finish.
pub(crate) enum ResultsTo<O> {
    /// A queue the engine receives from ([`Workers::recv`]).
    Queue,
    /// A sink each worker hands its tasks to on its own thread; whoever
    /// takes them reports each with [`Workers::received`].
    Sink(Arc<dyn Deliver<O>>),
}

/// How long ending an epoch waits for the tasks still running before it
/// leaves them to finish beside replacements: long enough for ordinary
/// tasks, short enough that a stuck one holds nothing up.
pub(crate) const END_EPOCH_WAIT: Duration = Duration::from_millis(100);

/// Sends tasks to worker threads and receives what they finished.
pub(crate) struct Workers<W: WorkerHooks> {
    pool: Arc<Pool<W>>,
    monitor: Monitor,
    occupancy: Arc<Occupancy>,
    steps: Arc<ConsumerSteps>,
    /// The worker count asked for at the start: in-flight bounds are given
    /// for it and scale with the pool when it grows.
    initial_workers: usize,
    dispatcher: Dispatcher<W::Payload>,
    /// The result queue, when the workers send to one ([`ResultsTo::Queue`]).
    results: Option<Receiver<Done<W::Output>>>,
    /// Tasks sent whose result has not been received yet, any epoch.
    unreceived: usize,
    next_seq: u64,
    shutdown_grace: Duration,
    shut_down: bool,
}

impl<W: WorkerHooks> Workers<W> {
    /// Starts `workers` threads, and the monitor. `capacity` bounds the
    /// tasks in flight with `workers` workers; [`Self::scaled`] gives the
    /// bound for the pool's current size, up to the monitor's largest. The
    /// caller never sends more tasks than that without receiving, and
    /// `end_epoch` drains the old epoch's results before new tasks go out,
    /// so no queue sized to the largest bound ever blocks a worker.
    pub fn start(
        hooks: W,
        dispatch: Dispatch,
        workers: usize,
        capacity: usize,
        monitor: MonitorConfig,
        shutdown_grace: Duration,
        results_to: ResultsTo<W::Output>,
    ) -> Result<Self, EngineError> {
        let workers = workers.max(1);
        let capacity = capacity.max(1);
        let largest_pool = monitor
            .adaptive
            .as_ref()
            .map_or(workers, |adaptive| adaptive.max_workers.max(workers));
        let queue_capacity = scale(capacity, largest_pool, workers);
        let (dispatcher, receivers) = Dispatcher::new(dispatch, workers, queue_capacity);
        let (deliver, results): (Arc<dyn Deliver<W::Output>>, _) = match results_to {
            ResultsTo::Queue => {
                let (result_tx, results) = bounded(queue_capacity);
                (Arc::new(result_tx), Some(results))
            }
            ResultsTo::Sink(sink) => (sink, None),
        };
        let pool = Pool::start(hooks, receivers, deliver)?;
        let occupancy = Arc::new(Occupancy::default());
        let steps = Arc::new(ConsumerSteps::default());
        let signals = (occupancy.clone(), steps.clone());
        let monitor = match Monitor::start(pool.clone(), monitor, signals) {
            Ok(monitor) => monitor,
            Err(err) => {
                drop(dispatcher); // closes the queues: idle workers leave
                pool.shutdown(Duration::ZERO);
                return Err(err);
            }
        };
        Ok(Workers {
            pool,
            monitor,
            occupancy,
            steps,
            initial_workers: workers,
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

    /// The workers the pool is kept at (replacements for slow workers
    /// come on top of it).
    pub fn target(&self) -> usize {
        self.pool.target()
    }

    /// Fixes the pool at `workers` for the rest of its life (see `Pool::fix_target`).
    pub fn fix_workers(&self, workers: usize) {
        self.pool.fix_target(workers);
    }

    /// Lets the adaptive controller resize the pool again (see `Pool::release_target`).
    pub fn adapt_workers(&self) {
        self.pool.release_target();
    }

    /// `bound`, given for the starting worker count, for the pool's size
    /// now; never below `bound`, so shrinking keeps the user's prefetch.
    pub fn scaled(&self, bound: usize) -> usize {
        scale(bound, self.pool.target(), self.initial_workers)
    }

    #[cfg(test)]
    pub(crate) fn pool_for_tests(&self) -> &Arc<Pool<W>> {
        &self.pool
    }

    /// Records how full the ready queue is as the consumer asks for more.
    /// Records what the consumer found ready when it asked, and marks it
    /// waiting until the returned guard drops (at the end of its `recv`).
    /// The consumer asks for its next output, `ready` of `capacity` being
    /// ready: a new request is counted in the occupancy signal.
    pub fn consumer_asks(&self, ask: Ask, ready: usize, capacity: usize) -> ConsumerWaiting {
        if ask == Ask::New {
            self.occupancy.record(ready, capacity);
            self.steps.asked();
        }
        ConsumerWaiting::new(self.occupancy.clone())
    }

    /// The consumer received its output: its step starts.
    pub fn consumer_received(&self) {
        self.steps.received();
    }

    /// Finished tasks waiting in the result queue.
    pub fn results_waiting(&self) -> usize {
        self.results.as_ref().map_or(0, Receiver::len)
    }

    /// The figures the worker side knows; engines add their own.
    pub fn stats(&self) -> EngineStats {
        let shared = &self.pool.shared;
        EngineStats {
            workers: self.live(),
            worker_history: self.pool.history(),
            resizes: self.pool.resizes(),
            settled_workers: self.pool.settled_workers(),
            samples_loaded: shared.samples_done.load(Ordering::Relaxed),
            busy: Duration::from_nanos(shared.busy_nanos.load(Ordering::Relaxed)),
            cpu: Duration::from_nanos(shared.cpu_nanos.load(Ordering::Relaxed)),
            first_task_cpu: Duration::from_nanos(
                shared.first_task_cpu_nanos.load(Ordering::Relaxed),
            ),
            first_task_samples: shared.first_task_samples.load(Ordering::Relaxed),
            occupancy: self.occupancy.mean(),
            asks: self.occupancy.asks(),
            loop_step: self.steps.mean(),
            ..EngineStats::default()
        }
    }

    pub fn epoch(&self) -> u64 {
        self.pool.shared.epoch.load(Ordering::Acquire)
    }

    /// How long task `seq` has worked so far, and its samples, while a
    /// worker runs it.
    pub fn task_worked(&self, seq: u64) -> Option<(Duration, usize)> {
        self.pool.task_worked(seq)
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

    /// Takes the tasks no worker has started off the queue, in the order
    /// they were sent (none where workers own their queues): the caller
    /// keeps them or sends them again (`send_again`).
    pub fn take_queued(&mut self) -> Vec<Task<W::Payload>> {
        let tasks = self.pool.take_queued();
        self.unreceived -= tasks.len();
        tasks
    }

    /// Queues tasks taken by `take_queued` again, as they were.
    pub fn send_again(&mut self, tasks: Vec<Task<W::Payload>>) -> Result<(), EngineError> {
        for task in tasks {
            self.dispatcher.send(task)?;
            self.unreceived += 1;
        }
        Ok(())
    }

    /// The next finished task, of any epoch, waiting at most `wait`. With
    /// no wait it only looks (see `receive`).
    pub fn recv(&mut self, wait: Duration) -> Result<Done<W::Output>, EngineError> {
        let results = self.results.as_ref().ok_or(EngineError::WorkersGone)?;
        let done = receive(results, wait)?;
        self.received(done.worker);
        Ok(done)
    }

    /// A task of `worker` was taken off the result queue, or delivered.
    pub fn received(&mut self, worker: usize) {
        self.unreceived -= 1;
        self.dispatcher.received(worker);
    }

    /// Tasks sent whose result has not been received yet, any epoch.
    pub fn unreceived(&self) -> usize {
        self.unreceived
    }

    /// Whether a task sent now would find a worker (see [`Dispatcher::can_send`]).
    pub fn can_send(&self) -> bool {
        !self.shut_down && self.dispatcher.can_send()
    }

    /// Stops giving `worker` tasks until the next epoch (round-robin dispatch).
    pub fn deactivate(&mut self, worker: usize) {
        self.dispatcher.deactivate(worker);
    }

    /// Ends the current epoch: its queued tasks are dropped, and its running
    /// tasks' results will be. With a shared queue, running tasks get
    /// [`END_EPOCH_WAIT`] to finish; a worker still running one after that
    /// (a stuck sample) gets a replacement and leaves when it is done, so the
    /// next epoch starts at once. Workers that own their queues (an iterable
    /// dataset's streams) are waited for: each next task is theirs.
    pub fn end_epoch(&mut self) -> Result<(), EngineError> {
        let deadline = self.begin_epoch_end()?;
        let results = self.results.clone().ok_or(EngineError::WorkersGone)?;
        while self.unreceived > 0 {
            let received = match deadline {
                Some(deadline) => results.recv_deadline(deadline),
                None => results.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match received {
                Ok(_) => self.unreceived -= 1,
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return Err(EngineError::WorkersGone),
            }
        }
        self.finish_epoch_end();
        Ok(())
    }

    /// [`Self::end_epoch`]'s first half, for an engine whose results another
    /// thread receives: the epoch moves on and its queued tasks are dropped.
    /// The caller then waits, until the returned deadline if there is one,
    /// for [`Self::unreceived`] to reach zero, and calls
    /// [`Self::finish_epoch_end`].
    pub fn begin_epoch_end(&mut self) -> Result<Option<Instant>, EngineError> {
        if self.shut_down {
            return Err(EngineError::ShutDown);
        }
        self.pool.shared.epoch.fetch_add(1, Ordering::AcqRel);
        self.steps.new_epoch();
        if self.pool.resizable() {
            self.unreceived -= self.pool.drain_queued();
            Ok(Some(Instant::now() + END_EPOCH_WAIT))
        } else {
            Ok(None)
        }
    }

    /// [`Self::end_epoch`]'s second half: tasks still running get replacements.
    pub fn finish_epoch_end(&mut self) {
        if self.unreceived > 0 && self.pool.resizable() {
            // Their results arrive later and are dropped as stale.
            self.pool.orphan_running();
        }
        self.dispatcher.reset();
    }

    /// Stops and joins the workers, waiting at most `grace` for one still
    /// inside a task (see [`Pool::shutdown`]); idempotent. Returns how many
    /// threads were left to finish their task and exit on their own.
    pub fn shutdown(&mut self, grace: Duration) -> usize {
        self.stop_sending()
            .map_or(0, |stopping| stopping.wait_for_workers(grace))
    }

    /// [`Self::shutdown`]'s first half, for an engine whose workers hand
    /// their results into state it locks: the monitor stops and no task
    /// goes out any more (idempotent: None once done). The caller then
    /// waits for the workers with that state unlocked, for a worker
    /// finishing its task needs it.
    pub fn stop_sending(&mut self) -> Option<Stopping<W>> {
        if self.shut_down {
            return None;
        }
        self.shut_down = true;
        // The monitor first: it could otherwise start a worker while the
        // pool is stopping.
        self.monitor.stop();
        self.dispatcher.close();
        Some(Stopping(self.pool.clone()))
    }

    /// The grace `shutdown_with_default_grace` gives.
    pub fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }

    /// [`Self::shutdown`] with the configured grace.
    pub fn shutdown_with_default_grace(&mut self) -> usize {
        self.shutdown(self.shutdown_grace)
    }
}

/// Workers that get no more tasks, to be waited for.
pub(crate) struct Stopping<W: WorkerHooks>(Arc<Pool<W>>);

impl<W: WorkerHooks> Stopping<W> {
    /// Stops and joins the workers, waiting at most `grace` for one still
    /// inside a task (see [`Pool::shutdown`]). Returns how many threads were
    /// left to finish their task and exit on their own.
    pub fn wait_for_workers(self, grace: Duration) -> usize {
        self.0.shutdown(grace)
    }
}

/// `bound` × `workers` / `initial`, rounded up, and never below `bound`.
fn scale(bound: usize, workers: usize, initial: usize) -> usize {
    let initial = initial.max(1);
    (bound * workers.max(initial)).div_ceil(initial)
}

impl<W: WorkerHooks> Drop for Workers<W> {
    fn drop(&mut self) {
        self.shutdown_with_default_grace();
    }
}
