//! The engine's failures, one variant each.

use std::fmt;

/// Everything the engine can report instead of a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// No task of the current epoch is outstanding: every submitted task has
    /// been delivered (or skipped), so there is nothing to wait for.
    Idle,
    /// The next batch needs samples not yet submitted: skipped samples left
    /// it short. Submit more, or close the epoch (`SampleEngine::close_epoch`).
    Starved,
    /// The wait given to `recv` elapsed before the next output was ready.
    WaitElapsed,
    /// `submit` was called with `max_in_flight` tasks already outstanding.
    Full,
    /// A batch larger than the engine was configured for was submitted.
    BatchTooLarge { size: usize, max: usize },
    /// Round-robin dispatch found every worker exhausted for this epoch.
    NoActiveWorker,
    /// A worker panicked while running a task (or while starting up).
    WorkerPanicked { worker: usize, message: String },
    /// The thread that collates assembled batches panicked.
    CollatorPanicked(String),
    /// Every worker thread is gone while tasks were still outstanding.
    WorkersGone,
    /// The engine was shut down; it accepts and delivers nothing more.
    ShutDown,
    /// The operating system refused to start a worker thread.
    Spawn(String),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Idle => write!(f, "no task is outstanding"),
            Self::Starved => write!(f, "the next batch needs more samples than were submitted"),
            Self::WaitElapsed => write!(f, "no result arrived within the wait"),
            Self::Full => write!(f, "the in-flight bound is reached"),
            Self::BatchTooLarge { size, max } => {
                write!(
                    f,
                    "a batch of {size} samples exceeds the configured maximum of {max}"
                )
            }
            Self::NoActiveWorker => write!(f, "every worker is exhausted for this epoch"),
            Self::WorkerPanicked { worker, message } => {
                write!(f, "minato worker thread {worker} panicked: {message}")
            }
            Self::CollatorPanicked(message) => {
                write!(f, "minato's collate thread panicked: {message}")
            }
            Self::WorkersGone => write!(f, "all minato worker threads exited unexpectedly"),
            Self::ShutDown => write!(f, "the minato engine has been shut down"),
            Self::Spawn(reason) => write!(f, "could not start a minato worker thread: {reason}"),
        }
    }
}

impl std::error::Error for EngineError {}
