//! A sliding window of recent per-sample fetch times, for percentiles.

use std::collections::VecDeque;
use std::time::Duration;

/// The last `capacity` per-sample fetch times.
pub(crate) struct FetchTimes {
    window: VecDeque<Duration>,
    capacity: usize,
    recorded: u64,
}

impl FetchTimes {
    pub fn new(capacity: usize) -> Self {
        FetchTimes {
            window: VecDeque::with_capacity(capacity),
            capacity: capacity.max(1),
            recorded: 0,
        }
    }

    pub fn record(&mut self, time: Duration) {
        if self.window.len() == self.capacity {
            self.window.pop_front();
        }
        self.window.push_back(time);
        self.recorded += 1;
    }

    /// Samples recorded since the start, not only those in the window.
    pub fn recorded(&self) -> u64 {
        self.recorded
    }

    /// The `q`-quantile (0..=1) of the window, nearest-rank; None when empty.
    /// Linear time: the sample engine asks for the median once per batch.
    pub fn percentile(&self, q: f64) -> Option<Duration> {
        let mut times: Vec<Duration> = self.window.iter().copied().collect();
        let index = nearest_rank(q, times.len())?;
        Some(*times.select_nth_unstable(index).1)
    }

    /// Several quantiles of the window at once, sorting it once.
    pub fn percentiles<const N: usize>(&self, qs: [f64; N]) -> [Option<Duration>; N] {
        let mut sorted: Vec<Duration> = self.window.iter().copied().collect();
        sorted.sort_unstable();
        qs.map(|q| nearest_rank(q, sorted.len()).map(|index| sorted[index]))
    }
}

/// The index of the nearest-rank `q`-quantile among `len` sorted values.
fn nearest_rank(q: f64, len: usize) -> Option<usize> {
    let rank = (q.clamp(0.0, 1.0) * len as f64).ceil() as usize;
    (len > 0).then(|| rank.saturating_sub(1).min(len - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn percentiles_are_nearest_rank_over_the_window() {
        let mut times = FetchTimes::new(100);
        assert_eq!(times.percentile(0.5), None);
        for n in 1..=100 {
            times.record(ms(n));
        }
        assert_eq!(times.percentile(0.5), Some(ms(50)));
        assert_eq!(times.percentile(0.75), Some(ms(75)));
        assert_eq!(times.percentile(0.9), Some(ms(90)));
        assert_eq!(times.percentile(1.0), Some(ms(100)));
        assert_eq!(times.percentile(0.0), Some(ms(1)));
    }

    #[test]
    fn several_percentiles_at_once_agree_with_one_at_a_time() {
        let mut times = FetchTimes::new(64);
        assert_eq!(times.percentiles([0.5, 0.9]), [None, None]);
        for n in [7, 3, 9, 1, 30, 2, 2, 18, 5] {
            times.record(ms(n));
        }
        let qs = [0.0, 0.5, 0.75, 0.9, 0.99, 1.0];
        assert_eq!(times.percentiles(qs), qs.map(|q| times.percentile(q)));
    }

    #[test]
    fn old_times_leave_the_window() {
        let mut times = FetchTimes::new(4);
        for n in [100, 100, 100, 100, 1, 1, 1, 1] {
            times.record(ms(n));
        }
        assert_eq!(times.percentile(1.0), Some(ms(1)));
        assert_eq!(times.recorded(), 8);
    }
}
