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
    /// [`Dispatch::RoundRobin`], also skipping a worker that already holds
    /// its share of the tasks in flight (the bound over the active workers),
    /// as torch does with `in_order=False`: a stuck stream keeps its share
    /// only, and the others go on.
    FairShare,
}

/// The sending side of the task queues, with round-robin bookkeeping.
pub(crate) struct Dispatcher<P> {
    mode: Dispatch,
    senders: Vec<Sender<Task<P>>>,
    active: Vec<bool>,
    /// Tasks sent to each worker whose result has not been received.
    outstanding: Vec<usize>,
    /// The in-flight bound that fair shares divide.
    capacity: usize,
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
            Dispatch::RoundRobin | Dispatch::FairShare => {
                (0..workers).map(|_| bounded(capacity)).unzip()
            }
        };
        let dispatcher = Dispatcher {
            mode,
            senders,
            active: vec![true; workers],
            outstanding: vec![0; workers],
            capacity,
            cursor: 0,
        };
        (dispatcher, receivers)
    }

    /// Queues a task; returns the worker it was given to, if it went to one.
    pub fn send(&mut self, task: Task<P>) -> Result<Option<usize>, EngineError> {
        let Some(sender) = self.senders.first() else {
            return Err(EngineError::ShutDown);
        };
        if self.mode == Dispatch::Shared {
            sender.try_send(task).map_err(|_| EngineError::Full)?;
            return Ok(None);
        }
        let worker = self.next_worker()?;
        self.senders[worker]
            .try_send(task)
            .map_err(|_| EngineError::Full)?;
        self.cursor = (worker + 1) % self.active.len();
        self.outstanding[worker] += 1;
        Ok(Some(worker))
    }

    /// Whether [`Self::send`] would find a worker for a task now.
    pub fn can_send(&self) -> bool {
        match self.mode {
            Dispatch::Shared => true,
            _ => !matches!(self.next_worker(), Err(EngineError::Full)),
        }
    }

    /// The worker whose turn it is: the next active one from the cursor
    /// (with fair shares, the next one below its share).
    fn next_worker(&self) -> Result<usize, EngineError> {
        let workers = self.active.len();
        let active = self.active.iter().filter(|&&active| active).count();
        if active == 0 {
            return Err(EngineError::NoActiveWorker);
        }
        let share = (self.capacity / active).max(1);
        (0..workers)
            .map(|step| (self.cursor + step) % workers)
            .find(|&worker| {
                self.active[worker]
                    && (self.mode != Dispatch::FairShare || self.outstanding[worker] < share)
            })
            .ok_or(EngineError::Full)
    }

    /// The result of a task sent to `worker` was received.
    pub fn received(&mut self, worker: usize) {
        if let Some(count) = self.outstanding.get_mut(worker) {
            *count = count.saturating_sub(1);
        }
    }

    /// Stops giving `worker` tasks until [`Self::reset`].
    pub fn deactivate(&mut self, worker: usize) {
        if let Some(active) = self.active.get_mut(worker) {
            *active = false;
        }
    }

    /// A new epoch, once every result sent was received: every worker
    /// active, the turn back at worker 0.
    pub fn reset(&mut self) {
        self.active.fill(true);
        self.outstanding.fill(0);
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
    fn fair_share_skips_a_worker_holding_its_share() {
        // 2 workers, 4 tasks in flight at most: a share of 2 each.
        let (mut dispatch, rx) = Dispatcher::new(Dispatch::FairShare, 2, 4);
        let deliver = |dispatch: &mut Dispatcher<u64>, worker: usize| {
            rx[worker].try_recv().expect("a queued task");
            dispatch.received(worker);
        };
        assert_eq!(dispatch.send(task(0)), Ok(Some(0)));
        assert_eq!(dispatch.send(task(1)), Ok(Some(1)));
        assert_eq!(dispatch.send(task(2)), Ok(Some(0)));
        assert_eq!(dispatch.send(task(3)), Ok(Some(1)));
        // Worker 0 is stuck; worker 1 delivers: only worker 1 gets more.
        assert!(!dispatch.can_send());
        assert_eq!(dispatch.send(task(4)), Err(EngineError::Full));
        deliver(&mut dispatch, 1);
        assert!(dispatch.can_send());
        assert_eq!(dispatch.send(task(5)), Ok(Some(1)));
        deliver(&mut dispatch, 1);
        deliver(&mut dispatch, 1);
        assert_eq!(dispatch.send(task(6)), Ok(Some(1)));
        assert_eq!(dispatch.send(task(7)), Ok(Some(1)));
        assert_eq!(dispatch.send(task(8)), Err(EngineError::Full));
        // Worker 1 exhausted: worker 0 alone shares the whole bound.
        dispatch.deactivate(1);
        deliver(&mut dispatch, 0);
        assert_eq!(dispatch.send(task(9)), Ok(Some(0)));
        dispatch.deactivate(0);
        assert_eq!(dispatch.send(task(10)), Err(EngineError::NoActiveWorker));
    }

    #[test]
    fn round_robin_keeps_strict_turns_whatever_is_outstanding() {
        let (mut dispatch, _rx) = Dispatcher::new(Dispatch::RoundRobin, 2, 4);
        for seq in 0..4 {
            assert_eq!(dispatch.send(task(seq)), Ok(Some(seq as usize % 2)));
        }
        assert!(dispatch.can_send());
    }

    #[test]
    fn a_closed_dispatcher_refuses_tasks() {
        let (mut dispatch, _rx) = Dispatcher::<u64>::new(Dispatch::Shared, 2, 2);
        dispatch.close();
        assert_eq!(dispatch.send(task(0)), Err(EngineError::ShutDown));
    }
}
