//! Which process this is, so that what minato started in one process is
//! never used in a `fork` child of it.
//!
//! A forked child has the parent's memory and only the thread that called
//! `fork`: a thread pool, a worker thread or a lock held by a thread of the
//! parent is there as bytes, with nothing behind it. Whatever starts threads
//! records the [`Process`] it started them in and checks it before use.
//!
//! A process is told apart by its pid and by a count of the forks it
//! descends from, kept by a `pthread_atfork` handler: the pid alone could be
//! a parent's, reused after the parent exited; the count alone would miss a
//! fork made while the handler was being installed. The check takes no lock
//! (a lock held by a parent thread at the fork would never be released).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Forks since the program started, along this process's line of descent.
static FORKS: AtomicU64 = AtomicU64::new(0);
/// Whether the handler that counts forks is installed (or being installed).
static COUNTING: AtomicBool = AtomicBool::new(false);

/// Runs in the child, in the thread that called `fork`, before `fork` returns.
#[cfg(unix)]
extern "C" fn count_fork() {
    // An atomic add: async-signal-safe, as a handler run after fork must be.
    FORKS.fetch_add(1, Ordering::AcqRel);
}

/// Installs [`count_fork`] once; a failure (out of memory) is retried on
/// the next call, and meanwhile the pid still tells a child apart.
fn count_forks() {
    // SAFETY: the handler is a plain function that stays loaded for the
    // life of the process (the extension module is never unloaded), and it
    // only adds to an atomic.
    #[cfg(unix)]
    unsafe {
        install_fork_handlers_once(&COUNTING, None, Some(count_fork));
    }
}

/// Has `fork` call `in_parent` in the parent and `in_child` in the child
/// after every fork, installed once for the flag `installed`; a failure
/// (out of memory) leaves the flag clear, to be tried again on the next
/// call.
///
/// # Safety
///
/// The handlers run right after a fork, in the child with only the forking
/// thread: they must be async-signal-safe (atomics only, no lock, no
/// allocation), and stay loaded for the life of the process.
#[cfg(unix)]
pub(crate) unsafe fn install_fork_handlers_once(
    installed: &AtomicBool,
    in_parent: Option<unsafe extern "C" fn()>,
    in_child: Option<unsafe extern "C" fn()>,
) {
    if installed.load(Ordering::Acquire) || installed.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: the handlers are as this function's contract asks.
    if unsafe { libc::pthread_atfork(None, in_parent, in_child) } != 0 {
        installed.store(false, Ordering::Release);
    }
}

/// The process something was made in: the same value in that process only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    pid: u32,
    forks: u64,
}

impl Process {
    /// The calling process.
    pub fn current() -> Self {
        count_forks();
        Process {
            pid: std::process::id(),
            forks: FORKS.load(Ordering::Acquire),
        }
    }

    /// Whether the caller runs in this process (not in a fork child of it).
    pub fn is_current(self) -> bool {
        self == Self::current()
    }

    pub fn pid(self) -> u32 {
        self.pid
    }
}

#[cfg(all(test, unix))]
pub(crate) mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Runs `child` in a fork of this process and returns its exit status
    /// (`None` past `limit`: the child is killed). The child exits with
    /// `child`'s value without unwinding or running destructors.
    pub(crate) fn in_fork_child(limit: Duration, child: impl FnOnce() -> i32) -> Option<i32> {
        // SAFETY: the test's other threads may hold locks, but the child
        // only runs `child` (code written for a fork child) and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
            // SAFETY: ends the child at once, as after a fork it must.
            unsafe { libc::_exit(code) };
        }
        let deadline = Instant::now() + limit;
        loop {
            let mut status = 0;
            // SAFETY: `pid` is our child, `status` a valid out-pointer.
            let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if done == pid {
                return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
            }
            if Instant::now() >= deadline {
                // SAFETY: `pid` is our child, not yet reaped.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_fork_child_is_another_process_and_the_parent_stays_itself() {
        let parent = Process::current();
        assert!(parent.is_current());
        let status = in_fork_child(Duration::from_secs(10), || {
            let child = Process::current();
            let told_apart = !parent.is_current() && child.is_current();
            let counted = child.forks == parent.forks + 1 && child.pid != parent.pid;
            i32::from(!(told_apart && counted))
        });
        assert_eq!(status, Some(0));
        assert!(parent.is_current());
    }
}
