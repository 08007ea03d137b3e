//! Builds batches from finished samples, fast ones first (MinatoLoader's
//! batch construction): a slow sample lands in a later batch instead of
//! holding up its own.

use std::collections::VecDeque;

/// Finished samples waiting for a batch, and the sizes batches must have.
pub(crate) struct Assembler<S> {
    /// Sizes of the batches still to deliver, in order: the sampler's, so
    /// the count and sizes are exactly torch's.
    sizes: VecDeque<usize>,
    fast: VecDeque<S>,
    slow: VecDeque<S>,
    /// Samples submitted and not yet finished.
    unfinished: usize,
}

impl<S> Assembler<S> {
    pub fn new() -> Self {
        Assembler {
            sizes: VecDeque::new(),
            fast: VecDeque::new(),
            slow: VecDeque::new(),
            unfinished: 0,
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
    pub fn finished(&mut self, samples: impl IntoIterator<Item = S>, slow: bool) {
        let queue = if slow { &mut self.slow } else { &mut self.fast };
        let before = queue.len();
        queue.extend(samples);
        self.unfinished -= queue.len() - before;
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
        self.unfinished = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_waits_for_its_size_and_takes_fast_samples_first() {
        let mut asm = Assembler::new();
        asm.planned(3);
        asm.planned(2);
        asm.finished([1], true);
        asm.finished([2, 3], false);
        assert_eq!(asm.pop_batch(), Some(vec![2, 3, 1]));
        assert_eq!(asm.pop_batch(), None);
        asm.finished([4], false);
        asm.finished([5], false);
        assert_eq!(asm.pop_batch(), Some(vec![4, 5]));
        assert_eq!(asm.pending_batches(), 0);
        assert_eq!(asm.samples_in_flight(), 0);
    }

    #[test]
    fn a_slow_sample_moves_to_a_later_batch() {
        let mut asm = Assembler::new();
        asm.planned(2);
        asm.planned(2);
        asm.finished([0], false);
        asm.finished([2, 3], false);
        // Sample 1 is still running: batch one is built from what is ready.
        assert_eq!(asm.pop_batch(), Some(vec![0, 2]));
        asm.finished([1], true);
        assert_eq!(asm.pop_batch(), Some(vec![3, 1]));
    }
}
