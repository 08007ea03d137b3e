//! The messages that travel between the consumer and the workers.

use std::time::{Duration, Instant};

/// One unit of work handed to a worker.
pub(crate) struct Task<P> {
    /// Position in submission order; unique for the engine's lifetime.
    pub seq: u64,
    /// The epoch it was submitted in; a task of an older epoch is not run.
    pub epoch: u64,
    /// How many samples the payload holds (1 for a batch-level task): the
    /// slow-sample timeout scales with it.
    pub samples: usize,
    pub payload: P,
}

/// What a worker's run of one task produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<R> {
    /// A result to deliver to the consumer.
    Value(R),
    /// The worker has no more data this epoch (an exhausted iterable
    /// dataset): nothing is delivered for this task, and round-robin dispatch
    /// stops sending the worker tasks until the next epoch.
    Exhausted,
}

/// One sample of a sample task, as its worker hands it back.
#[derive(Debug, PartialEq, Eq)]
pub enum Sample<S> {
    /// Goes into a batch.
    Loaded(S),
    /// Its loading failed and the failure policy skips it: it goes into no
    /// batch, and the batch it was planned for is filled from later samples.
    /// The value (the failure's record) is handed to the consumer on its own.
    Skipped(S),
}

/// A finished task as the consumer receives it.
pub(crate) struct Done<R> {
    pub seq: u64,
    pub epoch: u64,
    pub worker: usize,
    pub samples: usize,
    /// How long the worker spent on it, its pauses (see
    /// [`super::TaskClock`]) left out: the fetch times and the automatic
    /// timeout are made from it.
    pub elapsed: Duration,
    /// Its pauses: for a Python worker, its wait for the GIL on entry (see
    /// `super::gil_contention`).
    pub paused: Duration,
    /// When it started and ended, by the wall clock, pauses included.
    pub started: Instant,
    pub ended: Instant,
    /// Whether it ran past the slow-sample timeout and was flagged.
    pub slow: bool,
    pub finished: Finished<R>,
}

pub(crate) enum Finished<R> {
    Ran(Outcome<R>),
    /// Its epoch had ended before a worker picked it up; it was not run.
    Cancelled,
    /// The worker panicked; the message is the panic payload.
    Panicked(String),
}
