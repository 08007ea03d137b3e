//! Binding for the collate fast path: minato/_collate.py hands over the
//! addresses of contiguous sample tensors and of the batch tensor it
//! allocated; the copy runs with the GIL released.

use pyo3::prelude::*;

use super::detach;
use crate::collate::stack_into;

/// Copies `samples` — (address, byte length) of contiguous CPU buffers —
/// into consecutive slots of the `out_len` bytes at `out`.
///
/// Private: the caller (minato._collate) guarantees that every address is
/// the start of a live, contiguous CPU buffer of at least that length, kept
/// alive by references it holds for the duration of the call, and that
/// `out` is a distinct, writable buffer nobody else touches meanwhile.
#[pyfunction]
fn _stack_into(
    py: Python<'_>,
    samples: Vec<(usize, usize)>,
    out: usize,
    out_len: usize,
) -> PyResult<()> {
    detach(py, || {
        let parts: Vec<&[u8]> = samples
            .iter()
            .map(|&(address, len)| {
                if len == 0 {
                    return &[][..];
                }
                // SAFETY: the caller's contract (above): `address` starts a
                // live CPU buffer of `len` bytes that stays alive and
                // unchanged until this call returns.
                unsafe { std::slice::from_raw_parts(address as *const u8, len) }
            })
            .collect();
        let out: &mut [u8] = if out_len == 0 {
            &mut []
        } else {
            // SAFETY: the caller's contract: `out` is a writable buffer of
            // `out_len` bytes, freshly allocated for this batch, overlapping
            // no sample and referenced by no one else during the call.
            unsafe { std::slice::from_raw_parts_mut(out as *mut u8, out_len) }
        };
        stack_into(&parts, out)
    })?;
    Ok(())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_stack_into, m)?)
}
