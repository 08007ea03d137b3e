//! Whether a worker thread is computing or blocked, read from the kernel.
//!
//! A task past the slow-sample timeout gets a replacement worker so that
//! the others stay free for fast samples. That pays when the slow worker is
//! blocked (on I/O, a lock, a sleep, a hung call); when it is computing and
//! the pool already has a worker per core, a replacement only takes a core
//! from another worker, slows every sample, and flags more of them: on 16
//! cores a CPU-bound pool grew this way to 50 threads and ran at a third of
//! its speed.
//!
//! A worker that hands its tasks to a worker process computes there, while
//! its thread waits on a socket: its [`WorkerSite`] then reads the process's
//! state (read from the waiting thread, on 16 cores every PIL sample looked
//! late and got a process started beside it: benchmarks/RESULTS.md).

use std::cell::RefCell;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

/// A worker thread's kernel thread id, where it can be read (Linux).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KernelThread(i32);

impl KernelThread {
    /// The calling thread's, or None where the kernel offers no per-thread state.
    pub fn current() -> Option<Self> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: gettid takes no arguments and cannot fail.
            Some(KernelThread(unsafe { libc::gettid() }))
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }

    /// Whether the thread is running or waiting for a core (state `R`), as
    /// opposed to sleeping or blocked; None when it cannot be read (the
    /// thread has exited, say).
    pub fn is_runnable(self) -> Option<bool> {
        runnable_at(&format!("/proc/self/task/{}/stat", self.0))
    }
}

/// Where a worker's task computes: on the worker's own thread, or in the
/// worker process the thread has handed it to.
#[derive(Debug)]
pub(crate) struct WorkerSite {
    thread: Option<KernelThread>,
    /// The worker process's pid while a task runs there, else 0.
    process: AtomicI32,
}

thread_local! {
    /// The site of the worker running on this thread, if it is one.
    static CURRENT_SITE: RefCell<Option<Arc<WorkerSite>>> = const { RefCell::new(None) };
}

impl WorkerSite {
    /// The calling worker thread's site, found by [`computes_in`] on this
    /// thread from now on.
    pub fn register_current() -> Arc<Self> {
        let site = Arc::new(WorkerSite {
            thread: KernelThread::current(),
            process: AtomicI32::new(0),
        });
        CURRENT_SITE.with(|current| *current.borrow_mut() = Some(site.clone()));
        site
    }

    /// Whether the task is computing (running or waiting for a core), read
    /// from its process while it runs in one, else from the worker's thread;
    /// None when it cannot be read.
    pub fn is_computing(&self) -> Option<bool> {
        match self.process.load(Ordering::Acquire) {
            0 => self.thread?.is_runnable(),
            // The process's main thread, which runs its tasks.
            pid => runnable_at(&format!("/proc/{pid}/stat")),
        }
    }
}

/// Tells the engine that the calling worker thread's task computes in the
/// worker process `pid` (None: on the thread itself again). Returns whether
/// the calling thread is an engine's worker.
pub fn computes_in(pid: Option<u32>) -> bool {
    let pid = pid.and_then(|pid| i32::try_from(pid).ok()).unwrap_or(0);
    CURRENT_SITE.with(|current| match &*current.borrow() {
        Some(site) => {
            site.process.store(pid, Ordering::Release);
            true
        }
        None => false,
    })
}

/// Whether the thread whose `stat` file is at `path` is runnable; None when
/// it cannot be read (the thread or process has exited, say).
fn runnable_at(path: &str) -> Option<bool> {
    runnable_from_stat(&std::fs::read_to_string(path).ok()?)
}

/// The state field of a `/proc/<pid>/task/<tid>/stat` line: `R` is running
/// or runnable. The command name in parentheses may hold spaces and
/// parentheses itself, so the state is read after its last `)`.
fn runnable_from_stat(stat: &str) -> Option<bool> {
    let (_, after_name) = stat.rsplit_once(')')?;
    let state = after_name.split_whitespace().next()?;
    Some(state == "R")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn the_state_is_read_after_the_command_name() {
        assert_eq!(runnable_from_stat("12 (a) b) R 1 2 3"), Some(true));
        assert_eq!(
            runnable_from_stat("12 (minato-worker-3) S 1 2"),
            Some(false)
        );
        assert_eq!(runnable_from_stat("12 (w) D 1"), Some(false));
        assert_eq!(runnable_from_stat("garbage"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_sleeping_thread_is_not_runnable_and_a_spinning_one_is() {
        let (sender, receiver) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let spinning = {
            let stop = stop.clone();
            let sender = sender.clone();
            std::thread::spawn(move || {
                sender.send(KernelThread::current().unwrap()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let sleeping = std::thread::spawn(move || {
            sender.send(KernelThread::current().unwrap()).unwrap();
            std::thread::sleep(Duration::from_millis(500));
        });
        let first = receiver.recv().unwrap();
        let second = receiver.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let states: Vec<_> = [first, second].iter().map(|t| t.is_runnable()).collect();
        // Which thread sent first is not known: one of each.
        assert!(states.contains(&Some(true)) && states.contains(&Some(false)));
        // A spinning thread on a busy machine may be preempted for a moment
        // but is never asleep; a sleeping one stays asleep.
        let deadline = Instant::now() + Duration::from_millis(100);
        while Instant::now() < deadline {
            assert_eq!(
                [first, second]
                    .iter()
                    .filter(|t| t.is_runnable() == Some(true))
                    .count(),
                1
            );
        }
        stop.store(true, Ordering::Relaxed);
        spinning.join().unwrap();
        sleeping.join().unwrap();
        assert_eq!(KernelThread::current().map(|_| ()), Some(()));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_worker_waiting_on_its_computing_process_is_computing() {
        use std::process::Command;

        // A process that computes, and one that waits on a pipe. Each says
        // when it runs its loop or wait: on a loaded machine an exec can sit
        // in uninterruptible sleep (state D) for seconds, and one starting
        // up can read as sleeping for a moment before it runs again.
        let said_started = |child: &mut std::process::Child| {
            let mut started = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(child.stdout.take().unwrap()),
                &mut started,
            )
            .unwrap();
            assert_eq!(started, "started\n");
        };
        let mut spinning = Command::new("sh")
            .args(["-c", "echo started; while :; do :; done"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        said_started(&mut spinning);
        // `read` is the shell's own: nothing is loaded between the line and
        // the wait, which lasts while this test holds the pipe's other end.
        let mut sleeping = Command::new("sh")
            .args(["-c", "echo started; read line"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        said_started(&mut sleeping);
        let sites = std::thread::spawn(move || {
            assert!(!computes_in(Some(spinning.id())), "not yet a worker");
            let site = WorkerSite::register_current();
            // The thread itself waits (here: runs this check).
            assert!(computes_in(Some(spinning.id())));
            // The state once it has read `expected` ten times in a row, or
            // the last one read after a minute.
            let settled = |expected: bool| {
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut in_a_row = 0;
                loop {
                    let state = site.is_computing();
                    in_a_row = if state == Some(expected) {
                        in_a_row + 1
                    } else {
                        0
                    };
                    if in_a_row == 10 || Instant::now() >= deadline {
                        return state;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            };
            let mut computing = vec![settled(true)];
            // What the kernel said of the spinning process, should it fail.
            let spinning_stat = std::fs::read_to_string(format!("/proc/{}/stat", spinning.id()));
            assert!(computes_in(Some(sleeping.id())));
            computing.push(settled(false));
            let _ = spinning.kill();
            let _ = spinning.wait();
            let _ = sleeping.kill();
            let _ = sleeping.wait();
            // Back on its own thread, which is running right now.
            assert!(computes_in(None));
            computing.push(site.is_computing());
            (computing, spinning_stat)
        });
        let (computing, spinning_stat) = sites.join().unwrap();
        assert_eq!(
            computing,
            vec![Some(true), Some(false), Some(true)],
            "the spinning process's stat: {spinning_stat:?}"
        );
    }
}
