//! The per-sample timeout past which a sample is flagged slow.

use std::collections::VecDeque;
use std::time::Duration;

use super::fetch_times::FetchTimes;

/// How the slow-sample timeout is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SampleTimeout {
    /// No sample is ever flagged slow.
    Off,
    /// A fixed timeout per sample.
    Fixed(Duration),
    /// Estimated while running (MinatoLoader §4.2): after `warmup` samples
    /// the 75th percentile of recent fetch times, the 90th for a while when
    /// too many samples get flagged, re-estimated as the workload drifts.
    Auto { warmup: u64 },
}

/// Recent fetch times this many samples long feed the estimate.
const WINDOW: usize = 1024;
/// Re-estimate after this many more samples.
const UPDATE_EVERY: u64 = 32;
/// The 75th percentile should flag about a quarter of the samples; past
/// this fraction, flagging has stopped singling out outliers.
const TOO_MANY_SLOW: f64 = 0.4;
/// Updates spent on the 90th percentile before trying the 75th again.
const HIGH_PERCENTILE_UPDATES: u32 = 8;
/// Recent samples over which the flagged fraction is measured.
const FLAGGED_WINDOW: usize = 256;
/// The estimate never goes below this. Flagging a sample costs a replacement
/// thread and a deferral (tens of microseconds); for samples of microseconds
/// the 75th percentile flags a quarter of them for nothing, and their times
/// are mostly contention (the GIL handed over inside the dataset's code, the
/// cores), not slowness of the sample itself. (The wait to take the GIL
/// before a task is left out of fetch times: see `TaskClock`.)
const MIN_AUTO_TIMEOUT: Duration = Duration::from_millis(1);

/// Where batches keep the sampler's order, a sample leaves its batch only
/// once it has run this many times the median fetch time...
const LATE_FACTOR: u32 = 8;
/// ...and at least this long (and `LATE_FACTOR` times the automatic
/// timeout's floor): ordinary jitter, a GC pause, a worker's first task must
/// not move samples, or a seeded run would not repeat.
const LATE_FLOOR: Duration = Duration::from_millis(100);

/// Keeps the current timeout from the fetch times workers report.
pub(crate) struct TimeoutEstimator {
    policy: SampleTimeout,
    times: FetchTimes,
    flagged: VecDeque<bool>,
    flagged_count: usize,
    since_update: u64,
    high_percentile_updates_left: u32,
    current: Option<Duration>,
    /// The automatic estimate's floor (see `MIN_AUTO_TIMEOUT`).
    min_auto: Duration,
    /// What `late_after` answers, as last estimated, and the samples
    /// recorded since.
    late: Option<Duration>,
    late_due: u64,
}

impl TimeoutEstimator {
    pub fn new(policy: SampleTimeout) -> Self {
        let current = match policy {
            SampleTimeout::Fixed(timeout) => Some(timeout),
            _ => None,
        };
        let mut estimator = TimeoutEstimator {
            policy,
            times: FetchTimes::new(WINDOW),
            flagged: VecDeque::with_capacity(FLAGGED_WINDOW),
            flagged_count: 0,
            since_update: 0,
            high_percentile_updates_left: 0,
            current,
            min_auto: MIN_AUTO_TIMEOUT,
            late: None,
            late_due: UPDATE_EVERY,
        };
        estimator.late = estimator.estimate_late();
        estimator
    }

    /// Raises (or lowers) the automatic estimate's floor: where a
    /// replacement worker costs more (a worker process to start), only
    /// samples past it are worth one. A fixed timeout is kept as given.
    pub fn set_min_auto(&mut self, floor: Duration) {
        self.min_auto = floor;
        if matches!(self.policy, SampleTimeout::Auto { .. }) {
            self.current = self.current.map(|current| current.max(floor));
        }
        self.late = self.estimate_late();
    }

    /// The timeout per sample now; None while warming up or when off.
    pub fn current(&self) -> Option<Duration> {
        self.current
    }

    /// How long a sample may run before it leaves its batch, where batches
    /// keep the sampler's order: a fixed timeout as given; automatically,
    /// `LATE_FACTOR` times the median of recent fetch times, at least
    /// `LATE_FLOOR` (and `LATE_FACTOR` times the timeout's floor: a worker
    /// process's round trip); never when off. Re-estimated as the timeout
    /// is (the median sorts the recent times: not on every call).
    pub fn late_after(&self) -> Option<Duration> {
        self.late
    }

    fn estimate_late(&self) -> Option<Duration> {
        match self.policy {
            SampleTimeout::Off => None,
            SampleTimeout::Fixed(timeout) => Some(timeout),
            SampleTimeout::Auto { .. } => {
                let floor = LATE_FLOOR.max(self.min_auto.saturating_mul(LATE_FACTOR));
                let median = self.times.percentile(0.5).unwrap_or_default();
                Some(median.saturating_mul(LATE_FACTOR).max(floor))
            }
        }
    }

    /// Records `samples` samples that took `per_sample` each; `slow` when flagged.
    pub fn record(&mut self, per_sample: Duration, samples: usize, slow: bool) {
        for _ in 0..samples {
            self.times.record(per_sample);
            if self.flagged.len() == FLAGGED_WINDOW && self.flagged.pop_front() == Some(true) {
                self.flagged_count -= 1;
            }
            self.flagged.push_back(slow);
            self.flagged_count += usize::from(slow);
        }
        self.since_update += samples as u64;
        if let SampleTimeout::Auto { warmup } = self.policy {
            let warmed_up = self.times.recorded() >= warmup.max(1);
            if warmed_up && (self.current.is_none() || self.since_update >= UPDATE_EVERY) {
                self.update();
            }
            // Before the warm-up too: the first batches may hold a stuck sample.
            if self.late_due >= UPDATE_EVERY {
                self.late = self.estimate_late();
                self.late_due = 0;
            }
            self.late_due += samples as u64;
        }
    }

    /// The share of recent samples that were flagged slow.
    pub fn flagged_fraction(&self) -> f64 {
        if self.flagged.is_empty() {
            0.0
        } else {
            self.flagged_count as f64 / self.flagged.len() as f64
        }
    }

    fn update(&mut self) {
        self.since_update = 0;
        if self.flagged.len() >= FLAGGED_WINDOW / 4 && self.flagged_fraction() > TOO_MANY_SLOW {
            self.high_percentile_updates_left = HIGH_PERCENTILE_UPDATES;
        }
        let quantile = if self.high_percentile_updates_left > 0 {
            self.high_percentile_updates_left -= 1;
            0.90
        } else {
            0.75
        };
        self.current = self
            .times
            .percentile(quantile)
            .map(|estimate| estimate.max(self.min_auto));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_floor_holds_for_the_estimate_but_not_a_fixed_timeout() {
        let mut auto = TimeoutEstimator::new(SampleTimeout::Auto { warmup: 4 });
        auto.record(Duration::from_millis(2), 64, false);
        assert_eq!(auto.current(), Some(Duration::from_millis(2)));
        auto.set_min_auto(Duration::from_millis(50));
        assert_eq!(auto.current(), Some(Duration::from_millis(50)));
        auto.record(Duration::from_millis(2), 64, false);
        assert_eq!(auto.current(), Some(Duration::from_millis(50)));
        let mut fixed = TimeoutEstimator::new(SampleTimeout::Fixed(Duration::from_millis(3)));
        fixed.set_min_auto(Duration::from_millis(50));
        assert_eq!(fixed.current(), Some(Duration::from_millis(3)));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_sample_is_late_past_eight_medians_and_never_before_the_floor() {
        let mut auto = TimeoutEstimator::new(SampleTimeout::Auto { warmup: 4 });
        assert_eq!(auto.late_after(), Some(LATE_FLOOR), "before any sample");
        auto.record(ms(2), 64, false);
        assert_eq!(auto.late_after(), Some(LATE_FLOOR));
        auto.record(ms(40), 200, false);
        assert_eq!(auto.late_after(), Some(ms(320)));
        auto.set_min_auto(ms(50));
        assert_eq!(auto.late_after(), Some(ms(400)), "a worker process's floor");
        let fixed = TimeoutEstimator::new(SampleTimeout::Fixed(ms(5)));
        assert_eq!(fixed.late_after(), Some(ms(5)));
        assert_eq!(TimeoutEstimator::new(SampleTimeout::Off).late_after(), None);
    }

    #[test]
    fn off_and_fixed_never_change() {
        let mut off = TimeoutEstimator::new(SampleTimeout::Off);
        let mut fixed = TimeoutEstimator::new(SampleTimeout::Fixed(ms(5)));
        for _ in 0..500 {
            off.record(ms(1), 1, false);
            fixed.record(ms(100), 1, true);
        }
        assert_eq!(off.current(), None);
        assert_eq!(fixed.current(), Some(ms(5)));
    }

    #[test]
    fn auto_waits_for_the_warmup_then_takes_the_75th_percentile() {
        let mut auto = TimeoutEstimator::new(SampleTimeout::Auto { warmup: 100 });
        for n in 0..99 {
            auto.record(ms(n % 100 + 1), 1, false);
        }
        assert_eq!(auto.current(), None);
        auto.record(ms(100), 1, false);
        assert_eq!(auto.current(), Some(ms(75)));
    }

    #[test]
    fn auto_falls_back_to_the_90th_percentile_when_too_many_are_flagged() {
        let mut auto = TimeoutEstimator::new(SampleTimeout::Auto { warmup: 100 });
        for n in 0..100 {
            auto.record(ms(n + 1), 1, false);
        }
        assert_eq!(auto.current(), Some(ms(75)));
        for n in 0..100 {
            auto.record(ms(n + 1), 1, true);
        }
        let timeout = auto.current().unwrap();
        assert!(timeout >= ms(85) && timeout <= ms(90), "{timeout:?}");
    }

    #[test]
    fn auto_never_goes_below_a_millisecond() {
        let mut auto = TimeoutEstimator::new(SampleTimeout::Auto { warmup: 10 });
        for _ in 0..100 {
            auto.record(Duration::from_micros(15), 1, false);
        }
        assert_eq!(auto.current(), Some(MIN_AUTO_TIMEOUT));
        // A fixed timeout is the user's: no floor.
        let fixed = TimeoutEstimator::new(SampleTimeout::Fixed(Duration::from_micros(50)));
        assert_eq!(fixed.current(), Some(Duration::from_micros(50)));
    }

    #[test]
    fn auto_follows_a_drifting_workload() {
        let mut auto = TimeoutEstimator::new(SampleTimeout::Auto { warmup: 10 });
        for _ in 0..WINDOW {
            auto.record(ms(10), 1, false);
        }
        assert_eq!(auto.current(), Some(ms(10)));
        for _ in 0..WINDOW {
            auto.record(ms(40), 1, false);
        }
        assert_eq!(auto.current(), Some(ms(40)));
    }
}
