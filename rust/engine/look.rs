//! The consumer's receive of a result: with no time to wait, a look, made
//! with the GIL held.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};

use super::error::EngineError;

/// The next result, waiting at most `wait`; with no wait it only looks
/// (see `look`).
pub(crate) fn receive<T>(results: &Receiver<T>, wait: Duration) -> Result<T, EngineError> {
    if wait.is_zero() {
        return look(results).map_err(|err| match err {
            TryRecvError::Empty => EngineError::WaitElapsed,
            TryRecvError::Disconnected => EngineError::WorkersGone,
        });
    }
    results.recv_timeout(wait).map_err(|err| match err {
        RecvTimeoutError::Timeout => EngineError::WaitElapsed,
        RecvTimeoutError::Disconnected => EngineError::WorkersGone,
    })
}

/// How long a look spins for a result about to arrive. A worker finishing
/// now sends its result within microseconds, and one taken without giving
/// the GIL up spares the consumer a wait behind a worker's whole task
/// (overhead.py's cheap samples lost a quarter of their rate without the
/// spin, benchmarks/RESULTS.md session 16).
const LOOK_SPIN: Duration = Duration::from_micros(20);

/// Takes a result already waiting, or about to: spins for at most
/// `LOOK_SPIN`, never yielding the core. The consumer looks with the GIL
/// held, and a timed receive (even of no time) backs off with
/// `sched_yield`: on cores kept busy by other processes each yield gave the
/// core away for a scheduler slice with the GIL still held, every worker
/// thread waiting for it (benchmarks/RESULTS.md, session 16).
fn look<T>(results: &Receiver<T>) -> Result<T, TryRecvError> {
    let mut started: Option<Instant> = None;
    let mut spins = 1u32;
    loop {
        match results.try_recv() {
            Err(TryRecvError::Empty) => {}
            received => return received,
        }
        let since = *started.get_or_insert_with(Instant::now);
        if since.elapsed() >= LOOK_SPIN {
            return Err(TryRecvError::Empty);
        }
        for _ in 0..spins {
            std::hint::spin_loop();
        }
        spins = (spins * 2).min(64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_takes_what_is_waiting_and_gives_up_on_an_empty_queue() {
        let (sender, results) = crossbeam_channel::bounded(1);
        assert_eq!(look(&results), Err(TryRecvError::Empty));
        sender.send(7).unwrap();
        assert_eq!(look(&results), Ok(7));
        drop(sender);
        assert_eq!(look::<i32>(&results), Err(TryRecvError::Disconnected));
    }
}
