//! Keeps forks and one short section of minato's threads apart: a thread's
//! first attach to the Python interpreter.
//!
//! A thread that is not yet Python's creates its interpreter thread state
//! without the GIL, under the interpreter's list lock (`HEAD_LOCK`). A fork
//! at that moment gives the child a copy of that lock held by a thread it
//! does not have; CPython before 3.12 (gh-112275) takes it again in the
//! child's `PyOS_AfterFork_Child` before resetting it, and the child hangs
//! for good (seen: a torch DataLoader's worker forked while minato's threads
//! started). The gate lets a fork wait until no thread is inside the
//! section, and holds new entries back until the fork is done.
//!
//! Atomics only: a lock held by a parent thread at the fork would stay held
//! in the child. For that reason the ends of a fork are `pthread_atfork`
//! handlers, not Python callbacks: a call into the bindings in the child
//! drains pyo3's pool of deferred reference drops, under a mutex a parent
//! thread may have held at the fork.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Forks under way (several threads may fork at once).
static FORKS: AtomicUsize = AtomicUsize::new(0);
/// Threads inside the section.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// Whether the fork-end handlers are installed (or being installed).
static HANDLERS: AtomicBool = AtomicBool::new(false);

/// How often a waiting side looks again: the section lasts microseconds, a
/// fork milliseconds.
const POLL: Duration = Duration::from_micros(50);

/// A thread inside the section; leaves it when dropped (also on unwinding).
pub struct Inside(());

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A thread waits at most this long for forks to end: a fork whose end the
/// handlers never saw (a failed one, or one ended outside libc) must not
/// hold minato's threads back for good.
const MAX_HOLD: Duration = Duration::from_secs(5);

/// Enters the section once no fork is under way.
pub fn enter() -> Inside {
    let held_until = Instant::now() + MAX_HOLD;
    loop {
        while FORKS.load(Ordering::SeqCst) > 0 && Instant::now() < held_until {
            std::thread::sleep(POLL);
        }
        INSIDE.fetch_add(1, Ordering::SeqCst);
        // A fork that began meanwhile may have looked before the add: it
        // goes first, unless it held this thread back too long already.
        if FORKS.load(Ordering::SeqCst) == 0 || Instant::now() >= held_until {
            return Inside(());
        }
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Called before a fork: holds new entries back until the fork is done,
/// and waits up to `bound` for the threads inside to leave. Whether none
/// was left inside.
pub fn before_fork(bound: Duration) -> bool {
    install_fork_end_handlers();
    FORKS.fetch_add(1, Ordering::SeqCst);
    let deadline = Instant::now() + bound;
    while INSIDE.load(Ordering::SeqCst) > 0 {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
    true
}

/// Called in the parent after a fork (by `fork` itself, once installed).
/// A fork `before_fork` was not called for (one made from C) counts none.
pub extern "C" fn after_fork_in_parent() {
    let _ = FORKS.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
}

/// Called in the child after a fork (by `fork` itself, once installed): it
/// has only the forking thread, and no fork of its own under way.
pub extern "C" fn after_fork_in_child() {
    FORKS.store(0, Ordering::SeqCst);
    INSIDE.store(0, Ordering::SeqCst);
}

/// Has `fork` call the two handlers above; a failure (out of memory) is
/// retried on the next fork.
fn install_fork_end_handlers() {
    // SAFETY: the handlers are plain functions that stay loaded for the
    // life of the process (the extension module is never unloaded), and
    // they only store to atomics, as handlers run in a fork child must.
    #[cfg(unix)]
    unsafe {
        crate::process::install_fork_handlers_once(
            &HANDLERS,
            Some(after_fork_in_parent),
            Some(after_fork_in_child),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The gate's state is process-wide: its tests run one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn a_fork_waits_for_a_thread_inside_and_holds_new_ones_back() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let inside = enter();
        let left = Arc::new(AtomicBool::new(false));
        let forker = {
            let left = left.clone();
            std::thread::spawn(move || {
                let clear = before_fork(Duration::from_secs(30));
                // The thread inside left before the fork went on.
                assert!(clear && left.load(Ordering::SeqCst));
            })
        };
        while FORKS.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(POLL);
        }
        left.store(true, Ordering::SeqCst);
        drop(inside);
        forker.join().unwrap();
        // The fork is under way: a new entry waits for its end.
        let entered = Arc::new(AtomicBool::new(false));
        let entrant = {
            let entered = entered.clone();
            std::thread::spawn(move || {
                let _inside = enter();
                entered.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!entered.load(Ordering::SeqCst));
        after_fork_in_parent();
        entrant.join().unwrap();
        assert!(entered.load(Ordering::SeqCst));
        assert_eq!(INSIDE.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_fork_waits_no_longer_than_its_bound() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let inside = enter();
        assert!(!before_fork(Duration::from_millis(5)));
        after_fork_in_parent();
        drop(inside);
        assert!(before_fork(Duration::from_millis(5)));
        after_fork_in_child();
        assert_eq!(FORKS.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_fork_whose_end_is_never_seen_holds_threads_back_only_a_while() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        assert!(before_fork(Duration::from_millis(5)));
        let began = Instant::now();
        drop(enter());
        assert!(began.elapsed() >= MAX_HOLD);
        after_fork_in_child();
    }

    #[test]
    fn no_thread_is_inside_while_a_fork_goes_on() {
        static IN_SECTION: AtomicUsize = AtomicUsize::new(0);
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let stop = Arc::new(AtomicBool::new(false));
        let entrants: Vec<_> = (0..4)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let inside = enter();
                        IN_SECTION.fetch_add(1, Ordering::SeqCst);
                        IN_SECTION.fetch_sub(1, Ordering::SeqCst);
                        drop(inside);
                    }
                })
            })
            .collect();
        for _ in 0..200 {
            assert!(before_fork(Duration::from_secs(30)));
            // "The fork": no thread is in the section, and none gets in (a
            // thread checking in may count itself inside for a moment, and
            // back out).
            for _ in 0..10 {
                assert_eq!(IN_SECTION.load(Ordering::SeqCst), 0);
            }
            after_fork_in_parent();
        }
        stop.store(true, Ordering::SeqCst);
        for entrant in entrants {
            entrant.join().unwrap();
        }
    }
}
