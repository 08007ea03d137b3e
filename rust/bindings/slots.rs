//! Sample slots (crate::wire::slots) for Python: the worker process's ring
//! (`SlotRing`), the loader's map of it (`SlotMap`), and one payload in a
//! slot (`SlotLeaf`), whose bytes Python sees through the buffer protocol
//! and which hands its slot back when it goes.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use super::detach;
use crate::wire::{Lease, Segment, SlotMap, SlotRing};

/// A worker process's ring (used by its one thread).
#[pyclass(name = "SlotRing", module = "minato._minato")]
pub(crate) struct PySlotRing {
    ring: SlotRing,
}

/// A segment to announce: its descriptor, size, the ring's slot size, its number.
type Announce = (RawFd, usize, usize, u32);

#[pymethods]
impl PySlotRing {
    #[new]
    fn new() -> Self {
        PySlotRing {
            ring: SlotRing::default(),
        }
    }

    /// A free slot for `nbytes`, and the segment to announce with it (on its
    /// first use), or None.
    fn take(&mut self, nbytes: usize) -> Option<(u32, Option<Announce>)> {
        let taken = self.ring.take(nbytes)?;
        let announce = taken.announce.map(|segment| {
            let (fd, size) = self.ring.segment(segment);
            (fd.as_raw_fd(), size, self.ring.slot_bytes(), segment)
        });
        Some((taken.slot, announce))
    }

    /// Copies `data` (a C-contiguous byte buffer) into `slot`.
    fn write(&mut self, py: Python<'_>, slot: u32, data: PyBuffer<u8>) -> PyResult<()> {
        if !data.is_c_contiguous() {
            return Err(PyValueError::new_err("a slot's payload must be contiguous"));
        }
        let len = data.len_bytes();
        if len > self.ring.slot_bytes() {
            return Err(PyValueError::new_err(format!(
                "{len} bytes do not fit a slot of {}",
                self.ring.slot_bytes()
            )));
        }
        let source = data.buf_ptr() as usize;
        let target = self.ring.bytes_mut(slot, len);
        detach(py, || {
            if len > 0 {
                // SAFETY: `data` (the PyBuffer) is held until this function
                // returns: its C-contiguous `len` bytes stay in place; it
                // cannot overlap the slot, which only this ring writes.
                let source = unsafe { std::slice::from_raw_parts(source as *const u8, len) };
                target.copy_from_slice(source);
            }
        });
        Ok(())
    }

    /// Slots free again (handed back, or taken for a message not sent), and
    /// segments whose announcing message was not sent.
    #[pyo3(signature = (slots, unannounce=Vec::new()))]
    fn give_back(&mut self, slots: Vec<u32>, unannounce: Vec<u32>) {
        self.ring.give_back(&slots, &unannounce);
    }

    /// A new task begins, after its freed slots were given back: an idle
    /// ring whose slots are all back gives its pages back to the system
    /// (crate::wire::slots::IDLE_TASKS_BEFORE_RELEASE). Returns whether it did.
    fn task_begins(&mut self) -> bool {
        self.ring.task_begins()
    }

    #[getter]
    fn free(&self) -> usize {
        self.ring.free_slots()
    }

    #[getter]
    fn segments(&self) -> usize {
        self.ring.segment_count()
    }

    #[getter]
    fn segment_slots(&self) -> usize {
        self.ring.segment_slots()
    }

    #[getter]
    fn slot_bytes(&self) -> usize {
        self.ring.slot_bytes()
    }
}

/// The loader's side of one worker process's ring.
#[pyclass(name = "SlotMap", module = "minato._minato", frozen)]
pub(crate) struct PySlotMap {
    map: Arc<SlotMap>,
}

#[pymethods]
impl PySlotMap {
    #[new]
    fn new() -> Self {
        PySlotMap {
            map: Arc::new(SlotMap::default()),
        }
    }

    /// Maps the process's segment `segment` from descriptor `fd` (which the
    /// caller still owns and may close afterwards).
    fn map(&self, segment: u32, fd: RawFd, size: usize, slot_bytes: usize) -> PyResult<()> {
        // SAFETY: the descriptor is only passed to fstat and mmap, which
        // fail with EBADF for one that is not open; it is not closed or kept.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        Ok(self.map.map(segment, fd, size, slot_bytes)?)
    }

    /// The payload of `nbytes` in `slot`, as a leaf of a sample.
    fn leaf(
        &self,
        slot: u32,
        nbytes: usize,
        dtype: Py<PyAny>,
        shape: Py<PyAny>,
        is_array: bool,
    ) -> PyResult<PySlotLeaf> {
        let Some((segment, offset)) = self.map.locate(slot, nbytes) else {
            return Err(PyValueError::new_err(format!(
                "slot {slot} ({nbytes} bytes) lies in no segment the worker process announced"
            )));
        };
        Ok(PySlotLeaf {
            owner: LeafOwner::Slot {
                map: self.map.clone(),
                segment,
                slot,
            },
            offset,
            nbytes,
            dtype,
            shape,
            is_array,
        })
    }

    /// The slots no longer viewed since the last call, to hand back.
    fn take_freed(&self) -> Vec<u32> {
        self.map.take_freed()
    }
}

/// Where a leaf's bytes lie, and what it keeps for them.
pub(crate) enum LeafOwner {
    /// In a worker process's slot, which goes back to it with the leaf.
    Slot {
        map: Arc<SlotMap>,
        segment: Arc<Segment>,
        slot: u32,
    },
    /// In its place in a batch arena (rust/wire/arena.rs), held by the lease.
    Arena {
        lease: Arc<Lease>,
        place: u32,
        leaf: u32,
    },
}

/// A tensor's or array's bytes in a slot or a batch arena: a buffer
/// (writable, one byte per item) with the leaf's dtype and shape beside it.
/// A slot goes back to its process once this object, and so every view of
/// it, is gone.
#[pyclass(name = "SlotLeaf", module = "minato._minato", frozen)]
pub(crate) struct PySlotLeaf {
    pub(crate) owner: LeafOwner,
    pub(crate) offset: usize,
    pub(crate) nbytes: usize,
    #[pyo3(get)]
    pub(crate) dtype: Py<PyAny>,
    #[pyo3(get)]
    pub(crate) shape: Py<PyAny>,
    #[pyo3(get)]
    pub(crate) is_array: bool,
}

#[pymethods]
impl PySlotLeaf {
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// # Safety
    /// Called by Python's buffer protocol with a `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (address, nbytes) = (slf.get().address(), slf.get().nbytes);
        // SAFETY: `view` is Python's to fill; the bytes lie inside the slot's
        // segment or the arena, which this leaf keeps mapped.
        unsafe { fill_view(slf.as_any(), view, address, nbytes, flags) }
    }

    /// # Safety
    /// Called by Python's buffer protocol; nothing to release.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

impl PySlotLeaf {
    /// The address of its first byte.
    pub(crate) fn address(&self) -> *mut u8 {
        match &self.owner {
            LeafOwner::Slot { segment, .. } => segment.at(self.offset),
            LeafOwner::Arena { lease, .. } => lease.arena().segment().at(self.offset),
        }
    }
}

impl Drop for PySlotLeaf {
    fn drop(&mut self) {
        if let LeafOwner::Slot { map, slot, .. } = &self.owner {
            map.free(*slot);
        }
    }
}

/// Fills `view` with the `len` writable bytes at `address`, exported by
/// `owner`, which the view keeps referenced for its life.
///
/// # Safety
/// `view` is Python's to fill (or null), and the bytes stay valid and in
/// place while `owner` lives.
pub(crate) unsafe fn fill_view(
    owner: &Bound<'_, PyAny>,
    view: *mut ffi::Py_buffer,
    address: *mut u8,
    len: usize,
    flags: c_int,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("no view to fill"));
    }
    // SAFETY: as this function requires; PyBuffer_FillInfo takes a
    // reference to `owner` for the view's life.
    let filled = unsafe {
        ffi::PyBuffer_FillInfo(
            view,
            owner.as_ptr(),
            address as *mut c_void,
            len as ffi::Py_ssize_t,
            0,
            flags,
        )
    };
    if filled != 0 {
        return Err(PyErr::fetch(owner.py()));
    }
    Ok(())
}

/// Whether every item of `batch` is a `SlotLeaf` of one dtype, shape and
/// kind (then `_stack_into` stacks them as `torch.stack` would).
#[pyfunction]
fn _uniform_leaves(batch: &Bound<'_, PyAny>) -> PyResult<bool> {
    let mut first: Option<Bound<'_, PySlotLeaf>> = None;
    for item in batch.try_iter()? {
        let item = item?;
        let Ok(leaf) = item.cast_into::<PySlotLeaf>() else {
            return Ok(false);
        };
        match &first {
            None => first = Some(leaf),
            Some(first) => {
                let (a, b) = (first.get(), leaf.get());
                let py = leaf.py();
                let same = a.is_array == b.is_array
                    && a.nbytes == b.nbytes
                    && (a.dtype.is(&b.dtype) || a.dtype.bind(py).eq(b.dtype.bind(py))?)
                    && a.shape.bind(py).eq(b.shape.bind(py))?;
                if !same {
                    return Ok(false);
                }
            }
        }
    }
    Ok(first.is_some())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_uniform_leaves, m)?)?;
    m.add_class::<PySlotRing>()?;
    m.add_class::<PySlotMap>()?;
    m.add_class::<PySlotLeaf>()
}
