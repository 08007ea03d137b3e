//! The stretches of time in which tasks that late samples moved out of ran,
//! overlapping ones merged: one stall of the machine (threads kept off
//! their cores together) moves the samples of every task it catches, yet
//! batches loaded whole would have waited on it once.

use std::time::{Duration, Instant};

/// An epoch's moved tasks' run times, merged where they overlap.
#[derive(Debug, Default)]
pub(crate) struct MovedStalls {
    /// Disjoint, in time order.
    spans: Vec<(Instant, Instant)>,
}

impl MovedStalls {
    /// A task a sample moved out of ran from `started` to `ended`.
    pub fn add(&mut self, started: Instant, ended: Instant) {
        let (mut start, mut end) = (started, ended.max(started));
        // Spans are few (a handful an epoch where whole batches may
        // follow): a linear merge is enough.
        self.spans.retain(|&(other_start, other_end)| {
            let overlaps = other_start <= end && start <= other_end;
            if overlaps {
                start = start.min(other_start);
                end = end.max(other_end);
            }
            !overlaps
        });
        let at = self.spans.partition_point(|&(other, _)| other < start);
        self.spans.insert(at, (start, end));
    }

    /// How many separate stalls moved samples.
    pub fn count(&self) -> usize {
        self.spans.len()
    }

    /// The longest of them.
    pub fn longest(&self) -> Option<Duration> {
        self.spans.iter().map(|&(start, end)| end - start).max()
    }

    pub fn clear(&mut self) {
        self.spans.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn overlapping_tasks_are_one_stall() {
        let base = Instant::now();
        let mut stalls = MovedStalls::default();
        assert_eq!((stalls.count(), stalls.longest()), (0, None));
        stalls.add(at(base, 10), at(base, 50));
        stalls.add(at(base, 40), at(base, 90));
        stalls.add(at(base, 0), at(base, 20));
        assert_eq!(stalls.count(), 1);
        assert_eq!(stalls.longest(), Some(Duration::from_millis(90)));
    }

    #[test]
    fn separate_tasks_are_separate_stalls_until_one_bridges_them() {
        let base = Instant::now();
        let mut stalls = MovedStalls::default();
        stalls.add(at(base, 100), at(base, 120));
        stalls.add(at(base, 0), at(base, 30));
        stalls.add(at(base, 200), at(base, 210));
        assert_eq!(stalls.count(), 3);
        assert_eq!(stalls.longest(), Some(Duration::from_millis(30)));
        stalls.add(at(base, 25), at(base, 105));
        assert_eq!(stalls.count(), 2);
        assert_eq!(stalls.longest(), Some(Duration::from_millis(120)));
        stalls.clear();
        assert_eq!(stalls.count(), 0);
    }
}
