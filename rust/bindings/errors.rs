//! The one place where minato's Rust errors become Python exceptions, of the
//! type torch's DataLoader (or torch, or open()) would raise.

use pyo3::exceptions::{
    PyEOFError, PyFileNotFoundError, PyIsADirectoryError, PyOSError, PyPermissionError,
    PyRuntimeError, PyStopIteration, PyTimeoutError, PyValueError,
};
use pyo3::PyErr;

use crate::collate::StackError;
use crate::engine::EngineError;
use crate::io::DecodeError;
use crate::wire::WireError;

/// Python's side of the decode errors, in a module of its own so that the
/// exception's Python name is `DecodeError`, like the Rust enum's.
pub(crate) mod python {
    pyo3::create_exception!(
        minato.io,
        DecodeError,
        pyo3::exceptions::PyValueError,
        "Data that minato.io cannot decode: truncated, corrupt, unsupported or over a size \
         cap. The message names the format and the reason."
    );
    pyo3::create_exception!(
        minato._minato,
        WireError,
        pyo3::exceptions::PyConnectionError,
        "A worker process sent something that is not a message of minato's wire. \
         The message says what arrived."
    );
}

/// Failures the bindings report to Python.
#[derive(Debug)]
pub(crate) enum LoaderError {
    /// The engine refused or failed (see [`EngineError`]).
    Engine(EngineError),
    /// The user's `timeout` passed with no batch; `timeout` is as the user wrote it.
    TimedOut { timeout: String },
    /// The engine's threads run in process `pid`, and this is a fork child
    /// of it (one the Python iterator was not told about: it restarts its
    /// workers after `os.fork`).
    Forked { pid: u32 },
    /// A ledger was given `positions` positions for `indices` carried indices.
    PositionsMismatch { positions: usize, indices: usize },
}

impl From<EngineError> for LoaderError {
    fn from(err: EngineError) -> Self {
        LoaderError::Engine(err)
    }
}

impl From<LoaderError> for PyErr {
    fn from(err: LoaderError) -> PyErr {
        match err {
            // Nothing left to deliver this epoch: Python's end-of-iteration signal.
            LoaderError::Engine(EngineError::Idle) => PyStopIteration::new_err(()),
            // Nothing to deliver until more is submitted: the iterator's loop
            // refills on StopIteration (or closes the epoch) and asks again.
            LoaderError::Engine(EngineError::Starved) => PyStopIteration::new_err(()),
            // torch raises RuntimeError for a dead or misbehaving worker too.
            LoaderError::Engine(other) => PyRuntimeError::new_err(other.to_string()),
            LoaderError::TimedOut { timeout } => {
                PyRuntimeError::new_err(format!("DataLoader timed out after {timeout} seconds"))
            }
            LoaderError::Forked { pid } => PyRuntimeError::new_err(format!(
                "this DataLoader's worker threads run in process {pid}; this process is a fork \
                 of it and has none of its threads. Call iter() on the DataLoader in this \
                 process (or create the DataLoader here) to start workers of its own"
            )),
            LoaderError::PositionsMismatch { positions, indices } => PyValueError::new_err(
                format!("{positions} positions for {indices} carried indices"),
            ),
        }
    }
}

impl From<DecodeError> for PyErr {
    fn from(err: DecodeError) -> PyErr {
        let mut cause = &err;
        while let DecodeError::InBatch { source, .. } = cause {
            cause = source;
        }
        match cause {
            // What open() would raise for the same path.
            DecodeError::Io { kind, .. } => {
                let message = err.to_string();
                match kind {
                    std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(message),
                    std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(message),
                    std::io::ErrorKind::IsADirectory => PyIsADirectoryError::new_err(message),
                    _ => PyOSError::new_err(message),
                }
            }
            // A bad argument, not bad data: the ValueError torch would raise.
            DecodeError::InvalidArgument(_) => PyValueError::new_err(err.to_string()),
            _ => python::DecodeError::new_err(err.to_string()),
        }
    }
}

impl From<StackError> for PyErr {
    fn from(err: StackError) -> PyErr {
        match err {
            // torch.stack's error type for samples that do not fit together.
            StackError::OutputSize { .. } | StackError::SampleSize { .. } => {
                PyRuntimeError::new_err(err.to_string())
            }
            // Buffers no stack can be written with.
            StackError::OutputReadOnly
            | StackError::NotContiguous { .. }
            | StackError::Overlaps { .. } => PyValueError::new_err(err.to_string()),
        }
    }
}

impl From<WireError> for PyErr {
    fn from(err: WireError) -> PyErr {
        match err {
            // What reading a socket whose peer left raises in Python.
            WireError::Closed | WireError::Truncated { .. } => PyEOFError::new_err(err.to_string()),
            // A socket's timeout.
            WireError::TimedOut => PyTimeoutError::new_err(err.to_string()),
            WireError::Io(err) => err.into(),
            WireError::BadMagic { .. }
            | WireError::TooManyFds { .. }
            | WireError::FdCountMismatch { .. }
            | WireError::TooLarge { .. } => python::WireError::new_err(err.to_string()),
        }
    }
}
