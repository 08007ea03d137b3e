//! The consumer's steps: its time between receiving an output and asking for
//! the next, the training loop's own work. Worker threads that share its GIL
//! lengthen them; the adaptive controller weighs that against the data a
//! worker adds, and the stats report it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub(crate) struct ConsumerSteps {
    /// When the consumer last received an output; None at the start of an
    /// epoch, whose first request follows no step.
    received: Mutex<Option<Instant>>,
    window_nanos: AtomicU64,
    window_count: AtomicU64,
    total_nanos: AtomicU64,
    total_count: AtomicU64,
}

impl ConsumerSteps {
    /// The consumer received an output: its step starts.
    pub fn received(&self) {
        *self.lock() = Some(Instant::now());
    }

    /// The consumer asks for its next output: the step since it received
    /// the last one is counted.
    pub fn asked(&self) {
        let Some(received) = self.lock().take() else {
            return;
        };
        let nanos = u64::try_from(received.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.window_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.window_count.fetch_add(1, Ordering::Relaxed);
        self.total_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.total_count.fetch_add(1, Ordering::Relaxed);
    }

    /// A new epoch: the time between the last epoch's end and its first
    /// request (evaluation, checkpoints) is not a step.
    pub fn new_epoch(&self) {
        *self.lock() = None;
    }

    /// The mean step, in seconds, since the last call; None without steps.
    pub fn take_window(&self) -> Option<f64> {
        let count = self.window_count.swap(0, Ordering::Relaxed);
        let nanos = self.window_nanos.swap(0, Ordering::Relaxed);
        (count > 0).then(|| nanos as f64 / 1e9 / count as f64)
    }

    /// The mean step since the start.
    pub fn mean(&self) -> Option<Duration> {
        let count = self.total_count.load(Ordering::Relaxed);
        let nanos = self.total_nanos.load(Ordering::Relaxed);
        nanos.checked_div(count).map(Duration::from_nanos)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.received
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
        assert_eq!(steps.take_window(), None);
        steps.received();
        thread::sleep(Duration::from_millis(20));
        steps.asked();
        steps.asked(); // the same wait again: no second step
        let window = steps.take_window().unwrap();
        assert!(window >= 0.02, "{window}");
        assert_eq!(steps.take_window(), None);
        assert!(steps.mean().unwrap() >= Duration::from_millis(20));
    }

    #[test]
    fn the_gap_between_epochs_is_not_a_step() {
        let steps = ConsumerSteps::default();
        steps.received();
        steps.new_epoch();
        steps.asked();
        assert_eq!(steps.take_window(), None);
        assert_eq!(steps.mean(), None);
    }
}
