//! Binding for the collate fast path: minato/_loader/collate.py hands over the
//! sample tensors' bytes and the batch tensor it allocated, as buffers
//! (byte views); the copy runs with the GIL released.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

use super::detach;
use crate::collate::{stack_into, StackError};

/// Copies each of `samples` (C-contiguous byte buffers of one length) into
/// consecutive slots of `out` (a writable C-contiguous byte buffer that
/// holds exactly one slot per sample).
#[pyfunction]
fn _stack_into(py: Python<'_>, samples: Vec<PyBuffer<u8>>, out: PyBuffer<u8>) -> PyResult<()> {
    if out.readonly() {
        return Err(StackError::OutputReadOnly.into());
    }
    if !out.is_c_contiguous() {
        return Err(StackError::NotContiguous { sample: None }.into());
    }
    if let Some(index) = samples.iter().position(|sample| !sample.is_c_contiguous()) {
        return Err(StackError::NotContiguous {
            sample: Some(index),
        }
        .into());
    }
    let parts: Vec<(usize, usize)> = samples
        .iter()
        .map(|sample| (sample.buf_ptr() as usize, sample.len_bytes()))
        .collect();
    let (out_ptr, out_len) = (out.buf_ptr() as usize, out.len_bytes());
    let overlaps_out = |&(address, len): &(usize, usize)| {
        len > 0 && out_len > 0 && address < out_ptr + out_len && out_ptr < address + len
    };
    if let Some(sample) = parts.iter().position(overlaps_out) {
        return Err(StackError::Overlaps { sample }.into());
    }
    detach(py, || {
        let parts: Vec<&[u8]> = parts
            .iter()
            .map(|&(address, len)| {
                if len == 0 {
                    return &[][..];
                }
                // SAFETY: `samples` (the PyBuffers) are held until this
                // function returns, so their exporters keep each buffer alive
                // and in place; each is C-contiguous with item size 1 and
                // spans `len` bytes from `address`. They are only read.
                unsafe { std::slice::from_raw_parts(address as *const u8, len) }
            })
            .collect();
        let out: &mut [u8] = if out_len == 0 {
            &mut []
        } else {
            // SAFETY: `out` (the PyBuffer) is held until this function
            // returns; it is writable, C-contiguous with item size 1 and
            // spans `out_len` bytes from `out_ptr`, and no sample overlaps it
            // (checked above), so this is the only reference to those bytes
            // in Rust. (Python code writing them meanwhile races, as with
            // any GIL-free writer, numpy's own `out=`.)
            unsafe { std::slice::from_raw_parts_mut(out_ptr as *mut u8, out_len) }
        };
        stack_into(&parts, out)
    })?;
    Ok(())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_stack_into, m)?)
}
