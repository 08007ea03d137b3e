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
    pub fn percentile(&self, q: f64) -> Option<Duration> {
        if self.window.is_empty() {
            return None;
        }
        let mut sorted: Vec<Duration> = self.window.iter().copied().collect();
        sorted.sort_unstable();
        let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.saturating_sub(1).min(sorted.len() - 1)])
    }
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
    fn old_times_leave_the_window() {
        let mut times = FetchTimes::new(4);
        for n in [100, 100, 100, 100, 1, 1, 1, 1] {
            times.record(ms(n));
        }
        assert_eq!(times.percentile(1.0), Some(ms(1)));
        assert_eq!(times.recorded(), 8);
    }
}
