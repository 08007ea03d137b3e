//! A task's clock: the time its worker spent paused (waiting to take the
//! GIL, for the Python bindings) does not count as the task's own.
//!
//! A worker blocked on a lock the whole process shares is not slow: flagging
//! it would start a replacement thread that only adds to the contention, and
//! counting the wait in fetch times would raise the automatic timeout for
//! every sample.
//!
//! A worker running a run of samples may also report each sample as it
//! begins ([`TaskClock::begin_sample`]): the run is then judged by the
//! sample it is on, not by the run's whole time against a bound scaled by
//! its samples, under which one slow sample in a long run showed late only
//! after the whole run's bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `pause_began` when no pause is under way.
const NOT_PAUSED: u64 = u64::MAX;
/// `sample_began` while the task has reported no sample.
const NO_SAMPLE: u64 = u64::MAX;

/// The paused time of the task a worker is running, shared between the
/// worker (which reports pauses, see [`Self::pause`]) and the timeout
/// monitor (which reads it while the task runs). One per worker thread,
/// reset at each task.
#[derive(Clone)]
pub struct TaskClock(Arc<Shared>);

struct Shared {
    /// What `pause_began` counts from.
    origin: Instant,
    /// Nanoseconds of the current task spent in pauses that have ended.
    paused: AtomicU64,
    /// When the pause under way began, in nanoseconds since `origin`, or
    /// [`NOT_PAUSED`]. Kept apart from `paused` so the monitor also leaves
    /// out a wait still under way: a worker waiting longer than the timeout
    /// would otherwise be flagged before it got to report the wait.
    pause_began: AtomicU64,
    /// When the sample the task is on began, in nanoseconds since `origin`,
    /// or [`NO_SAMPLE`] while it has reported none.
    sample_began: AtomicU64,
    /// The task's ended pauses when that sample began: the sample's own
    /// pauses are the ones since.
    paused_before_sample: AtomicU64,
}

impl Default for TaskClock {
    fn default() -> Self {
        TaskClock(Arc::new(Shared {
            origin: Instant::now(),
            paused: AtomicU64::new(0),
            pause_began: AtomicU64::new(NOT_PAUSED),
            sample_began: AtomicU64::new(NO_SAMPLE),
            paused_before_sample: AtomicU64::new(0),
        }))
    }
}

impl TaskClock {
    /// Starts a pause, which ends when the returned guard is ended or
    /// dropped. A pause started while another is under way is part of that
    /// one and adds nothing.
    pub fn pause(&self) -> Pause<'_> {
        let began = Instant::now();
        let since_origin = nanos(began.duration_since(self.0.origin)).min(NOT_PAUSED - 1);
        let counted = self
            .0
            .pause_began
            .compare_exchange(
                NOT_PAUSED,
                since_origin,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        Pause {
            clock: self,
            began,
            counted,
        }
    }

    /// Time the current task has spent paused up to `now`, the pause under
    /// way included.
    pub(crate) fn paused(&self, now: Instant) -> Duration {
        // The pause under way is read first: a pause ending adds to `paused`
        // before it clears `pause_began`, so a read that races with it can
        // count that pause twice (the task looks less overdue, for an
        // instant) but never miss it (a false flag).
        let began = self.0.pause_began.load(Ordering::Acquire);
        let ended = Duration::from_nanos(self.0.paused.load(Ordering::Acquire));
        let under_way = if began == NOT_PAUSED {
            Duration::ZERO
        } else {
            now.saturating_duration_since(self.0.origin + Duration::from_nanos(began))
        };
        ended + under_way
    }

    /// The worker begins the next sample of its task (see the module's
    /// note). Called between samples, never inside a pause.
    pub fn begin_sample(&self) {
        let shared = &self.0;
        let since_origin = nanos(shared.origin.elapsed()).min(NO_SAMPLE - 1);
        // Stored before the start it goes with: a read racing with the two
        // stores may pair the old sample's start with the new pauses, which
        // only makes the sample look shorter for an instant, never late.
        let paused = shared.paused.load(Ordering::Acquire);
        shared.paused_before_sample.store(paused, Ordering::Release);
        shared.sample_began.store(since_origin, Ordering::Release);
    }

    /// How long the sample the task is on has worked up to `now`, its
    /// pauses left out; None while the task has reported no sample.
    pub(crate) fn sample_worked(&self, now: Instant) -> Option<Duration> {
        let shared = &self.0;
        let began = shared.sample_began.load(Ordering::Acquire);
        if began == NO_SAMPLE {
            return None;
        }
        let before = Duration::from_nanos(shared.paused_before_sample.load(Ordering::Acquire));
        let since = now.saturating_duration_since(shared.origin + Duration::from_nanos(began));
        Some(since.saturating_sub(self.paused(now).saturating_sub(before)))
    }

    /// Starts the count again for the next task. The worker calls it before
    /// the monitor can see the task, so no read races with it.
    pub(crate) fn reset(&self) {
        self.0.paused.store(0, Ordering::Release);
        self.0.pause_began.store(NOT_PAUSED, Ordering::Release);
        self.0.sample_began.store(NO_SAMPLE, Ordering::Release);
        self.0.paused_before_sample.store(0, Ordering::Release);
    }
}

/// A pause under way on a [`TaskClock`]; see [`TaskClock::pause`].
pub struct Pause<'a> {
    clock: &'a TaskClock,
    began: Instant,
    /// False for a pause inside another: the outer one counts the time.
    counted: bool,
}

impl Pause<'_> {
    /// Ends the pause; returns how long it lasted (also for a pause inside
    /// another, which the clock does not count on its own).
    pub fn end(mut self) -> Duration {
        self.record()
    }

    fn record(&mut self) -> Duration {
        let lasted = self.began.elapsed();
        if std::mem::take(&mut self.counted) {
            let shared = &self.clock.0;
            shared.paused.fetch_add(nanos(lasted), Ordering::AcqRel);
            shared.pause_began.store(NOT_PAUSED, Ordering::Release);
        }
        lasted
    }
}

impl Drop for Pause<'_> {
    /// A pause not ended explicitly (a panic unwinding through it) ends here.
    fn drop(&mut self) {
        self.record();
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_add_up_and_one_under_way_counts_to_now() {
        let clock = TaskClock::default();
        let now = Instant::now();
        assert_eq!(clock.paused(now), Duration::ZERO);
        let waited = clock.pause().end();
        let after_one = clock.paused(Instant::now());
        assert!(after_one >= waited, "{after_one:?} < {waited:?}");
        let pause = clock.pause();
        let later = Instant::now() + Duration::from_secs(5);
        // The pause under way counts up to the time asked about.
        assert!(clock.paused(later) >= after_one + Duration::from_secs(5));
        drop(pause);
        let ended = clock.paused(later);
        assert!(ended < after_one + Duration::from_secs(5), "{ended:?}");
        clock.reset();
        assert_eq!(clock.paused(later), Duration::ZERO);
    }

    #[test]
    fn a_reported_sample_is_timed_from_its_own_start_without_its_pauses() {
        let clock = TaskClock::default();
        assert_eq!(clock.sample_worked(Instant::now()), None);
        std::thread::sleep(Duration::from_millis(30));
        let before_sample = Instant::now();
        clock.begin_sample();
        let pause = clock.pause();
        std::thread::sleep(Duration::from_millis(20));
        let paused = pause.end();
        let now = Instant::now();
        let worked = clock.sample_worked(now).unwrap();
        // Neither the task's first 30 ms nor the sample's pause.
        let bound = now.duration_since(before_sample) - paused;
        assert!(worked <= bound, "{worked:?} > {bound:?}");
        let later = Instant::now() + Duration::from_secs(5);
        assert!(clock.sample_worked(later).unwrap() >= Duration::from_secs(5));
        clock.reset();
        assert_eq!(clock.sample_worked(later), None);
    }

    #[test]
    fn a_pause_inside_another_is_counted_once() {
        let clock = TaskClock::default();
        let outer = clock.pause();
        let inner = clock.pause();
        std::thread::sleep(Duration::from_millis(20));
        let inner_waited = inner.end();
        let outer_waited = outer.end();
        assert!(inner_waited >= Duration::from_millis(20));
        let paused = clock.paused(Instant::now());
        assert!(paused >= outer_waited && paused < outer_waited + inner_waited);
    }
}
