//! CPU use for the adaptive controller: the process's, from sysinfo, and a
//! worker thread's own, around each task.

use std::time::{Duration, Instant};

use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// CPU time is counted in clock ticks (10 ms): shorter intervals are noise.
const MIN_INTERVAL: Duration = Duration::from_millis(200);

/// The time on one of the calling thread's or process's CPU clocks; None
/// where it cannot be read.
#[cfg(unix)]
fn cpu_clock(clock: libc::clockid_t) -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the call's duration,
    // and the CPU-time clocks asked for are supported by every unix minato
    // targets.
    let status = unsafe { libc::clock_gettime(clock, &mut now) };
    (status == 0).then(|| {
        Duration::new(
            u64::try_from(now.tv_sec).unwrap_or(0),
            u32::try_from(now.tv_nsec).unwrap_or(0),
        )
    })
}

/// CPU time the calling thread has used so far (its own clock: time it waits,
/// for I/O, a lock or the GIL, does not count). Zero where the clock cannot
/// be read.
#[cfg(unix)]
pub fn thread_cpu_time() -> Duration {
    cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(Duration::ZERO)
}

/// Without a thread clock: the time elapsed, so that differences are at
/// least a duration (everything then reads as computing).
#[cfg(not(unix))]
pub fn thread_cpu_time() -> Duration {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// CPU time this process's threads have used so far, all of them; None
/// where the clock cannot be read.
#[cfg(unix)]
pub fn process_cpu_time() -> Option<Duration> {
    cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Without a process clock, CPU use comes from [`CpuSampler`].
#[cfg(not(unix))]
pub fn process_cpu_time() -> Option<Duration> {
    None
}

/// The time this process's threads have spent runnable but waiting for a
/// core, summed over the threads alive now (the kernel's scheduler
/// statistics, `/proc/self/task/*/schedstat`); None where they cannot be
/// read. Threads blocked on a lock (the GIL) or on I/O do not count: it
/// tells threads that lack cores from threads that wait for each other.
#[cfg(target_os = "linux")]
pub fn runnable_wait() -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut read_any = false;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        // A thread that ended since the listing is left out.
        if let Some(waited) = schedstat_wait(&task.path().join("schedstat")) {
            total += waited;
            read_any = true;
        }
    }
    read_any.then_some(total)
}

/// [`runnable_wait`] of the calling thread alone.
#[cfg(target_os = "linux")]
pub fn thread_runnable_wait() -> Option<Duration> {
    schedstat_wait(std::path::Path::new("/proc/thread-self/schedstat"))
}

/// The run-queue wait (the second field) of one thread's `schedstat`.
#[cfg(target_os = "linux")]
fn schedstat_wait(path: &std::path::Path) -> Option<Duration> {
    let text = std::fs::read_to_string(path).ok()?;
    let nanos = text.split_whitespace().nth(1)?.parse::<u64>().ok()?;
    Some(Duration::from_nanos(nanos))
}

#[cfg(not(target_os = "linux"))]
pub fn runnable_wait() -> Option<Duration> {
    None
}

#[cfg(not(target_os = "linux"))]
pub fn thread_runnable_wait() -> Option<Duration> {
    None
}

/// The cores this process may run on (its affinity and quota counted).
pub(crate) fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| cores.get())
}

/// Samples this process's CPU use at most every [`MIN_INTERVAL`], where
/// [`process_cpu_time`] cannot (its clock measures any window, the first
/// included, where this knows nothing for its first interval).
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

    #[cfg(unix)]
    #[test]
    fn the_process_clock_counts_every_threads_computing() {
        let start = process_cpu_time().expect("a process clock on unix");
        let spin = || {
            let until = Instant::now() + Duration::from_millis(50);
            let mut spins = 0u64;
            while Instant::now() < until {
                spins = std::hint::black_box(spins + 1);
            }
        };
        std::thread::scope(|scope| {
            scope.spawn(spin);
            scope.spawn(spin);
        });
        let used = process_cpu_time()
            .expect("a process clock")
            .saturating_sub(start);
        // Each thread computed for 50 ms, on whatever cores it got: at
        // least one thread's worth is certain.
        assert!(used >= Duration::from_millis(45), "{used:?}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn threads_computing_on_fewer_cores_than_they_are_wait_for_one() {
        use std::sync::Barrier;
        let before = runnable_wait().expect("scheduler statistics on linux");
        assert!(thread_runnable_wait().is_some());
        let threads = super::available_cores() + 2;
        let done = Barrier::new(threads + 1);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    // 30 ms of this thread's own CPU, however long it takes.
                    let start = thread_cpu_time();
                    let mut spins = 0u64;
                    while thread_cpu_time().saturating_sub(start) < Duration::from_millis(30) {
                        spins = std::hint::black_box(spins + 1);
                    }
                    // Parked alive until the figure is read: an ended
                    // thread's waits are no longer listed.
                    done.wait();
                    done.wait();
                });
            }
            done.wait();
            let waited = runnable_wait()
                .expect("scheduler statistics")
                .saturating_sub(before);
            done.wait();
            // More threads computing than cores: some waited for one.
            assert!(waited > Duration::ZERO, "{waited:?}");
        });
    }

    #[test]
    fn a_threads_clock_counts_its_computing_not_its_sleeping() {
        let start = thread_cpu_time();
        std::thread::sleep(Duration::from_millis(50));
        let slept = thread_cpu_time().saturating_sub(start);
        let start = thread_cpu_time();
        let until = Instant::now() + Duration::from_millis(50);
        let mut spins = 0u64;
        while Instant::now() < until {
            spins = std::hint::black_box(spins + 1);
        }
        let spun = thread_cpu_time().saturating_sub(start);
        assert!(slept < Duration::from_millis(10), "{slept:?}");
        // Another process may take the core for part of the spin.
        assert!(spun > slept, "{spun:?} against {slept:?}");
        assert!(spun > Duration::ZERO);
    }
}
