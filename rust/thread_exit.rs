//! Keeps a thread that is ended with `pthread_exit` from being unwound.
//!
//! CPython 3.11 to 3.13 end a thread that wants the GIL once the interpreter
//! is finalizing with `pthread_exit` (3.14 blocks it forever instead). On
//! glibc that is a forced unwind through every frame of the thread, and a
//! worker's frames do not survive it: the C++ of an extension that released
//! the GIL (torch re-takes it in noexcept code: std::terminate), pyo3's
//! guards (their drops call CPython again: a second `pthread_exit`, or a
//! decref without the GIL) and the catch_unwind of Rust's thread start
//! ("FATAL: exception not rethrown"). Each aborts the process mid-exit.
//!
//! [`hang_on_thread_exit`] makes such a thread block for good instead, as
//! 3.14 does, before any frame is unwound. CPython has let go of the GIL by
//! then, so the process exits around the blocked thread.

/// Runs `f`; if the thread is ended with `pthread_exit` meanwhile, it blocks
/// forever there instead of unwinding.
pub fn hang_on_thread_exit<T>(f: impl FnOnce() -> T) -> T {
    let _registered = imp::Registered::new();
    f()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    use std::ffi::{c_int, c_void};
    use std::ptr;
    use std::time::Duration;

    /// glibc's `struct _pthread_cleanup_buffer`.
    #[repr(C)]
    struct CleanupBuffer {
        routine: Option<unsafe extern "C" fn(*mut c_void)>,
        arg: *mut c_void,
        canceltype: c_int,
        prev: *mut CleanupBuffer,
    }

    extern "C" {
        // What `pthread_cleanup_push` / `_pop` expanded to before glibc 2.3.3,
        // still exported (GLIBC_2.2.5, GLIBC_2.34): the thread's list of
        // "compatibility" cleanup handlers, with a buffer the caller places.
        fn _pthread_cleanup_push(
            buffer: *mut CleanupBuffer,
            routine: unsafe extern "C" fn(*mut c_void),
            arg: *mut c_void,
        );
        fn _pthread_cleanup_pop(buffer: *mut CleanupBuffer, execute: c_int);
    }

    extern "C" fn block_forever(_: *mut c_void) {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }

    /// A cleanup handler registered on this thread until the value drops.
    pub(super) struct Registered(Box<CleanupBuffer>);

    impl Registered {
        pub fn new() -> Self {
            // On the heap, not on this thread's stack: glibc's unwinder runs
            // a compatibility handler once the frame being unwound is above
            // the handler's buffer (nptl/unwind.c, FRAME_LEFT, which measures
            // addresses from the top of the thread's stack). A buffer outside
            // the stack is above the very first frame: the handler runs before
            // any frame's personality routine, so nothing is unwound at all.
            let mut buffer = Box::new(CleanupBuffer {
                routine: None,
                arg: ptr::null_mut(),
                canceltype: 0,
                prev: ptr::null_mut(),
            });
            // SAFETY: the buffer is valid until `drop` unregisters it (it
            // lives in the Box, which moves with `Registered` but never
            // reallocates); registrations nest as the values do, so each pop
            // is of the handler pushed last; `block_forever` never unwinds.
            unsafe { _pthread_cleanup_push(&mut *buffer, block_forever, ptr::null_mut()) };
            Registered(buffer)
        }
    }

    impl Drop for Registered {
        fn drop(&mut self) {
            // SAFETY: this thread pushed this buffer last (see `new`); 0 pops
            // it without running the handler.
            unsafe { _pthread_cleanup_pop(&mut *self.0, 0) };
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    /// Elsewhere (musl, macOS, Windows) CPython's thread exit does not
    /// unwind the thread's frames.
    pub(super) struct Registered;

    impl Registered {
        pub fn new() -> Self {
            Registered
        }
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;
    use std::ffi::c_void;
    use std::panic::catch_unwind;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    extern "C-unwind" {
        fn pthread_exit(value: *mut c_void) -> !;
    }

    struct SetOnDrop(Arc<AtomicBool>);

    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_thread_ended_with_pthread_exit_blocks_without_unwinding() {
        let reached = Arc::new(AtomicBool::new(false));
        let unwound = Arc::new(AtomicBool::new(false));
        let (reached_in, unwound_in) = (reached.clone(), unwound.clone());
        // Unwound, this thread would run the guard's drop and then abort the
        // test process in the catch_unwind of Rust's thread start.
        let thread = std::thread::spawn(move || {
            hang_on_thread_exit(|| {
                let _guard = SetOnDrop(unwound_in);
                reached_in.store(true, Ordering::SeqCst);
                // SAFETY: what CPython does to a thread that wants the GIL
                // while it finalizes; the handler blocks before any unwinding.
                unsafe { pthread_exit(std::ptr::null_mut()) }
            })
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !reached.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(reached.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(200));
        assert!(!thread.is_finished());
        assert!(!unwound.load(Ordering::SeqCst));
        // The thread stays blocked until the test process ends.
    }

    #[test]
    fn values_and_panics_pass_through() {
        let value = std::thread::spawn(|| {
            assert_eq!(hang_on_thread_exit(|| 7), 7);
            let panicked = catch_unwind(|| hang_on_thread_exit(|| panic!("in f")));
            assert!(panicked.is_err());
            // Nested registrations pop in order.
            hang_on_thread_exit(|| hang_on_thread_exit(|| 3))
        })
        .join()
        .unwrap();
        assert_eq!(value, 3);
    }
}
