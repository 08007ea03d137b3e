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

/// CPU time the cores this process may run on (its affinity) have spent
/// busy so far, whatever ran on them (every process's user, system,
/// interrupt and stolen time, `/proc/stat`); None where it cannot be read.
/// Beside this process's own CPU time it tells how much of the cores other
/// processes leave it.
#[cfg(target_os = "linux")]
pub fn cores_busy_time() -> Option<Duration> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, written by the call
    // for the calling process (pid 0) with its own size.
    let allowed = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        set
    };
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks_per_second <= 0 {
        return None;
    }
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    // SAFETY: CPU_ISSET reads the set filled above, for any index below
    // CPU_SETSIZE (checked).
    let busy = busy_ticks(&stat, |cpu| {
        cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, &allowed) }
    })?;
    Some(Duration::from_secs_f64(
        busy as f64 / ticks_per_second as f64,
    ))
}

/// The busy clock ticks (user, nice, system, irq, softirq, steal; not idle
/// nor I/O wait) of `/proc/stat`'s per-core lines whose core `counted`
/// takes; None where no such line reads.
fn busy_ticks(stat: &str, counted: impl Fn(usize) -> bool) -> Option<u64> {
    let mut total = 0u64;
    let mut read_any = false;
    for line in stat.lines() {
        let mut fields = line.split_whitespace();
        let Some(core) = fields.next().and_then(|name| name.strip_prefix("cpu")) else {
            continue;
        };
        let Ok(core) = core.parse::<usize>() else {
            continue; // the line summing every core
        };
        if !counted(core) {
            continue;
        }
        let ticks: Vec<u64> = fields
            .take(8)
            .filter_map(|field| field.parse().ok())
            .collect();
        let &[user, nice, system, _idle, _iowait, irq, softirq, steal] = ticks.as_slice() else {
            continue;
        };
        total += user + nice + system + irq + softirq + steal;
        read_any = true;
    }
    read_any.then_some(total)
}

#[cfg(not(target_os = "linux"))]
pub fn cores_busy_time() -> Option<Duration> {
    None
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

    const STAT: &str = "cpu  30 1 10 500 7 1 1 0 0 0
cpu0 10 0 5 250 3 1 0 0 0 0
cpu1 20 1 5 250 4 0 1 0 0 0
intr 12345
ctxt 678
";

    #[test]
    fn busy_ticks_count_the_cores_taken_and_leave_idle_out() {
        assert_eq!(busy_ticks(STAT, |_| true), Some(16 + 27));
        assert_eq!(busy_ticks(STAT, |core| core == 1), Some(27));
        assert_eq!(busy_ticks(STAT, |_| false), None);
        assert_eq!(busy_ticks("intr 1\n", |_| true), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_cores_busy_time_counts_this_process_computing() {
        let start = cores_busy_time().expect("/proc/stat on linux");
        let until = Instant::now() + Duration::from_millis(100);
        let mut spins = 0u64;
        while Instant::now() < until {
            spins = std::hint::black_box(spins + 1);
        }
        // Clock ticks are 10 ms: most of the 100 ms spun shows.
        let busy = cores_busy_time().expect("/proc/stat on linux") - start;
        assert!(busy >= Duration::from_millis(50), "{busy:?}");
    }

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
