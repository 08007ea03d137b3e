//! What an engine reports about itself: a snapshot type, and the consumer's
//! ready-queue occupancy, shared with the adaptive controller.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::controller::Resize;
use super::fetch_times::FetchTimes;

/// An engine's figures at one moment. Times are totals since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    /// Worker threads running now, replacements for slow samples included.
    pub workers: usize,
    /// (time since start, worker count decided) at the start and each change.
    pub worker_history: Vec<(Duration, usize)>,
    /// The adaptive controller's changes of the count, with why.
    pub resizes: Vec<Resize>,
    /// The count the adaptive controller stands by (a growth step not yet
    /// judged left out), once it judged a window.
    pub settled_workers: Option<usize>,
    /// Samples the workers finished loading (delivered or not).
    pub samples_loaded: u64,
    /// Time workers spent inside tasks, their pauses (waits for the GIL)
    /// included.
    pub busy: Duration,
    /// The workers' own CPU time inside those tasks: near `busy` when they
    /// compute, near zero when they wait (I/O, sleeps, the GIL).
    pub cpu: Duration,
    /// Of those, each worker thread's first task's CPU time and samples
    /// (one-off costs, no sample's).
    pub first_task_cpu: Duration,
    pub first_task_samples: u64,
    /// Mean ready-queue occupancy (0..=1) seen by the consumer when it asked
    /// for the next batch; None before it asked.
    pub occupancy: Option<f64>,
    /// How many times it asked (the occupancy's count).
    pub asks: u64,
    /// The consumer's mean step: its time between receiving an output and
    /// asking for the next (the training loop's own work); None before one.
    pub loop_step: Option<Duration>,
    pub slow_samples: u64,
    /// Samples that left their batch while late, where batches keep the
    /// sampler's order.
    pub moved_samples: u64,
    /// Of this epoch's moved samples, those still loading...
    pub moved_running: usize,
    /// ...and, among those done, the separate stretches of time their
    /// tasks ran in (overlapping tasks are one stall)...
    pub moved_stalls: usize,
    /// ...and the longest of those stretches.
    pub longest_moved: Option<Duration>,
    pub sample_timeout: Option<Duration>,
    pub fetch_p50: Option<Duration>,
    pub fetch_p90: Option<Duration>,
    pub fetch_p99: Option<Duration>,
}

impl EngineStats {
    /// These figures with the fetch-time percentiles of `times`.
    pub(crate) fn with_fetch_times(self, times: &FetchTimes) -> Self {
        let [fetch_p50, fetch_p90, fetch_p99] = times.percentiles([0.5, 0.9, 0.99]);
        EngineStats {
            fetch_p50,
            fetch_p90,
            fetch_p99,
            ..self
        }
    }
}

/// Occupancy in millionths, so that it fits an atomic counter.
const SCALE: f64 = 1e6;

/// Ready-queue occupancy as the consumer sees it when it asks for a batch:
/// a running total, and the current window's for the controller.
#[derive(Debug, Default)]
pub(crate) struct Occupancy {
    window_sum: AtomicU64,
    window_count: AtomicU64,
    total_sum: AtomicU64,
    total_count: AtomicU64,
    /// The consumer is inside `recv`, waiting for its batch.
    consumer_waiting: AtomicBool,
}

/// Whether a consumer's call is a new request for an output or the same
/// one again after a wait ran out (it looked for signals meanwhile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    New,
    Again,
}

/// Marks the consumer as waiting for a batch until dropped.
pub(crate) struct ConsumerWaiting(Arc<Occupancy>);

impl ConsumerWaiting {
    pub fn new(occupancy: Arc<Occupancy>) -> Self {
        occupancy.consumer_waiting.store(true, Ordering::Relaxed);
        ConsumerWaiting(occupancy)
    }
}

impl Drop for ConsumerWaiting {
    fn drop(&mut self) {
        self.0.consumer_waiting.store(false, Ordering::Relaxed);
    }
}

impl Occupancy {
    pub fn record(&self, ready: usize, capacity: usize) {
        let fraction = (ready as f64 / capacity.max(1) as f64).clamp(0.0, 1.0);
        let scaled = (fraction * SCALE) as u64;
        self.window_sum.fetch_add(scaled, Ordering::Relaxed);
        self.window_count.fetch_add(1, Ordering::Relaxed);
        self.total_sum.fetch_add(scaled, Ordering::Relaxed);
        self.total_count.fetch_add(1, Ordering::Relaxed);
    }

    /// The mean since the last call. A consumer that asked before the
    /// window and is still waiting found nothing ready all along: 0. None
    /// when it neither asked nor waited.
    pub fn take_window(&self) -> Option<f64> {
        let count = self.window_count.swap(0, Ordering::Relaxed);
        let sum = self.window_sum.swap(0, Ordering::Relaxed);
        if count == 0 {
            return self.consumer_waiting.load(Ordering::Relaxed).then_some(0.0);
        }
        Some(sum as f64 / SCALE / count as f64)
    }

    /// How many requests the mean since the start counts.
    pub fn asks(&self) -> u64 {
        self.total_count.load(Ordering::Relaxed)
    }

    /// The mean since the start.
    pub fn mean(&self) -> Option<f64> {
        let count = self.total_count.load(Ordering::Relaxed);
        let sum = self.total_sum.load(Ordering::Relaxed);
        (count > 0).then(|| sum as f64 / SCALE / count as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occupancy_windows_reset_and_the_total_does_not() {
        let occupancy = Occupancy::default();
        assert_eq!(occupancy.take_window(), None);
        occupancy.record(0, 4);
        occupancy.record(4, 4);
        occupancy.record(9, 4); // clamped to full
        let window = occupancy.take_window().unwrap();
        assert!((window - 2.0 / 3.0).abs() < 1e-6);
        assert_eq!(occupancy.take_window(), None);
        occupancy.record(1, 4);
        let mean = occupancy.mean().unwrap();
        assert!((mean - (2.25 / 4.0)).abs() < 1e-6);
    }

    #[test]
    fn a_consumer_still_waiting_counts_as_finding_nothing_ready() {
        let occupancy = Arc::new(Occupancy::default());
        let waiting = ConsumerWaiting::new(occupancy.clone());
        assert_eq!(occupancy.take_window(), Some(0.0));
        occupancy.record(2, 4);
        assert_eq!(
            occupancy.take_window(),
            Some(0.5),
            "what it saw when it asked"
        );
        drop(waiting);
        assert_eq!(occupancy.take_window(), None);
    }
}
