//! Builds batches from finished samples, fast ones first (MinatoLoader's
//! batch construction): a slow sample lands in a later batch instead of
//! holding up its own.

use std::collections::VecDeque;

use super::task::Sample;

/// Finished samples waiting for a batch, and the sizes batches must have.
pub(crate) struct Assembler<S> {
    /// Sizes of the batches still to deliver, in order: the sampler's, so
    /// the count and sizes are exactly torch's.
    sizes: VecDeque<usize>,
    fast: VecDeque<S>,
    slow: VecDeque<S>,
    /// Samples submitted and not yet finished.
    unfinished: usize,
    /// Skipped samples' records, until the consumer takes them.
    skipped: Vec<S>,
    /// Samples skipped and not yet taken off the planned sizes: each batch is
    /// filled from later samples, so the shortfall lands at the epoch's end.
    shortfall: usize,
    /// The consumer has submitted the epoch's last batch.
    closed: bool,
    /// With `closed`, a last batch cut short by skipped samples is dropped
    /// (the loader's drop_last: every batch delivered is full).
    drop_short_last: bool,
    /// Samples a dropped short batch would have taken: they are left over,
    /// so they make up for samples skipped after the drop.
    surplus: usize,
}

impl<S> Assembler<S> {
    pub fn new(drop_short_last: bool) -> Self {
        Assembler {
            sizes: VecDeque::new(),
            fast: VecDeque::new(),
            slow: VecDeque::new(),
            unfinished: 0,
            skipped: Vec::new(),
            shortfall: 0,
            closed: false,
            drop_short_last,
            surplus: 0,
        }
    }

    /// A batch of `size` samples was submitted.
    pub fn planned(&mut self, size: usize) {
        if size > 0 {
            self.sizes.push_back(size);
            self.unfinished += size;
        }
    }

    /// Samples finished; `slow` when they were flagged past the timeout.
    pub fn finished(&mut self, samples: impl IntoIterator<Item = Sample<S>>, slow: bool) {
        let queue = if slow { &mut self.slow } else { &mut self.fast };
        for sample in samples {
            self.unfinished -= 1;
            match sample {
                Sample::Loaded(sample) => queue.push_back(sample),
                Sample::Skipped(record) => {
                    self.skipped.push(record);
                    self.shortfall += 1;
                }
            }
        }
        self.settle_shortfall();
    }

    /// No batch follows the ones planned this epoch: the shortfall of
    /// skipped samples is taken off the last batches.
    pub fn close(&mut self) {
        self.closed = true;
        self.settle_shortfall();
    }

    fn settle_shortfall(&mut self) {
        if !self.closed || self.shortfall == 0 {
            return;
        }
        let absorbed = self.surplus.min(self.shortfall);
        self.surplus -= absorbed;
        self.shortfall -= absorbed;
        let mut cut_short = false;
        while self.shortfall > 0 {
            let Some(last) = self.sizes.back_mut() else {
                // Every batch is delivered or cut: nothing is left to shorten.
                self.shortfall = 0;
                break;
            };
            let cut = self.shortfall.min(*last);
            *last -= cut;
            self.shortfall -= cut;
            cut_short = true;
            if *last == 0 {
                self.sizes.pop_back();
                cut_short = false;
            }
        }
        if cut_short && self.drop_short_last {
            self.surplus += self.sizes.pop_back().unwrap_or(0);
        }
    }

    /// The records of samples skipped since the last call.
    pub fn take_skipped(&mut self) -> Vec<S> {
        std::mem::take(&mut self.skipped)
    }

    /// The next batch, if enough samples are ready for it: fast ones first.
    pub fn pop_batch(&mut self) -> Option<Vec<S>> {
        let size = *self.sizes.front()?;
        if self.fast.len() + self.slow.len() < size {
            return None;
        }
        self.sizes.pop_front();
        let from_fast = size.min(self.fast.len());
        let mut batch: Vec<S> = self.fast.drain(..from_fast).collect();
        batch.extend(self.slow.drain(..size - from_fast));
        Some(batch)
    }

    /// Whether the next batch needs more samples than are submitted: skipped
    /// samples left it short, and only later batches' samples can fill it.
    pub fn starved(&self) -> bool {
        self.sizes
            .front()
            .is_some_and(|&size| self.unfinished + self.ready_samples() < size)
    }

    /// Batches planned and not yet delivered.
    pub fn pending_batches(&self) -> usize {
        self.sizes.len()
    }

    /// Finished samples waiting for their batch.
    pub fn ready_samples(&self) -> usize {
        self.fast.len() + self.slow.len()
    }

    /// Samples submitted and not yet delivered: what bounds memory.
    pub fn samples_in_flight(&self) -> usize {
        self.unfinished + self.fast.len() + self.slow.len()
    }

    pub fn clear(&mut self) {
        self.sizes.clear();
        self.fast.clear();
        self.slow.clear();
        self.skipped.clear();
        self.unfinished = 0;
        self.shortfall = 0;
        self.surplus = 0;
        self.closed = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded<const N: usize>(values: [u32; N]) -> [Sample<u32>; N] {
        values.map(Sample::Loaded)
    }

    fn skipped(value: u32) -> [Sample<u32>; 1] {
        [Sample::Skipped(value)]
    }

    #[test]
    fn a_batch_waits_for_its_size_and_takes_fast_samples_first() {
        let mut asm = Assembler::new(false);
        asm.planned(3);
        asm.planned(2);
        asm.finished(loaded([1]), true);
        asm.finished(loaded([2, 3]), false);
        assert_eq!(asm.pop_batch(), Some(vec![2, 3, 1]));
        assert_eq!(asm.pop_batch(), None);
        asm.finished(loaded([4]), false);
        asm.finished(loaded([5]), false);
        assert_eq!(asm.pop_batch(), Some(vec![4, 5]));
        assert_eq!(asm.pending_batches(), 0);
        assert_eq!(asm.samples_in_flight(), 0);
    }

    #[test]
    fn a_slow_sample_moves_to_a_later_batch() {
        let mut asm = Assembler::new(false);
        asm.planned(2);
        asm.planned(2);
        asm.finished(loaded([0]), false);
        asm.finished(loaded([2, 3]), false);
        // Sample 1 is still running: batch one is built from what is ready.
        assert_eq!(asm.pop_batch(), Some(vec![0, 2]));
        asm.finished(loaded([1]), true);
        assert_eq!(asm.pop_batch(), Some(vec![3, 1]));
    }

    #[test]
    fn skipped_samples_are_made_up_from_later_batches_and_cut_from_the_last() {
        let mut asm = Assembler::new(false);
        asm.planned(2);
        asm.planned(2);
        asm.planned(1);
        asm.finished(skipped(100), false);
        asm.finished(loaded([1, 2]), false);
        // The first batch takes sample 2, planned for the second.
        assert_eq!(asm.pop_batch(), Some(vec![1, 2]));
        asm.finished(loaded([3, 4]), false);
        assert_eq!(asm.pop_batch(), Some(vec![3, 4]));
        // The shortfall is settled only once no batch follows: the last
        // batch is cut to nothing and the epoch ends.
        assert_eq!(asm.pending_batches(), 1);
        assert!(asm.starved());
        asm.close();
        assert_eq!(asm.pending_batches(), 0);
        assert_eq!(asm.take_skipped(), vec![100]);
        assert!(asm.take_skipped().is_empty());
    }

    #[test]
    fn the_shortfall_shortens_the_last_batches_once_closed() {
        let mut asm = Assembler::new(false);
        for _ in 0..3 {
            asm.planned(4);
        }
        asm.close();
        asm.finished(loaded([0, 1, 2]), false);
        asm.finished(skipped(3), false);
        asm.finished(skipped(4), false);
        asm.finished(loaded([5, 6, 7, 8, 9, 10, 11]), false);
        let sizes: Vec<usize> = std::iter::from_fn(|| asm.pop_batch().map(|b| b.len())).collect();
        assert_eq!(sizes, vec![4, 4, 2]);
        assert_eq!(asm.samples_in_flight(), 0);
    }

    #[test]
    fn with_drop_last_a_batch_cut_short_is_dropped_and_its_samples_make_up_later_skips() {
        let mut asm = Assembler::new(true);
        for _ in 0..3 {
            asm.planned(4);
        }
        asm.close();
        asm.finished(skipped(0), false);
        // 11 samples left: two full batches, three left over.
        assert_eq!(asm.pending_batches(), 2);
        asm.finished(skipped(1), false);
        // 10 left: still two full batches.
        assert_eq!(asm.pending_batches(), 2);
        asm.finished(loaded([2, 3, 4, 5, 6, 7, 8, 9, 10, 11]), false);
        let sizes: Vec<usize> = std::iter::from_fn(|| asm.pop_batch().map(|b| b.len())).collect();
        assert_eq!(sizes, vec![4, 4]);
        assert_eq!(asm.pending_batches(), 0);
    }
}
