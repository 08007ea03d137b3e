//! An epoch's samples in the sampler's order, for batches that keep it: a
//! batch takes the next samples of the sequence as they finish, so what a
//! batch holds is a function of the sampler alone, not of timing. Only a
//! sample that is *late* (running past the late threshold the caller
//! judges) leaves its place: the batch goes on without it, and it joins the
//! first batch built after it finishes.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Where a running task stands against the late threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lateness {
    /// Past it: its samples may move to a later batch.
    Late,
    /// Not past it yet; it will be in (at most) this long, if still running.
    DueIn(Duration),
    /// It can never be late (no threshold).
    Never,
}

enum Slot<S> {
    /// Its task is queued or running.
    Pending {
        task: u64,
    },
    Ready(S),
    /// Skipped (its failure is recorded elsewhere), or moved out while late.
    Gone,
}

/// The samples of the epoch not yet placed in a batch, by position.
pub(crate) struct SampleSequence<S> {
    /// Position of `slots.front()` in the epoch.
    first: u64,
    slots: VecDeque<Slot<S>>,
    /// Each task still pending: the position of its first sample.
    tasks: HashMap<u64, u64>,
    /// Tasks whose samples left their place while late, and which positions
    /// of theirs did.
    moved_tasks: HashMap<u64, Vec<u64>>,
    /// Late samples that finished: the next batch built takes them first.
    moved_ready: VecDeque<S>,
    ready: usize,
    moved: u64,
    /// When the next batch, blocked on a pending sample, should look again.
    wake_in: Option<Duration>,
}

impl<S> SampleSequence<S> {
    pub fn new() -> Self {
        SampleSequence {
            first: 0,
            slots: VecDeque::new(),
            tasks: HashMap::new(),
            moved_tasks: HashMap::new(),
            moved_ready: VecDeque::new(),
            ready: 0,
            moved: 0,
            wake_in: None,
        }
    }

    /// Task `task` loads the next `samples` samples of the sequence.
    pub fn sent(&mut self, task: u64, samples: usize) {
        let position = self.first + self.slots.len() as u64;
        self.tasks.insert(task, position);
        self.slots
            .extend((0..samples).map(|_| Slot::Pending { task }));
    }

    /// Task `task` finished: its samples, in order, each loaded (`Some`) or
    /// skipped (`None`).
    pub fn finished(&mut self, task: u64, samples: impl IntoIterator<Item = Option<S>>) {
        let Some(start) = self.tasks.remove(&task) else {
            return;
        };
        let moved = self.moved_tasks.remove(&task).unwrap_or_default();
        for (offset, sample) in samples.into_iter().enumerate() {
            let position = start + offset as u64;
            if moved.contains(&position) {
                if let Some(sample) = sample {
                    self.moved_ready.push_back(sample);
                    self.ready += 1;
                }
                continue;
            }
            let Some(slot) = position
                .checked_sub(self.first)
                .and_then(|at| self.slots.get_mut(at as usize))
            else {
                continue;
            };
            *slot = match sample {
                Some(sample) => {
                    self.ready += 1;
                    Slot::Ready(sample)
                }
                None => Slot::Gone,
            };
        }
    }

    /// The next `size` samples, if they can be had now: the late samples
    /// that finished, then the sequence's next ones. A pending sample holds
    /// the batch unless `late` says its task is late: then, if the batch can
    /// be completed without it, it moves (and counts in [`Self::moved`]);
    /// if not, it keeps its place.
    pub fn take(&mut self, size: usize, mut late: impl FnMut(u64) -> Lateness) -> Option<Vec<S>> {
        self.wake_in = None;
        let from_moved = size.min(self.moved_ready.len());
        let mut needed = size - from_moved;
        // The prefix of slots the batch takes: up to and including its last
        // sample, and the late ones in it.
        let mut prefix = 0;
        let mut passed_late: Vec<usize> = Vec::new();
        let mut checked: HashMap<u64, Lateness> = HashMap::new();
        while needed > 0 {
            let at = prefix;
            prefix += 1;
            let task = match self.slots.get(at)? {
                Slot::Ready(_) => {
                    needed -= 1;
                    continue;
                }
                Slot::Gone => continue,
                Slot::Pending { task } => *task,
            };
            match *checked.entry(task).or_insert_with(|| late(task)) {
                Lateness::Late => passed_late.push(at),
                Lateness::DueIn(due) => {
                    self.wake_in = Some(due);
                    return None;
                }
                Lateness::Never => return None,
            }
        }
        for at in passed_late {
            if let Slot::Pending { task } = self.slots[at] {
                let position = self.first + at as u64;
                self.moved_tasks.entry(task).or_default().push(position);
                self.moved += 1;
            }
        }
        let mut batch: Vec<S> = self.moved_ready.drain(..from_moved).collect();
        for slot in self.slots.drain(..prefix) {
            if let Slot::Ready(sample) = slot {
                batch.push(sample);
            }
        }
        self.first += prefix as u64;
        self.ready -= batch.len();
        Some(batch)
    }

    /// Finished samples not yet in a batch.
    pub fn ready(&self) -> usize {
        self.ready
    }

    /// Samples that left their place while late, since the sequence began.
    pub fn moved(&self) -> u64 {
        self.moved
    }

    /// Of task `task`'s samples, those that left their place while it ran.
    pub fn moved_of(&self, task: u64) -> usize {
        self.moved_tasks.get(&task).map_or(0, Vec::len)
    }

    /// Moved samples whose task has not finished yet.
    pub fn moved_running(&self) -> usize {
        self.moved_tasks.values().map(Vec::len).sum()
    }

    /// When a batch blocked on a pending sample should be looked at again
    /// (that sample may be late by then); None when none is blocked.
    pub fn wake_in(&self) -> Option<Duration> {
        self.wake_in
    }

    /// Takes the last tasks sent back off the sequence, none of whose
    /// samples has finished: `tasks` (each one's number and samples) are
    /// those tasks, in the order they were sent. False, and nothing taken,
    /// unless they are exactly the sequence's last pending slots and no
    /// late sample is out of its place.
    pub fn withdraw(&mut self, tasks: &[(u64, usize)]) -> bool {
        if !self.moved_tasks.is_empty() || !self.moved_ready.is_empty() {
            return false;
        }
        let total: usize = tasks.iter().map(|&(_, samples)| samples).sum();
        let Some(start) = self.slots.len().checked_sub(total) else {
            return false;
        };
        let mut at = start;
        for &(task, samples) in tasks {
            if self.tasks.get(&task) != Some(&(self.first + at as u64)) {
                return false;
            }
            let theirs = self.slots.range(at..at + samples);
            if !theirs
                .clone()
                .all(|slot| matches!(slot, Slot::Pending { task: pending } if *pending == task))
            {
                return false;
            }
            at += samples;
        }
        self.slots.truncate(start);
        for (task, _) in tasks {
            self.tasks.remove(task);
        }
        true
    }

    /// Forgets the epoch; the count of moved samples is kept.
    pub fn clear(&mut self) {
        let moved = self.moved;
        *self = SampleSequence::new();
        self.moved = moved;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_task: u64) -> Lateness {
        Lateness::Never
    }

    #[test]
    fn the_last_pending_tasks_are_withdrawn_and_nothing_else() {
        let mut seq = SampleSequence::new();
        seq.sent(1, 2); // positions 0, 1
        seq.sent(2, 2); // 2, 3
        seq.sent(3, 1); // 4
        seq.finished(2, [Some(2), Some(3)]);
        assert!(!seq.withdraw(&[(2, 2), (3, 1)]), "task 2 has finished");
        assert!(!seq.withdraw(&[(1, 2)]), "task 1 is not among the last");
        assert!(seq.withdraw(&[(3, 1)]));
        assert_eq!(seq.tasks.len(), 1);
        seq.finished(1, [Some(0), Some(1)]);
        assert_eq!(seq.take(4, never), Some(vec![0, 1, 2, 3]));
        assert_eq!(seq.take(1, never), None, "position 4 was withdrawn");
        // Sent again later, the sequence goes on from where it was taken.
        seq.sent(4, 1);
        seq.finished(4, [Some(9)]);
        assert_eq!(seq.take(1, never), Some(vec![9]));
    }

    #[test]
    fn batches_keep_the_sequence_whatever_order_samples_finish_in() {
        let mut seq = SampleSequence::new();
        seq.sent(10, 2); // positions 0, 1
        seq.sent(11, 1); // 2
        seq.sent(12, 1); // 3
        seq.finished(12, [Some(3)]);
        seq.finished(11, [Some(2)]);
        assert_eq!(seq.take(2, never), None, "positions 0 and 1 are pending");
        seq.finished(10, [Some(0), Some(1)]);
        assert_eq!(seq.take(2, never), Some(vec![0, 1]));
        assert_eq!(seq.take(2, never), Some(vec![2, 3]));
        assert_eq!(seq.ready(), 0);
        assert_eq!(seq.moved(), 0);
    }

    #[test]
    fn a_pending_sample_not_yet_late_holds_its_batch_and_says_when_to_look_again() {
        let mut seq = SampleSequence::new();
        seq.sent(0, 1);
        seq.sent(1, 1);
        seq.finished(1, [Some(1)]);
        let due = Duration::from_millis(30);
        assert_eq!(seq.take(2, |_| Lateness::DueIn(due)), None);
        assert_eq!(seq.wake_in(), Some(due));
    }

    #[test]
    fn a_late_sample_moves_to_the_first_batch_after_it_finishes() {
        let mut seq = SampleSequence::new();
        for task in 0..6 {
            seq.sent(task, 1);
        }
        for task in [1, 2, 3] {
            seq.finished(task, [Some(task)]);
        }
        let late = |task: u64| {
            if task == 0 {
                Lateness::Late
            } else {
                Lateness::Never
            }
        };
        assert_eq!(seq.take(2, late), Some(vec![1, 2]));
        assert_eq!(seq.moved(), 1);
        // Still loading: the engine times its task when it finishes.
        assert_eq!(
            (seq.moved_running(), seq.moved_of(0), seq.moved_of(4)),
            (1, 1, 0)
        );
        seq.finished(0, [Some(0)]);
        assert_eq!((seq.moved_running(), seq.moved_of(0)), (0, 0));
        seq.finished(4, [Some(4)]);
        assert_eq!(seq.take(2, never), Some(vec![0, 3]));
        seq.finished(5, [Some(5)]);
        assert_eq!(seq.take(2, never), Some(vec![4, 5]));
        assert_eq!(seq.ready(), 0);
    }

    #[test]
    fn skipped_samples_are_passed_over() {
        let mut seq = SampleSequence::new();
        seq.sent(0, 3);
        seq.sent(1, 1);
        seq.finished(0, [Some(0), None, Some(2)]);
        assert_eq!(seq.take(2, never), Some(vec![0, 2]));
        assert_eq!(seq.take(1, never), None);
        seq.finished(1, [Some(3)]);
        assert_eq!(seq.take(1, never), Some(vec![3]));
    }

    #[test]
    fn a_late_sample_keeps_its_place_while_its_batch_cannot_do_without_it() {
        let mut seq = SampleSequence::new();
        seq.sent(0, 1);
        seq.sent(1, 1);
        seq.sent(2, 1);
        seq.finished(1, [Some(1)]);
        let late_zero = |task: u64| {
            if task == 0 {
                Lateness::Late
            } else {
                Lateness::Never
            }
        };
        assert_eq!(seq.take(2, late_zero), None, "sample 2 is pending too");
        seq.finished(0, [Some(0)]);
        assert_eq!(seq.take(2, late_zero), Some(vec![0, 1]));
        assert_eq!(seq.moved(), 0);
    }

    #[test]
    fn a_task_is_asked_once_per_take_and_a_late_runs_samples_all_move() {
        let mut seq = SampleSequence::new();
        seq.sent(0, 3);
        seq.sent(1, 2);
        seq.finished(1, [Some(3), Some(4)]);
        let mut asked = 0;
        let batch = seq.take(2, |task| {
            asked += 1;
            assert_eq!(task, 0);
            Lateness::Late
        });
        assert_eq!(batch, Some(vec![3, 4]));
        assert_eq!(asked, 1);
        assert_eq!(seq.moved(), 3);
        seq.finished(0, [Some(0), None, Some(2)]);
        assert_eq!(seq.ready(), 2);
        assert_eq!(seq.take(2, never), Some(vec![0, 2]));
    }
}
