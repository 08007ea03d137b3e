//! What entering the dataset's code costs a task where workers contend for
//! it (Python's GIL): each task waits for it once, on entry, and that wait
//! grows with the workers handing it around, not with the task's samples.
//! Tasks that carry runs of samples pay it once per run: where the waits
//! are long, runs are made long enough that the wait is a small share of
//! the run's work, but never so long that one slow sample keeps much other
//! work behind it (the head-of-line blocking sample-level tasks avoid).

use std::time::Duration;

/// Weight of the newest task's wait in the running mean.
const SMOOTHING: f64 = 0.05;
/// A run's wait to enter should cost at most this share of its work.
const WAIT_SHARE: f64 = 0.05;
/// Runs lengthened for contention take at most this long: samples longer
/// than half of it always go one per task.
pub(crate) const MAX_CONTENDED_RUN: Duration = Duration::from_millis(16);

/// The running mean of the tasks' waits to enter.
#[derive(Debug, Default)]
pub(crate) struct GilContention {
    mean_wait: Option<f64>,
}

impl GilContention {
    /// A task finished; `paused` is how long it waited to enter.
    pub fn record(&mut self, paused: Duration) {
        let wait = paused.as_secs_f64();
        self.mean_wait = Some(match self.mean_wait {
            None => wait,
            Some(mean) => mean + SMOOTHING * (wait - mean),
        });
    }

    /// The least time a task should take: `run_target`, or longer where
    /// the waits to enter are long (up to [`MAX_CONTENDED_RUN`]).
    pub fn run_target(&self, run_target: Duration) -> Duration {
        let Some(wait) = self.mean_wait else {
            return run_target;
        };
        let wanted = Duration::try_from_secs_f64(wait / WAIT_SHARE)
            .unwrap_or(MAX_CONTENDED_RUN)
            .min(MAX_CONTENDED_RUN);
        run_target.max(wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_micros(500);

    fn after(waits: impl IntoIterator<Item = Duration>) -> GilContention {
        let mut contention = GilContention::default();
        for wait in waits {
            contention.record(wait);
        }
        contention
    }

    #[test]
    fn no_waits_keep_the_run_target() {
        assert_eq!(GilContention::default().run_target(BASE), BASE);
        let contention = after(std::iter::repeat_n(Duration::ZERO, 100));
        assert_eq!(contention.run_target(BASE), BASE);
    }

    #[test]
    fn long_waits_lengthen_runs_until_the_wait_is_a_small_share() {
        let contention = after(std::iter::repeat_n(Duration::from_micros(200), 200));
        let target = contention.run_target(BASE);
        assert!(target > Duration::from_micros(3_900) && target < Duration::from_micros(4_100));
    }

    #[test]
    fn runs_never_grow_past_the_head_of_line_bound() {
        let contention = after(std::iter::repeat_n(Duration::from_millis(50), 200));
        assert_eq!(contention.run_target(BASE), MAX_CONTENDED_RUN);
        // A longer target of the caller's own (worker processes') is kept.
        let own = Duration::from_millis(50);
        assert_eq!(contention.run_target(own), own);
    }

    #[test]
    fn the_mean_follows_the_waits_as_they_change() {
        let waits = std::iter::repeat_n(Duration::from_millis(1), 200)
            .chain(std::iter::repeat_n(Duration::ZERO, 200));
        assert_eq!(after(waits).run_target(BASE), BASE);
    }
}
