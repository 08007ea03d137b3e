//! minato's own rayon thread pool, for the data-parallel work of the
//! decoders and the collate fast path, safe to use in a `fork` child.
//!
//! rayon's global pool is never used: a child forked after it started (a
//! torch DataLoader worker, a multiprocessing pool) would hand its work to
//! threads that do not exist there, and wait forever. This pool is tagged
//! with the [`Process`] that built it; a child builds its own on first use
//! and leaks the parent's (dropping it would signal threads that are not
//! there). Finding the pool takes no lock, so a lock a parent thread held
//! at the fork cannot block the child.

use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::process::Process;

struct Tagged {
    process: Process,
    pool: ThreadPool,
}

/// The pool of the process that last built one: a leaked `Box`, never freed.
static POOL: AtomicPtr<Tagged> = AtomicPtr::new(ptr::null_mut());

/// This process's pool, built on first use (with rayon's default size:
/// `RAYON_NUM_THREADS`, or one thread per core). `None` when its threads
/// cannot be started (a resource limit): the caller then does the work on
/// its own thread, and the next call tries again.
pub fn pool() -> Option<&'static ThreadPool> {
    let process = Process::current();
    loop {
        let seen = POOL.load(Ordering::Acquire);
        // SAFETY: POOL is null or points to a `Tagged` leaked below, never freed.
        if let Some(tagged) = unsafe { seen.as_ref() } {
            if tagged.process == process {
                return Some(&tagged.pool);
            }
        }
        // None yet, or the pool of a process this one was forked from.
        let pool = ThreadPoolBuilder::new()
            .thread_name(|index| format!("minato-rayon-{index}"))
            .build()
            .ok()?;
        let built = Box::into_raw(Box::new(Tagged { process, pool }));
        match POOL.compare_exchange(seen, built, Ordering::AcqRel, Ordering::Acquire) {
            // What `seen` pointed to, if anything, is leaked on purpose.
            // SAFETY: `built` was just leaked and is never freed.
            Ok(_) => return Some(&unsafe { &*built }.pool),
            Err(_) => {
                // Another thread of this process published its pool first;
                // ours was never shared, and its threads are ours to stop.
                // SAFETY: `built` came from `Box::into_raw` above and was
                // not published.
                drop(unsafe { Box::from_raw(built) });
            }
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::time::Duration;

    use rayon::prelude::*;

    use super::*;
    use crate::process::tests::in_fork_child;

    fn sum_on(pool: &ThreadPool) -> u64 {
        pool.install(|| (0..10_000u64).into_par_iter().sum())
    }

    #[test]
    fn one_pool_serves_every_call_of_a_process() {
        let first = pool().expect("a pool");
        assert!(ptr::eq(first, pool().expect("a pool")));
        assert_eq!(sum_on(first), 49_995_000);
        // Concurrent first uses (the pool may be new) agree on one pool.
        let pools: Vec<usize> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| ptr::from_ref(pool().expect("a pool")) as usize))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(pools.iter().all(|&p| p == ptr::from_ref(first) as usize));
    }

    #[test]
    fn a_fork_child_builds_its_own_pool_and_the_parent_keeps_its() {
        let parent = pool().expect("a pool");
        assert_eq!(sum_on(parent), 49_995_000);
        // In the child the parent's workers do not exist: work handed to
        // them would never finish, and the child would be killed here.
        let status = in_fork_child(Duration::from_secs(20), || {
            let child = pool().expect("a pool in the child");
            let own = !ptr::eq(child, parent) && ptr::eq(child, pool().expect("a pool"));
            let works = sum_on(child) == 49_995_000;
            i32::from(!(own && works))
        });
        assert_eq!(status, Some(0));
        assert!(ptr::eq(parent, pool().expect("a pool")));
        assert_eq!(sum_on(parent), 49_995_000);
    }
}
