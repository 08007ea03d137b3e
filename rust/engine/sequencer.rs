//! Puts finished tasks in delivery order.

use std::collections::{BTreeMap, VecDeque};

use super::error::EngineError;

/// The order outputs are delivered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Submission order, torch's `in_order=True`.
    Submission,
    /// Completion order: whatever finished first.
    Completion,
}

type Item<R> = Result<R, EngineError>;

/// Holds finished tasks of the current epoch until they may be delivered.
pub(crate) struct Sequencer<R> {
    order: Order,
    /// Submission order: finished tasks by sequence number; `None` marks a
    /// task that delivers nothing (an exhausted worker's).
    waiting: BTreeMap<u64, Option<Item<R>>>,
    /// Completion order: finished tasks as they came.
    ready: VecDeque<Item<R>>,
    /// The next sequence number to deliver, in submission order.
    next: u64,
    /// Tasks of this epoch submitted but not yet finished.
    unfinished: usize,
}

impl<R> Sequencer<R> {
    pub fn new(order: Order) -> Self {
        Sequencer {
            order,
            waiting: BTreeMap::new(),
            ready: VecDeque::new(),
            next: 0,
            unfinished: 0,
        }
    }

    /// Starts an epoch whose first task will have sequence number `first_seq`.
    pub fn reset(&mut self, first_seq: u64) {
        self.waiting.clear();
        self.ready.clear();
        self.next = first_seq;
        self.unfinished = 0;
    }

    pub fn submitted(&mut self) {
        self.unfinished += 1;
    }

    /// Records a finished task; `None` when it delivers nothing.
    pub fn finished(&mut self, seq: u64, item: Option<Item<R>>) {
        self.unfinished -= 1;
        match self.order {
            Order::Submission => {
                self.waiting.insert(seq, item);
            }
            Order::Completion => self.ready.extend(item),
        }
    }

    /// The next output that may be delivered now.
    pub fn pop(&mut self) -> Option<Item<R>> {
        match self.order {
            Order::Completion => self.ready.pop_front(),
            Order::Submission => {
                while let Some(entry) = self.waiting.first_entry() {
                    if *entry.key() != self.next {
                        return None;
                    }
                    self.next += 1;
                    if let Some(item) = entry.remove() {
                        return Some(item);
                    }
                }
                None
            }
        }
    }

    /// Finished tasks held here, waiting for delivery (or for their turn).
    pub fn ready(&self) -> usize {
        self.waiting.len() + self.ready.len()
    }

    /// Tasks of this epoch that may still deliver something.
    pub fn pending(&self) -> usize {
        let buffered = match self.order {
            Order::Submission => self.waiting.values().filter(|item| item.is_some()).count(),
            Order::Completion => self.ready.len(),
        };
        self.unfinished + buffered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submission_order_waits_for_the_gap_and_skips_silent_tasks() {
        let mut seq = Sequencer::<u32>::new(Order::Submission);
        seq.reset(10);
        for _ in 0..4 {
            seq.submitted();
        }
        seq.finished(12, Some(Ok(12)));
        seq.finished(11, None);
        assert_eq!(seq.pop(), None);
        assert_eq!(seq.pending(), 3);
        seq.finished(10, Some(Ok(10)));
        assert_eq!(seq.pop(), Some(Ok(10)));
        assert_eq!(seq.pop(), Some(Ok(12)));
        assert_eq!(seq.pop(), None);
        assert_eq!(seq.pending(), 1);
        seq.finished(13, Some(Ok(13)));
        assert_eq!(seq.pop(), Some(Ok(13)));
        assert_eq!(seq.pending(), 0);
    }

    #[test]
    fn completion_order_delivers_as_tasks_finish() {
        let mut seq = Sequencer::<u32>::new(Order::Completion);
        seq.submitted();
        seq.submitted();
        seq.finished(1, Some(Ok(1)));
        assert_eq!(seq.pop(), Some(Ok(1)));
        seq.finished(0, None);
        assert_eq!(seq.pop(), None);
        assert_eq!(seq.pending(), 0);
    }
}
