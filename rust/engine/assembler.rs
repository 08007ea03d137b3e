//! Builds batches from finished samples, of the sizes torch's batch sampler
//! gives. Either in the sampler's order, a sample that is late leaving its
//! batch for a later one (see `SampleSequence`), or from whichever samples
//! are ready, fast ones first (MinatoLoader's batch construction): a slow
//! sample lands in a later batch instead of holding up its own.

use std::collections::VecDeque;
use std::time::Duration;

use super::sample_sequence::{Lateness, SampleSequence};
use super::task::Sample;

/// Which finished samples a batch takes.
enum Picking<S> {
    /// The sampler's order, but for late samples.
    Sequence(SampleSequence<S>),
    /// Whichever finished first, those not flagged slow before the others.
    Finish {
        fast: VecDeque<S>,
        slow: VecDeque<S>,
    },
}

/// Finished samples waiting for a batch, and the sizes batches must have.
pub(crate) struct Assembler<S> {
    /// Sizes of the batches still to deliver, in order: the sampler's, so
    /// the count and sizes are exactly torch's.
    sizes: VecDeque<usize>,
    picking: Picking<S>,
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
    /// `in_sequence`: batches keep the sampler's order (but for late
    /// samples); otherwise they take whichever samples finished first.
    pub fn new(drop_short_last: bool, in_sequence: bool) -> Self {
        let picking = if in_sequence {
            Picking::Sequence(SampleSequence::new())
        } else {
            Picking::Finish {
                fast: VecDeque::new(),
                slow: VecDeque::new(),
            }
        };
        Assembler {
            sizes: VecDeque::new(),
            picking,
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

    /// Task `task` of `samples` samples was sent to the workers (the
    /// sampler's next samples, in order).
    pub fn sent(&mut self, task: u64, samples: usize) {
        if let Picking::Sequence(sequence) = &mut self.picking {
            sequence.sent(task, samples);
        }
    }

    /// Task `task`'s samples finished; `slow` when they were flagged past
    /// the timeout.
    pub fn finished(
        &mut self,
        task: u64,
        samples: impl IntoIterator<Item = Sample<S>>,
        slow: bool,
    ) {
        let mut loaded = Vec::new();
        for sample in samples {
            self.unfinished -= 1;
            match sample {
                Sample::Loaded(sample) => loaded.push(Some(sample)),
                Sample::Skipped(record) => {
                    self.skipped.push(record);
                    self.shortfall += 1;
                    loaded.push(None);
                }
            }
        }
        match &mut self.picking {
            Picking::Sequence(sequence) => sequence.finished(task, loaded),
            Picking::Finish {
                fast,
                slow: slow_queue,
            } => {
                let queue = if slow { slow_queue } else { fast };
                queue.extend(loaded.into_iter().flatten());
            }
        }
        self.settle_shortfall();
    }

    /// Takes the last batches planned back off the plan, where their tasks
    /// were taken back before any worker started them: `tasks` (each one's
    /// number and samples) are the last tasks sent, in the order sent.
    /// Whole batches only, from the last: returns how many of the last
    /// `tasks` they take and their sizes, in order. Nothing is withdrawn
    /// unless batches keep the sampler's sequence and hold the samples sent
    /// in order (no skipped sample changed the plan, none late is out of
    /// its place).
    pub fn withdraw(&mut self, tasks: &[(u64, usize)]) -> (usize, Vec<usize>) {
        let Picking::Sequence(sequence) = &mut self.picking else {
            return (0, Vec::new());
        };
        if self.shortfall > 0 || self.surplus > 0 || self.closed || !self.skipped.is_empty() {
            return (0, Vec::new());
        }
        let mut sizes = Vec::new();
        let mut at = tasks.len();
        for &size in self.sizes.iter().rev() {
            let mut start = at;
            let mut samples = 0;
            while start > 0 && samples < size {
                start -= 1;
                samples += tasks[start].1;
            }
            if samples != size {
                break;
            }
            sizes.push(size);
            at = start;
        }
        if sizes.is_empty() || !sequence.withdraw(&tasks[at..]) {
            return (0, Vec::new());
        }
        for size in &sizes {
            self.sizes.pop_back();
            self.unfinished -= size;
        }
        sizes.reverse();
        (tasks.len() - at, sizes)
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

    /// The next batch, if its samples are ready: in the sampler's order
    /// (asking `late` whether a pending task's samples may move on), or fast
    /// ones first.
    pub fn pop_batch(&mut self, late: impl FnMut(u64) -> Lateness) -> Option<Vec<S>> {
        let size = *self.sizes.front()?;
        let batch = match &mut self.picking {
            Picking::Sequence(sequence) => sequence.take(size, late)?,
            Picking::Finish { fast, slow } => {
                if fast.len() + slow.len() < size {
                    return None;
                }
                let from_fast = size.min(fast.len());
                let mut batch: Vec<S> = fast.drain(..from_fast).collect();
                batch.extend(slow.drain(..size - from_fast));
                batch
            }
        };
        self.sizes.pop_front();
        Some(batch)
    }

    /// Samples that left their batch in the sampler's order while late.
    pub fn moved(&self) -> u64 {
        match &self.picking {
            Picking::Sequence(sequence) => sequence.moved(),
            Picking::Finish { .. } => 0,
        }
    }

    /// Of task `task`'s samples, those that moved while it ran.
    pub fn moved_of(&self, task: u64) -> usize {
        match &self.picking {
            Picking::Sequence(sequence) => sequence.moved_of(task),
            Picking::Finish { .. } => 0,
        }
    }

    /// Moved samples whose task has not finished yet.
    pub fn moved_running(&self) -> usize {
        match &self.picking {
            Picking::Sequence(sequence) => sequence.moved_running(),
            Picking::Finish { .. } => 0,
        }
    }

    /// When the next batch, held by a sample not yet late, should be
    /// looked at again.
    pub fn wake_in(&self) -> Option<Duration> {
        match &self.picking {
            Picking::Sequence(sequence) => sequence.wake_in(),
            Picking::Finish { .. } => None,
        }
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
        match &self.picking {
            Picking::Sequence(sequence) => sequence.ready(),
            Picking::Finish { fast, slow } => fast.len() + slow.len(),
        }
    }

    /// Samples submitted and not yet delivered: what bounds memory.
    pub fn samples_in_flight(&self) -> usize {
        self.unfinished + self.ready_samples()
    }

    pub fn clear(&mut self) {
        self.sizes.clear();
        match &mut self.picking {
            Picking::Sequence(sequence) => sequence.clear(),
            Picking::Finish { fast, slow } => {
                fast.clear();
                slow.clear();
            }
        }
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

    fn never(_task: u64) -> Lateness {
        Lateness::Never
    }

    #[test]
    fn a_batch_waits_for_its_size_and_takes_fast_samples_first() {
        let mut asm = Assembler::new(false, false);
        asm.planned(3);
        asm.planned(2);
        asm.finished(0, loaded([1]), true);
        asm.finished(0, loaded([2, 3]), false);
        assert_eq!(asm.pop_batch(never), Some(vec![2, 3, 1]));
        assert_eq!(asm.pop_batch(never), None);
        asm.finished(0, loaded([4]), false);
        asm.finished(0, loaded([5]), false);
        assert_eq!(asm.pop_batch(never), Some(vec![4, 5]));
        assert_eq!(asm.pending_batches(), 0);
        assert_eq!(asm.samples_in_flight(), 0);
    }

    #[test]
    fn a_slow_sample_moves_to_a_later_batch() {
        let mut asm = Assembler::new(false, false);
        asm.planned(2);
        asm.planned(2);
        asm.finished(0, loaded([0]), false);
        asm.finished(0, loaded([2, 3]), false);
        // Sample 1 is still running: batch one is built from what is ready.
        assert_eq!(asm.pop_batch(never), Some(vec![0, 2]));
        asm.finished(0, loaded([1]), true);
        assert_eq!(asm.pop_batch(never), Some(vec![3, 1]));
    }

    #[test]
    fn skipped_samples_are_made_up_from_later_batches_and_cut_from_the_last() {
        let mut asm = Assembler::new(false, false);
        asm.planned(2);
        asm.planned(2);
        asm.planned(1);
        asm.finished(0, skipped(100), false);
        asm.finished(0, loaded([1, 2]), false);
        // The first batch takes sample 2, planned for the second.
        assert_eq!(asm.pop_batch(never), Some(vec![1, 2]));
        asm.finished(0, loaded([3, 4]), false);
        assert_eq!(asm.pop_batch(never), Some(vec![3, 4]));
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
        let mut asm = Assembler::new(false, false);
        for _ in 0..3 {
            asm.planned(4);
        }
        asm.close();
        asm.finished(0, loaded([0, 1, 2]), false);
        asm.finished(0, skipped(3), false);
        asm.finished(0, skipped(4), false);
        asm.finished(0, loaded([5, 6, 7, 8, 9, 10, 11]), false);
        let sizes: Vec<usize> =
            std::iter::from_fn(|| asm.pop_batch(never).map(|b| b.len())).collect();
        assert_eq!(sizes, vec![4, 4, 2]);
        assert_eq!(asm.samples_in_flight(), 0);
    }

    #[test]
    fn with_drop_last_a_batch_cut_short_is_dropped_and_its_samples_make_up_later_skips() {
        let mut asm = Assembler::new(true, false);
        for _ in 0..3 {
            asm.planned(4);
        }
        asm.close();
        asm.finished(0, skipped(0), false);
        // 11 samples left: two full batches, three left over.
        assert_eq!(asm.pending_batches(), 2);
        asm.finished(0, skipped(1), false);
        // 10 left: still two full batches.
        assert_eq!(asm.pending_batches(), 2);
        asm.finished(0, loaded([2, 3, 4, 5, 6, 7, 8, 9, 10, 11]), false);
        let sizes: Vec<usize> =
            std::iter::from_fn(|| asm.pop_batch(never).map(|b| b.len())).collect();
        assert_eq!(sizes, vec![4, 4]);
        assert_eq!(asm.pending_batches(), 0);
    }

    #[test]
    fn in_sequence_a_batch_keeps_the_samplers_order_and_skips_are_cut_from_the_last() {
        let mut asm = Assembler::new(false, true);
        for _ in 0..2 {
            asm.planned(2);
        }
        for task in 0..4 {
            asm.sent(task, 1);
        }
        asm.close();
        asm.finished(3, loaded([3]), false);
        asm.finished(1, skipped(100), false);
        asm.finished(2, loaded([2]), false);
        assert_eq!(asm.pop_batch(never), None, "sample 0 holds the first batch");
        asm.finished(0, loaded([0]), true);
        assert_eq!(asm.pop_batch(never), Some(vec![0, 2]));
        assert_eq!(asm.pop_batch(never), Some(vec![3]));
        assert_eq!(asm.pending_batches(), 0);
        assert_eq!(asm.take_skipped(), vec![100]);
        assert_eq!(asm.moved(), 0);
    }
}
