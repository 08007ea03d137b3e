//! A dataset's registered lists, looked at without touching their items
//! (minato._process.inherit).
//!
//! Once the fork server is forked, it shares the pages of a list's items
//! with the training process. Python code that walks the list (`map`,
//! `zip`, `set(map(type, items))`) takes a reference to each item and gives
//! it back: it writes every item's reference count, so the kernel copies
//! every page that holds an item into the training process while the
//! server keeps the originals, and a million file names are held twice
//! (benchmarks/RESULTS.md). These read the items' addresses, types and
//! lengths only.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::critical_section::with_critical_section;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyList, PyString, PyTuple};

/// Calls `visit` on each item of `items`, an exact list or tuple, with a
/// borrowed reference (no count written), while it returns true. Returns
/// whether every item was visited; None where `items` is neither.
fn visit_items<'py>(
    items: &Bound<'py, PyAny>,
    mut visit: impl FnMut(&Borrowed<'_, 'py, PyAny>) -> bool,
) -> Option<bool> {
    if let Ok(tuple) = items.cast_exact::<PyTuple>() {
        return Some(tuple.iter_borrowed().all(|item| visit(&item)));
    }
    let list = items.cast_exact::<PyList>().ok()?;
    // Another thread may change a list meanwhile on a free-threaded build:
    // its lock, held here, keeps each item borrowed below alive.
    Some(with_critical_section(list.as_any(), || {
        (0..list.len()).all(|index| {
            // SAFETY: `list` is a list, alive while borrowed here, and
            // `index` is below its length, which cannot change while its
            // critical section is held (and the GIL, where there is one);
            // the item is borrowed no longer than this call, in which the
            // list keeps it.
            let item = unsafe {
                Borrowed::from_ptr_or_opt(
                    items.py(),
                    ffi::PyList_GetItem(list.as_ptr(), index as ffi::Py_ssize_t),
                )
            };
            item.is_some_and(|item| visit(&item))
        })
    }))
}

/// Whether `items` (an exact list or tuple) holds the very objects of
/// `snapshot`, in order: `all(map(operator.is_, items, snapshot))`, with
/// no item's reference count written.
#[pyfunction]
fn _same_items(items: &Bound<'_, PyAny>, snapshot: &Bound<'_, PyTuple>) -> bool {
    if items.len().ok() != Some(snapshot.len()) {
        return false;
    }
    let mut expected = snapshot.iter_borrowed();
    visit_items(items, |item| {
        expected.next().is_some_and(|original| original.is(item))
    })
    .unwrap_or(false)
}

fn is_number(item: &Borrowed<'_, '_, PyAny>) -> bool {
    item.is_exact_instance_of::<PyInt>()
        || item.is_exact_instance_of::<PyFloat>()
        || item.is_exact_instance_of::<PyBool>()
        || item.is_none()
}

fn is_text(item: &Borrowed<'_, '_, PyAny>) -> bool {
    item.is_exact_instance_of::<PyBytes>() || item.is_exact_instance_of::<PyString>()
}

/// About the bytes a list or tuple of scalars (bytes, str, int, float,
/// bool, None), or of tuples of scalars, holds: the texts' lengths where it
/// holds only bytes and str, else 8 per item (the pointers at least); -1
/// where it holds anything else. No item's reference count is written.
#[pyfunction]
fn _scalar_items_bytes(items: &Bound<'_, PyAny>) -> PyResult<i64> {
    let (mut tuples, mut numbers) = (0usize, false);
    let mut text_bytes = 0i64;
    let scalars = visit_items(items, |item| {
        if let Ok(tuple) = item.cast_exact::<PyTuple>() {
            tuples += 1;
            return tuple
                .iter_borrowed()
                .all(|inner| is_number(&inner) || is_text(&inner));
        }
        if is_text(item) {
            // bytes and str: their length, read from the object (no count written)
            return item.len().is_ok_and(|length| {
                text_bytes += length as i64;
                true
            });
        }
        let number = is_number(item);
        numbers |= number;
        number
    });
    if scalars != Some(true) {
        return Ok(-1);
    }
    let length = items.len()?;
    if tuples > 0 {
        // Tuples only, or nothing at all.
        return Ok(if tuples == length {
            8 * length as i64
        } else {
            -1
        });
    }
    Ok(if numbers {
        8 * length as i64
    } else {
        text_bytes
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_same_items, m)?)?;
    m.add_function(wrap_pyfunction!(_scalar_items_bytes, m)?)
}
