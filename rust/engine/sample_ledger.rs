//! An epoch's identities: every unit the sampler hands out (a sample, or a
//! whole batch where workers load batches) gets its position in the epoch,
//! and stays *pending* from the moment it is handed to the workers until its
//! batch reaches the training loop (or it is skipped). A checkpoint keeps
//! the pending units with their positions (a resumed sample draws what it
//! would have: its seed follows from its position), and a resume hands
//! them out again first, before the sampler goes on.
//!
//! The training thread hands whole batches in and out; the ledger does the
//! per-unit bookkeeping.

use std::collections::{BTreeMap, VecDeque};

/// Positions and indices of an epoch's units not yet delivered.
pub struct SampleLedger<I> {
    /// The position the next fresh unit gets.
    next: u64,
    /// Units to hand out before fresh ones: carried over from a checkpoint,
    /// or handed back when their workers were lost (a fork child).
    queued: VecDeque<(u64, I)>,
    /// Units handed to the workers and not yet delivered or skipped.
    pending: BTreeMap<u64, I>,
}

impl<I> SampleLedger<I> {
    /// A ledger whose first fresh unit gets position `next`, with `carried`
    /// units (position, index) to hand out first, in the sampler's order.
    pub fn new(next: u64, carried: Vec<(u64, I)>) -> Self {
        let mut queued: Vec<(u64, I)> = carried;
        queued.sort_by_key(|(position, _)| *position);
        let next = queued.last().map_or(next, |(last, _)| next.max(last + 1));
        SampleLedger {
            next,
            queued: queued.into(),
            pending: BTreeMap::new(),
        }
    }

    /// Units waiting to be handed out before fresh ones.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// The position the next fresh unit gets.
    pub fn next_position(&self) -> u64 {
        self.next
    }

    /// Hands out the first `from_queue` queued units (fewer if fewer are
    /// queued), then `fresh` new ones, in that order: each with its position,
    /// now pending (`copy` copies an index for the ledger to keep).
    pub fn hand_out(
        &mut self,
        from_queue: usize,
        fresh: Vec<I>,
        copy: impl Fn(&I) -> I,
    ) -> Vec<(u64, I)> {
        let from_queue = from_queue.min(self.queued.len());
        let mut out: Vec<(u64, I)> = Vec::with_capacity(from_queue + fresh.len());
        out.extend(self.queued.drain(..from_queue));
        for index in fresh {
            out.push((self.next, index));
            self.next += 1;
        }
        for (position, index) in &out {
            self.pending.insert(*position, copy(index));
        }
        out
    }

    /// Units that reached the training loop (positions not pending are
    /// ignored: a batch may hold none of this epoch's).
    pub fn delivered(&mut self, positions: impl IntoIterator<Item = u64>) {
        for position in positions {
            self.pending.remove(&position);
        }
    }

    /// A unit was skipped: done with, it is not handed out again.
    pub fn skipped(&mut self, position: u64) {
        self.pending.remove(&position);
    }

    /// The index of a pending unit.
    pub fn index_of(&self, position: u64) -> Option<&I> {
        self.pending.get(&position)
    }

    /// The workers that had the pending units are gone: those are handed
    /// out again first, in the sampler's order, at the same positions.
    pub fn requeue_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let mut queued: Vec<(u64, I)> = pending.into_iter().collect();
        queued.extend(self.queued.drain(..));
        queued.sort_by_key(|(position, _)| *position);
        self.queued = queued.into();
    }

    /// Every unit not delivered (pending or queued), in the sampler's order.
    pub fn undelivered(&self) -> Vec<(u64, &I)> {
        let mut all: Vec<(u64, &I)> = self
            .pending
            .iter()
            .map(|(position, index)| (*position, index))
            .chain(
                self.queued
                    .iter()
                    .map(|(position, index)| (*position, index)),
            )
            .collect();
        all.sort_by_key(|(position, _)| *position);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn positions<I>(units: &[(u64, I)]) -> Vec<u64> {
        units.iter().map(|(position, _)| *position).collect()
    }

    #[test]
    fn fresh_units_are_numbered_in_order_and_pending_until_delivered() {
        let mut ledger = SampleLedger::new(0, Vec::new());
        let batch = ledger.hand_out(0, vec![10, 11, 12], Clone::clone);
        assert_eq!(batch, vec![(0, 10), (1, 11), (2, 12)]);
        let batch = ledger.hand_out(0, vec![13], Clone::clone);
        assert_eq!(batch, vec![(3, 13)]);
        ledger.delivered([1, 3]);
        let left: Vec<(u64, i32)> = ledger
            .undelivered()
            .into_iter()
            .map(|(p, i)| (p, *i))
            .collect();
        assert_eq!(left, vec![(0, 10), (2, 12)]);
        ledger.skipped(0);
        ledger.delivered([2, 99]);
        assert!(ledger.undelivered().is_empty());
        assert_eq!(ledger.next_position(), 4);
    }

    #[test]
    fn carried_units_go_first_with_their_own_positions() {
        let mut ledger = SampleLedger::new(9, vec![(7, 'b'), (2, 'a')]);
        assert_eq!(ledger.queued(), 2);
        let batch = ledger.hand_out(5, vec!['x', 'y'], Clone::clone);
        assert_eq!(batch, vec![(2, 'a'), (7, 'b'), (9, 'x'), (10, 'y')]);
        assert_eq!(ledger.queued(), 0);
        assert_eq!(ledger.index_of(7), Some(&'b'));
    }

    #[test]
    fn a_checkpoint_older_than_its_carried_positions_numbers_after_them() {
        let ledger: SampleLedger<char> = SampleLedger::new(0, vec![(4, 'a')]);
        assert_eq!(ledger.next_position(), 5);
    }

    #[test]
    fn pending_units_are_requeued_before_the_queue_in_the_samplers_order() {
        let mut ledger = SampleLedger::new(0, Vec::new());
        ledger.hand_out(0, vec!['a', 'b', 'c', 'd'], Clone::clone);
        ledger.delivered([1]);
        ledger.requeue_pending();
        assert_eq!(ledger.queued(), 3);
        assert_eq!(
            positions(&ledger.hand_out(2, vec![], Clone::clone)),
            vec![0, 2]
        );
        let left: Vec<u64> = ledger.undelivered().into_iter().map(|(p, _)| p).collect();
        assert_eq!(left, vec![0, 2, 3]);
    }

    #[test]
    fn whatever_the_order_of_delivery_every_unit_is_delivered_once() {
        // Exactly once: every position handed out is undelivered until its
        // delivery, and never after it, whatever the order.
        let mut ledger = SampleLedger::new(0, Vec::new());
        let mut handed = Vec::new();
        for batch in 0..10u64 {
            handed.extend(positions(&ledger.hand_out(
                0,
                (0..7).map(|i| batch * 7 + i).collect(),
                Clone::clone,
            )));
        }
        let mut order = handed.clone();
        // A fixed shuffle: deliver in an order unlike the sampler's.
        order.sort_by_key(|p| (p * 37) % 71);
        for (done, position) in order.iter().enumerate() {
            ledger.delivered([*position]);
            assert_eq!(ledger.undelivered().len(), handed.len() - done - 1);
            assert!(ledger.index_of(*position).is_none());
        }
    }
}
