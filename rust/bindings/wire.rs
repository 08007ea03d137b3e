//! `minato._minato.Wire`: one end of a worker process's socket, read and
//! written by `crate::wire` with the GIL released.

use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use super::detach;
use crate::engine::computes_in;
use crate::wire::{Frame, WireError, WireSocket};

/// A connected Unix stream socket, taken over from a Python `socket`.
#[pyclass(name = "Wire", module = "minato._minato", frozen)]
pub(crate) struct PyWire {
    socket: WireSocket,
}

/// The frame's payload as bytes, and its descriptors, now the caller's to close.
fn into_python(py: Python<'_>, frame: Frame) -> (Py<PyBytes>, Vec<RawFd>) {
    let fds = frame.fds.into_iter().map(IntoRawFd::into_raw_fd).collect();
    (PyBytes::new(py, &frame.payload).unbind(), fds)
}

fn send(socket: &WireSocket, data: &[u8], fds: &[RawFd]) -> Result<(), WireError> {
    // SAFETY: the descriptors are only passed to sendmsg, which fails with
    // EBADF for one that is not open; none is closed or kept.
    let fds: Vec<BorrowedFd<'_>> = fds
        .iter()
        .map(|&fd| unsafe { BorrowedFd::borrow_raw(fd) })
        .collect();
    socket.send(data, &fds)
}

fn seconds(timeout: Option<f64>) -> Option<Duration> {
    timeout.map(|timeout| Duration::from_secs_f64(timeout.max(0.0)))
}

#[pymethods]
impl PyWire {
    /// Takes `sock`'s descriptor (the socket object is detached from it).
    #[new]
    fn new(sock: &Bound<'_, PyAny>) -> PyResult<Self> {
        let fd: RawFd = sock.call_method0("detach")?.extract()?;
        if fd < 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "the socket is closed",
            ));
        }
        // SAFETY: socket.detach() hands over its open descriptor: the Python
        // object no longer closes or uses it, so this value owns it alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(PyWire {
            socket: WireSocket::new(fd)?,
        })
    }

    fn fileno(&self) -> RawFd {
        self.socket.fileno()
    }

    /// Sends one frame: `data`, with copies of the descriptors `fds`.
    fn send(&self, py: Python<'_>, data: PyBackedBytes, fds: Vec<RawFd>) -> PyResult<()> {
        detach(py, || send(&self.socket, &data, &fds))?;
        Ok(())
    }

    /// The next frame, as (payload, descriptors): EOFError once the other
    /// end is gone, TimeoutError past `timeout` seconds.
    #[pyo3(signature = (timeout=None))]
    fn receive(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<(Py<PyBytes>, Vec<RawFd>)> {
        let frame = detach(py, || self.socket.receive(seconds(timeout)))?;
        Ok(into_python(py, frame))
    }

    /// Sends a task to worker process `pid` and waits for its answer, as
    /// one wait without the GIL; meanwhile the engine reads whether the task
    /// computes from that process, not from the waiting thread.
    #[pyo3(signature = (pid, data, fds, timeout=None))]
    fn call(
        &self,
        py: Python<'_>,
        pid: u32,
        data: PyBackedBytes,
        fds: Vec<RawFd>,
        timeout: Option<f64>,
    ) -> PyResult<(Py<PyBytes>, Vec<RawFd>)> {
        let frame = detach(py, || {
            computes_in(Some(pid));
            let answer = send(&self.socket, &data, &fds)
                .and_then(|()| self.socket.receive(seconds(timeout)));
            computes_in(None);
            answer
        })?;
        Ok(into_python(py, frame))
    }

    /// Ends the connection both ways (the other end sees it closed); the
    /// descriptor itself closes when this object goes.
    fn shutdown(&self) {
        self.socket.shutdown();
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyWire>()?;
    m.add(
        "WireError",
        m.py().get_type::<super::errors::python::WireError>(),
    )
}
