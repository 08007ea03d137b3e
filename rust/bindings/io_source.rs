//! The inputs minato.io accepts — bytes, any contiguous buffer, or a path —
//! taken from Python so that they can be read with the GIL released.

use std::path::PathBuf;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyByteArray, PyBytes, PyString};

use crate::io::{read_path, DecodeError};

/// Encoded data as a Python caller gave it, readable without the GIL.
pub(crate) enum Source {
    /// `bytes`: immutable, borrowed without a copy.
    Bytes(PyBackedBytes),
    /// Any other object with a C-contiguous buffer (bytearray, memoryview,
    /// mmap, numpy array): viewed without a copy while the buffer is held.
    Buffer(PyBuffer<u8>),
    /// A file to read.
    Path(PathBuf),
}

impl<'py> FromPyObject<'_, 'py> for Source {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<PyBytes>() {
            return Ok(Source::Bytes(obj.extract()?));
        }
        if obj.is_instance_of::<PyString>() || obj.hasattr("__fspath__")? {
            return Ok(Source::Path(obj.extract()?));
        }
        if obj.is_instance_of::<PyByteArray>() || obj.hasattr("__buffer__").unwrap_or(false) {
            // Item size 1 is all the decoders need; PyBuffer<u8> checks it.
            let buffer = PyBuffer::<u8>::get(&obj)?;
            if !buffer.is_c_contiguous() {
                return Err(PyTypeError::new_err(
                    "minato.io needs a C-contiguous buffer of bytes",
                ));
            }
            return Ok(Source::Buffer(buffer));
        }
        // Some exporters (mmap, older types) do not define __buffer__.
        match PyBuffer::<u8>::get(&obj) {
            Ok(buffer) if buffer.is_c_contiguous() => Ok(Source::Buffer(buffer)),
            _ => Err(PyTypeError::new_err(format!(
                "expected bytes, a buffer of bytes or a path, not {}",
                obj.get_type().name()?
            ))),
        }
    }
}

/// The bytes of a [`Source`]: borrowed from Python, or read from a file.
pub(crate) enum SourceBytes<'a> {
    Borrowed(&'a [u8]),
    Read(Vec<u8>),
}

impl std::ops::Deref for SourceBytes<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            SourceBytes::Borrowed(bytes) => bytes,
            SourceBytes::Read(bytes) => bytes,
        }
    }
}

impl Source {
    /// The encoded bytes; reads the file for a path. Runs without the GIL.
    pub fn bytes(&self) -> Result<SourceBytes<'_>, DecodeError> {
        match self {
            Source::Bytes(bytes) => Ok(SourceBytes::Borrowed(bytes)),
            Source::Buffer(buffer) => Ok(SourceBytes::Borrowed(buffer_bytes(buffer))),
            Source::Path(path) => read_path(path).map(SourceBytes::Read),
        }
    }
}

/// The contents of a held, C-contiguous byte buffer.
pub(crate) fn buffer_bytes(buffer: &PyBuffer<u8>) -> &[u8] {
    if buffer.len_bytes() == 0 {
        return &[];
    }
    // SAFETY: the buffer is held (so the exporter keeps the memory alive and
    // in place) for as long as the returned borrow of `buffer`, it is
    // C-contiguous with item size 1 (checked at extraction), and it spans
    // len_bytes() bytes from buf_ptr(). A concurrent writer in Python could
    // change the bytes under us, as with any GIL-free reader of a buffer
    // (numpy does the same); the decoders treat the input as untrusted bytes
    // and never rely on it staying unchanged.
    unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes()) }
}
