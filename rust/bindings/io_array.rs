//! Bindings for minato.io's NPY and NPZ readers: arguments extracted, then
//! parsing and inflating run with the GIL released. The Python side
//! (`minato/_io/array.py`) builds each array with `numpy.frombuffer` over the
//! caller's own object, or over a buffer handed over from Rust, so no array
//! data is copied.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::detach;
use super::io_source::{Source, SourceBytes};
use crate::io::{self, DecodeError, MemberData, NpyHeader, NpzOptions};

/// Bytes that Rust owns and hands to numpy: a file read from a path, or an
/// inflated member.
type OwnedBytes<'py> = Bound<'py, PyArray1<u8>>;

/// An array's dtype, shape and order: `(descr, shape, fortran_order)`.
type HeaderTuple<'py> = (String, Bound<'py, PyTuple>, bool);

/// One entry of an NPZ archive: `(key, buffer, offset, length, header)`.
/// `buffer` is `None` for the archive's own bytes; `header` is `None` for a
/// member that is not an NPY file, whose raw bytes are the value.
type MemberTuple<'py> = (
    String,
    Option<OwnedBytes<'py>>,
    usize,
    usize,
    Option<HeaderTuple<'py>>,
);

/// The input's bytes when they were read from a path (Python then has no
/// object holding them), `None` when they are the caller's object.
fn read_from_path(bytes: SourceBytes<'_>) -> Option<Vec<u8>> {
    match bytes {
        SourceBytes::Read(bytes) => Some(bytes),
        SourceBytes::Borrowed(_) => None,
    }
}

fn header_tuple<'py>(py: Python<'py>, header: &NpyHeader) -> PyResult<HeaderTuple<'py>> {
    Ok((
        header.dtype.descr(),
        PyTuple::new(py, &header.shape)?,
        header.fortran_order,
    ))
}

/// Parses an NPY file: `(buffer, offset, (descr, shape, fortran_order))`,
/// where `buffer` is `None` for `data` itself, or the file read from a path.
#[pyfunction]
#[pyo3(signature = (data, /))]
fn _load_npy<'py>(
    py: Python<'py>,
    data: Source,
) -> PyResult<(Option<OwnedBytes<'py>>, usize, HeaderTuple<'py>)> {
    let (read, header) = detach(py, || -> Result<_, DecodeError> {
        let bytes = data.bytes()?;
        let header = io::parse_npy(&bytes)?;
        Ok((read_from_path(bytes), header))
    })?;
    let buffer = read.map(|bytes| PyArray1::from_vec(py, bytes));
    Ok((buffer, header.data_offset, header_tuple(py, &header)?))
}

/// Reads an NPZ archive: `(archive, members)`, where `archive` is `None` for
/// `data` itself, or the file read from a path, and each member is a
/// [`MemberTuple`]. Inflated members come with their own buffer.
#[pyfunction]
#[pyo3(signature = (data, /, max_bytes=io::DEFAULT_MAX_BYTES, check_crc=true))]
fn _load_npz<'py>(
    py: Python<'py>,
    data: Source,
    max_bytes: u64,
    check_crc: bool,
) -> PyResult<(Option<OwnedBytes<'py>>, Vec<MemberTuple<'py>>)> {
    let options = NpzOptions {
        max_bytes,
        check_crc,
    };
    let (read, members) = detach(py, || -> Result<_, DecodeError> {
        let bytes = data.bytes()?;
        let members = io::parse_npz(&bytes, &options)?;
        Ok((read_from_path(bytes), members))
    })?;
    let archive = read.map(|bytes| PyArray1::from_vec(py, bytes));
    let members = members
        .into_iter()
        .map(|member| {
            let (buffer, start, len) = match member.data {
                MemberData::Stored { offset, len } => (None, offset, len),
                MemberData::Inflated(bytes) => {
                    let len = bytes.len();
                    (Some(PyArray1::from_vec(py, bytes)), 0, len)
                }
            };
            Ok(match &member.array {
                // Offsets within the member become offsets within its buffer;
                // parse_npy checked they lie inside the member.
                Some(header) => (
                    member.key,
                    buffer,
                    start + header.data_offset,
                    header.data_len,
                    Some(header_tuple(py, header)?),
                ),
                None => (member.key, buffer, start, len, None),
            })
        })
        .collect::<PyResult<_>>()?;
    Ok((archive, members))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_load_npy, m)?)?;
    m.add_function(wrap_pyfunction!(_load_npz, m)?)?;
    Ok(())
}
