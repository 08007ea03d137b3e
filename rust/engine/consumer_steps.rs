//! The consumer's steps: its time between receiving an output and asking for
//! the next, the training loop's own work. Worker threads that share its GIL
//! lengthen them; the adaptive controller weighs that against the data a
//! worker adds, and the stats report it. Its waits (from asking to
//! receiving) are kept too: a step plus a wait is one iteration of the loop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where the consumer is in its loop.
#[derive(Debug, Default, Clone, Copy)]
enum Phase {
    /// At the start of an epoch: its first request follows no step.
    #[default]
    Starting,
    /// Stepping since it received an output.
    Stepping(Instant),
    /// Waiting since it asked for one.
    Waiting(Instant),
}

/// Sums over a window and since the start, of one kind of interval.
#[derive(Debug, Default)]
struct Intervals {
    window_nanos: AtomicU64,
    window_count: AtomicU64,
    total_nanos: AtomicU64,
    total_count: AtomicU64,
}

impl Intervals {
    fn add(&self, since: Instant) {
        let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.window_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.window_count.fetch_add(1, Ordering::Relaxed);
        self.total_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.total_count.fetch_add(1, Ordering::Relaxed);
    }

    fn take_window(&self) -> Option<f64> {
        let count = self.window_count.swap(0, Ordering::Relaxed);
        let nanos = self.window_nanos.swap(0, Ordering::Relaxed);
        (count > 0).then(|| nanos as f64 / 1e9 / count as f64)
    }

    fn mean(&self) -> Option<Duration> {
        let count = self.total_count.load(Ordering::Relaxed);
        let nanos = self.total_nanos.load(Ordering::Relaxed);
        nanos.checked_div(count).map(Duration::from_nanos)
    }
}

/// The consumer's mean step and wait over a window, in seconds; None where
/// it took none.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct LoopWindow {
    pub step: Option<f64>,
    pub wait: Option<f64>,
}

#[derive(Debug, Default)]
pub(crate) struct ConsumerSteps {
    phase: Mutex<Phase>,
    steps: Intervals,
    waits: Intervals,
}

impl ConsumerSteps {
    /// The consumer received an output: its wait ends, its step starts.
    pub fn received(&self) {
        let mut phase = self.lock();
        if let Phase::Waiting(asked) = *phase {
            self.waits.add(asked);
        }
        *phase = Phase::Stepping(Instant::now());
    }

    /// The consumer asks for its next output: the step since it received
    /// the last one is counted, and its wait starts.
    pub fn asked(&self) {
        let mut phase = self.lock();
        if let Phase::Stepping(received) = *phase {
            self.steps.add(received);
        }
        *phase = Phase::Waiting(Instant::now());
    }

    /// A new epoch: the time between the last epoch's end and its first
    /// request (evaluation, checkpoints) is not a step.
    pub fn new_epoch(&self) {
        *self.lock() = Phase::Starting;
    }

    /// The mean step and wait since the last call.
    pub fn take_window(&self) -> LoopWindow {
        LoopWindow {
            step: self.steps.take_window(),
            wait: self.waits.take_window(),
        }
    }

    /// The mean step since the start.
    pub fn mean(&self) -> Option<Duration> {
        self.steps.mean()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;

    #[test]
    fn a_step_runs_from_a_receipt_to_the_next_request() {
        let steps = ConsumerSteps::default();
        steps.asked(); // the epoch's first request follows no step
        assert_eq!(steps.take_window().step, None);
        steps.received();
        thread::sleep(Duration::from_millis(20));
        steps.asked();
        steps.asked(); // the same wait again: no second step
        let window = steps.take_window().step.unwrap();
        assert!(window >= 0.02, "{window}");
        assert_eq!(steps.take_window(), LoopWindow::default());
        assert!(steps.mean().unwrap() >= Duration::from_millis(20));
    }

    #[test]
    fn the_gap_between_epochs_is_not_a_step() {
        let steps = ConsumerSteps::default();
        steps.received();
        steps.new_epoch();
        steps.asked();
        assert_eq!(steps.take_window().step, None);
        assert_eq!(steps.mean(), None);
    }

    #[test]
    fn a_wait_runs_from_a_request_to_the_receipt() {
        let steps = ConsumerSteps::default();
        steps.received(); // no request before it: no wait
        assert_eq!(steps.take_window().wait, None);
        steps.asked();
        thread::sleep(Duration::from_millis(20));
        steps.received();
        let window = steps.take_window();
        assert!(window.wait.unwrap() >= 0.02, "{window:?}");
        assert!(window.step.unwrap() < 0.02, "{window:?}");
    }
}
