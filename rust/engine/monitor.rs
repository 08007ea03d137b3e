//! The thread that watches running tasks for the slow-sample timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crossbeam_channel::{bounded, RecvTimeoutError, Sender};

use super::error::EngineError;
use super::pool::{Pool, WorkerHooks};

/// The timeout the monitor applies, in nanoseconds; 0 means none yet.
pub(crate) type SharedTimeout = Arc<AtomicU64>;

pub(crate) fn store_timeout(shared: &AtomicU64, timeout: Option<Duration>) {
    let nanos = timeout.map_or(0, |t| {
        u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(1)
    });
    shared.store(nanos, Ordering::Release);
}

fn load_timeout(shared: &AtomicU64) -> Option<Duration> {
    match shared.load(Ordering::Acquire) {
        0 => None,
        nanos => Some(Duration::from_nanos(nanos)),
    }
}

/// Checks the running tasks a few times per timeout period.
fn tick_for(timeout: Option<Duration>) -> Duration {
    timeout.map_or(Duration::from_millis(20), |t| {
        (t / 4).clamp(Duration::from_millis(1), Duration::from_millis(20))
    })
}

/// A running monitor; stopped and joined on drop.
pub(crate) struct Monitor {
    stop: Option<Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl Monitor {
    pub fn start<W: WorkerHooks>(
        pool: Arc<Pool<W>>,
        timeout: SharedTimeout,
        max_slow: usize,
    ) -> Result<Self, EngineError> {
        let (stop, stopped) = bounded::<()>(0);
        let handle = thread::Builder::new()
            .name("minato-monitor".to_owned())
            .spawn(move || loop {
                let current = load_timeout(&timeout);
                match stopped.recv_timeout(tick_for(current)) {
                    Err(RecvTimeoutError::Timeout) => {
                        if let Some(timeout) = current {
                            pool.flag_overdue(timeout, max_slow);
                        }
                    }
                    _ => return,
                }
            })
            .map_err(|err| EngineError::Spawn(err.to_string()))?;
        Ok(Monitor {
            stop: Some(stop),
            handle: Some(handle),
        })
    }

    pub fn stop(&mut self) {
        self.stop.take();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_timeout_round_trips_and_zero_means_none() {
        let shared = AtomicU64::new(0);
        assert_eq!(load_timeout(&shared), None);
        store_timeout(&shared, Some(Duration::from_millis(7)));
        assert_eq!(load_timeout(&shared), Some(Duration::from_millis(7)));
        store_timeout(&shared, Some(Duration::ZERO));
        assert_eq!(load_timeout(&shared), Some(Duration::from_nanos(1)));
        store_timeout(&shared, None);
        assert_eq!(load_timeout(&shared), None);
    }

    #[test]
    fn the_tick_is_a_quarter_timeout_within_bounds() {
        assert_eq!(tick_for(None), Duration::from_millis(20));
        assert_eq!(
            tick_for(Some(Duration::from_millis(8))),
            Duration::from_millis(2)
        );
        assert_eq!(
            tick_for(Some(Duration::from_micros(10))),
            Duration::from_millis(1)
        );
        assert_eq!(
            tick_for(Some(Duration::from_secs(2))),
            Duration::from_millis(20)
        );
    }
}
