//! The process's CPU use, from sysinfo, for the adaptive controller.

use std::time::{Duration, Instant};

use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// CPU time is counted in clock ticks (10 ms): shorter intervals are noise.
const MIN_INTERVAL: Duration = Duration::from_millis(200);

/// The cores this process may run on (its affinity and quota counted).
pub(crate) fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| cores.get())
}

/// Samples this process's CPU use at most every [`MIN_INTERVAL`].
pub(crate) struct CpuSampler {
    system: System,
    pid: Option<Pid>,
    cores: f64,
    last_refresh: Option<Instant>,
    last: Option<f64>,
}

impl CpuSampler {
    pub fn new() -> Self {
        let cores = available_cores();
        CpuSampler {
            system: System::new(),
            pid: sysinfo::get_current_pid().ok(),
            cores: cores as f64,
            last_refresh: None,
            last: None,
        }
    }

    /// CPU use over the last interval as a fraction of the cores this
    /// process may run on (0..=1); None until two samples were taken.
    pub fn usage(&mut self) -> Option<f64> {
        let pid = self.pid?;
        let due = match self.last_refresh {
            Some(at) => at.elapsed() >= MIN_INTERVAL,
            None => true,
        };
        if due {
            let first = self.last_refresh.is_none();
            self.system.refresh_processes_specifics(
                ProcessesToUpdate::Some(&[pid]),
                false,
                ProcessRefreshKind::nothing().with_cpu(),
            );
            self.last_refresh = Some(Instant::now());
            if !first {
                self.last = self.system.process(pid).map(|process| {
                    (f64::from(process.cpu_usage()) / 100.0 / self.cores).clamp(0.0, 1.0)
                });
            }
        }
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_unknown_at_first_then_a_fraction() {
        let mut sampler = CpuSampler::new();
        assert_eq!(sampler.usage(), None);
        let until = Instant::now() + MIN_INTERVAL + Duration::from_millis(20);
        let mut spin = 0u64;
        while Instant::now() < until {
            spin = spin.wrapping_add(1);
        }
        std::hint::black_box(spin);
        let usage = sampler.usage().expect("known after an interval");
        assert!((0.0..=1.0).contains(&usage));
    }
}
