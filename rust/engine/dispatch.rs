//! How submitted tasks reach the workers.

use crossbeam_channel::{bounded, Receiver, Sender};

use super::error::EngineError;
use super::task::Task;

/// The way tasks are spread over workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatch {
    /// One queue that every worker takes from: an idle worker always finds
    /// work, so one slow task never holds up the tasks behind it.
    Shared,
    /// One queue per worker, filled in turn, skipping exhausted workers —
    /// torch's assignment. An iterable dataset needs it: each worker owns a
    /// stream, so which worker serves which task decides what is delivered.
    RoundRobin,
}

/// The sending side of the task queues, with round-robin bookkeeping.
pub(crate) struct Dispatcher<P> {
    mode: Dispatch,
    senders: Vec<Sender<Task<P>>>,
    active: Vec<bool>,
    cursor: usize,
}

impl<P> Dispatcher<P> {
    /// Creates the queues. Each holds `capacity` tasks, the in-flight bound,
    /// so a send never blocks. Returns one receiver per worker.
    pub fn new(mode: Dispatch, workers: usize, capacity: usize) -> (Self, Vec<Receiver<Task<P>>>) {
        let capacity = capacity.max(1);
        let (senders, receivers) = match mode {
            Dispatch::Shared => {
                let (tx, rx) = bounded(capacity);
                (vec![tx], vec![rx; workers])
            }
            Dispatch::RoundRobin => (0..workers).map(|_| bounded(capacity)).unzip(),
        };
        let dispatcher = Dispatcher {
            mode,
            senders,
            active: vec![true; workers],
            cursor: 0,
        };
        (dispatcher, receivers)
    }

    /// Queues a task; returns the worker it was given to, if it went to one.
    pub fn send(&mut self, task: Task<P>) -> Result<Option<usize>, EngineError> {
        let Some(sender) = self.senders.first() else {
            return Err(EngineError::ShutDown);
        };
        match self.mode {
            Dispatch::Shared => {
                sender.try_send(task).map_err(|_| EngineError::Full)?;
                Ok(None)
            }
            Dispatch::RoundRobin => {
                let workers = self.active.len();
                for _ in 0..workers {
                    let worker = self.cursor;
                    self.cursor = (self.cursor + 1) % workers;
                    if self.active[worker] {
                        self.senders[worker]
                            .try_send(task)
                            .map_err(|_| EngineError::Full)?;
                        return Ok(Some(worker));
                    }
                }
                Err(EngineError::NoActiveWorker)
            }
        }
    }

    /// Stops giving `worker` tasks until [`Self::reset`].
    pub fn deactivate(&mut self, worker: usize) {
        if let Some(active) = self.active.get_mut(worker) {
            *active = false;
        }
    }

    /// A new epoch: every worker active, the turn back at worker 0.
    pub fn reset(&mut self) {
        self.active.fill(true);
        self.cursor = 0;
    }

    /// Closes the queues, so idle workers wake up and leave.
    pub fn close(&mut self) {
        self.senders.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(seq: u64) -> Task<u64> {
        Task {
            seq,
            epoch: 0,
            samples: 1,
            payload: seq,
        }
    }

    #[test]
    fn round_robin_skips_inactive_workers_and_keeps_its_turn() {
        let (mut dispatch, _rx) = Dispatcher::new(Dispatch::RoundRobin, 3, 8);
        assert_eq!(dispatch.send(task(0)), Ok(Some(0)));
        assert_eq!(dispatch.send(task(1)), Ok(Some(1)));
        dispatch.deactivate(2);
        assert_eq!(dispatch.send(task(2)), Ok(Some(0)));
        assert_eq!(dispatch.send(task(3)), Ok(Some(1)));
        dispatch.deactivate(0);
        dispatch.deactivate(1);
        assert_eq!(dispatch.send(task(4)), Err(EngineError::NoActiveWorker));
        dispatch.reset();
        assert_eq!(dispatch.send(task(5)), Ok(Some(0)));
    }

    #[test]
    fn a_closed_dispatcher_refuses_tasks() {
        let (mut dispatch, _rx) = Dispatcher::<u64>::new(Dispatch::Shared, 2, 2);
        dispatch.close();
        assert_eq!(dispatch.send(task(0)), Err(EngineError::ShutDown));
    }
}
