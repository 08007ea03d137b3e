//! Batch arenas (crate::wire::arena, arena_pool) for Python: the loader's
//! pool (`ArenaPool`), a worker process's mapped arenas (`ArenaWriter`), and
//! a batch handed out as it lies in its arena (`_arena_batch`).

use std::collections::HashMap;
use std::ffi::c_int;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;

use super::detach;
use super::slots::{fill_view, LeafOwner, PySlotLeaf};
use crate::wire::{Arena, ArenaLayout, ArenaPool, Lease};

/// Unmaps `arenas` (let go by the pool, its lock released): a batch's pages
/// take a while to unmap, so not with the GIL held (the training loop's).
/// Takes no lock.
fn unmap_detached(py: Python<'_>, arenas: Vec<Arena>) {
    if !arenas.is_empty() {
        detach(py, move || drop(arenas));
    }
}

/// An arena to announce to a worker process: its number, descriptor, size,
/// places and leaf sizes.
type Announce = (u32, RawFd, usize, usize, Vec<usize>);
/// A task's places (see `ArenaPool.place`).
type Placed = (
    Vec<Option<(u32, u64, u32)>>,
    PyArenaLeases,
    Vec<Announce>,
    Vec<u32>,
);

/// The leases a task holds until its answer is read (and the descriptors it
/// announces stay open until it is sent).
#[pyclass(name = "ArenaLeases", module = "minato._minato", frozen)]
pub(crate) struct PyArenaLeases {
    _leases: Vec<Arc<Lease>>,
}

/// The loader's batch arenas.
#[pyclass(name = "ArenaPool", module = "minato._minato", frozen)]
pub(crate) struct PyArenaPool {
    pool: ArenaPool,
}

#[pymethods]
impl PyArenaPool {
    /// Arenas for batches of `places` samples.
    #[new]
    fn new(places: usize) -> Self {
        PyArenaPool {
            pool: ArenaPool::new(places),
        }
    }

    /// The large leaves' sizes of a worker process's first sample; the
    /// first offer sets the layout.
    fn offer_layout(&self, leaf_bytes: Vec<usize>) {
        self.pool.offer_layout(leaf_bytes);
    }

    /// A batch was submitted: the fresh samples at epoch positions
    /// `first..first + count` would take places `offset..`.
    fn expect(&self, first: u64, offset: usize, count: usize) {
        self.pool.expect(first, offset, count);
    }

    /// A new epoch: its positions start again.
    fn new_epoch(&self) {
        self.pool.new_epoch();
    }

    /// The places of a task's samples (`(position, index, seed)` each), for
    /// worker `worker`: a (arena, generation, place) or
    /// None per sample, the leases to hold until its answer is read, the
    /// arenas to announce with it and those the worker should forget.
    fn place(&self, worker: usize, task: &Bound<'_, PyAny>) -> PyResult<Placed> {
        let positions = task
            .try_iter()?
            .map(|item| item?.get_item(0)?.extract::<u64>())
            .collect::<PyResult<Vec<u64>>>()?;
        // Not detached: the pool's lock is only ever taken with the GIL held
        // (a lease's drop runs in Python's), and held for no wait.
        let mut placement = self.pool.place(worker, &positions);
        unmap_detached(task.py(), std::mem::take(&mut placement.retired));
        let destinations = placement
            .destinations
            .iter()
            .map(|destination| destination.map(|d| (d.arena, d.generation, d.place)))
            .collect();
        let announce = placement
            .announce
            .iter()
            .map(|lease| {
                let arena = lease.arena();
                let layout = arena.layout();
                let fd = arena.fd().expect("the loader's own arena").as_raw_fd();
                (
                    lease.id(),
                    fd,
                    layout.size(),
                    layout.places,
                    layout.leaf_bytes.clone(),
                )
            })
            .collect();
        let mut leases = placement.leases;
        leases.extend(placement.announce);
        Ok((
            destinations,
            PyArenaLeases { _leases: leases },
            announce,
            placement.forget,
        ))
    }

    /// The arenas a task would have announced were not sent to `worker`.
    fn unannounce(&self, worker: usize, ids: Vec<u32>) {
        self.pool.unannounce(worker, &ids);
    }

    /// Worker `worker`'s process is gone: a new one knows no arena.
    fn forget_worker(&self, worker: usize) {
        self.pool.forget_worker(worker);
    }

    /// Leaf `leaf` of place `place` in arena `arena` (generation
    /// `generation`), as a worker process says it wrote it there.
    #[allow(clippy::too_many_arguments)]
    fn leaf(
        &self,
        arena: u32,
        generation: u64,
        place: u32,
        leaf: u32,
        nbytes: usize,
        dtype: Py<PyAny>,
        shape: Py<PyAny>,
        is_array: bool,
    ) -> PyResult<PySlotLeaf> {
        let lease = self.pool.lease(arena, generation).ok_or_else(|| {
            PyValueError::new_err(format!(
                "a worker process placed a sample in batch arena {arena} (generation \
                 {generation}), which is not lent"
            ))
        })?;
        let layout = lease.arena().layout();
        let fits = (leaf as usize) < layout.leaves() && layout.leaf_bytes[leaf as usize] == nbytes;
        if !fits
            || !lease
                .arena()
                .written(generation, place as usize, leaf as usize)
        {
            return Err(PyValueError::new_err(format!(
                "a worker process placed {nbytes} bytes at place {place}, leaf {leaf} of batch \
                 arena {arena}, which it did not write"
            )));
        }
        let offset = layout.offset(place as usize, leaf as usize);
        Ok(PySlotLeaf {
            owner: LeafOwner::Arena { lease, place, leaf },
            offset,
            nbytes,
            dtype,
            shape,
            is_array,
        })
    }

    #[getter]
    fn free_arenas(&self) -> usize {
        self.pool.free_arenas()
    }

    #[getter]
    fn lent_arenas(&self) -> usize {
        self.pool.lent_arenas()
    }
}

/// A worker process's side: the loader's arenas it has mapped.
#[pyclass(name = "ArenaWriter", module = "minato._minato", unsendable)]
pub(crate) struct PyArenaWriter {
    arenas: HashMap<u32, Arena>,
}

#[pymethods]
impl PyArenaWriter {
    #[new]
    fn new() -> Self {
        PyArenaWriter {
            arenas: HashMap::new(),
        }
    }

    /// Maps the loader's arena `arena` from descriptor `fd` (which the
    /// caller still owns and may close afterwards).
    fn map(
        &mut self,
        arena: u32,
        fd: RawFd,
        size: usize,
        places: usize,
        leaf_bytes: Vec<usize>,
    ) -> PyResult<()> {
        let layout = ArenaLayout::new(places, leaf_bytes)
            .ok_or_else(|| PyValueError::new_err("a batch arena announced with no layout"))?;
        // SAFETY: the descriptor is only passed to fstat and mmap, which fail
        // with EBADF for one that is not open; it is not closed or kept.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        self.arenas.insert(arena, Arena::map(fd, layout, size)?);
        Ok(())
    }

    /// Unmaps arenas the loader no longer lends.
    fn forget(&mut self, arenas: Vec<u32>) {
        for arena in arenas {
            self.arenas.remove(&arena);
        }
    }

    /// Writes `data` (C-contiguous bytes) as leaf `leaf` of place `place`,
    /// if that leaf is still open there in `generation`.
    fn place(
        &self,
        py: Python<'_>,
        arena: u32,
        generation: u64,
        place: usize,
        leaf: usize,
        data: PyBuffer<u8>,
    ) -> bool {
        let Some(arena) = self.arenas.get(&arena) else {
            return false;
        };
        if !data.is_c_contiguous() {
            return false;
        }
        let (address, len) = (data.buf_ptr() as usize, data.len_bytes());
        let source: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: `data` (the PyBuffer) is held until this function
            // returns, so its C-contiguous `len` bytes stay in place; they are
            // only read, and no arena is this process's own memory.
            unsafe { std::slice::from_raw_parts(address as *const u8, len) }
        };
        detach(py, || arena.place(generation, place, leaf, source))
    }
}

/// The bytes of one leaf of a whole batch, as they lie in its arena: a
/// buffer that keeps the arena lent for as long as anything views it.
#[pyclass(name = "ArenaBatch", module = "minato._minato", frozen)]
pub(crate) struct PyArenaBatch {
    lease: Arc<Lease>,
    offset: usize,
    nbytes: usize,
}

#[pymethods]
impl PyArenaBatch {
    /// # Safety
    /// Called by Python's buffer protocol with a `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let batch = slf.get();
        let address = batch.lease.arena().segment().at(batch.offset);
        // SAFETY: `view` is Python's to fill; the bytes lie inside the arena,
        // which this object's lease keeps mapped.
        unsafe { fill_view(slf.as_any(), view, address, batch.nbytes, flags) }
    }

    /// # Safety
    /// Called by Python's buffer protocol; nothing to release.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// Where every item of `batch` (a list of `SlotLeaf`s of one dtype and
/// shape) is leaf m of place i of one arena, for i = 0, 1, ...: that leaf's
/// stacked batch as it lies there; otherwise None. Either way the arena's
/// pool hears whether its batch could be handed out so.
#[pyfunction]
fn _arena_batch(batch: &Bound<'_, PyAny>) -> PyResult<Option<PyArenaBatch>> {
    let leaves: Vec<Bound<'_, PySlotLeaf>> = match batch
        .try_iter()?
        .map(|item| item.map(|item| item.cast_into::<PySlotLeaf>().ok()))
        .collect::<PyResult<Option<Vec<_>>>>()?
    {
        Some(leaves) => leaves,
        None => return Ok(None),
    };
    let arena_of = |leaf: &Bound<'_, PySlotLeaf>| match &leaf.get().owner {
        LeafOwner::Arena { lease, place, leaf } => Some((lease.clone(), *place, *leaf)),
        LeafOwner::Slot { .. } => None,
    };
    let Some((lease, _, leaf)) = leaves.iter().find_map(arena_of) else {
        return Ok(None);
    };
    let in_place = leaves.iter().enumerate().all(|(index, item)| {
        arena_of(item).is_some_and(|(other, place, other_leaf)| {
            Arc::ptr_eq(&other, &lease) && other_leaf == leaf && place as usize == index
        })
    });
    unmap_detached(batch.py(), lease.report(in_place).into_arenas());
    if !in_place {
        return Ok(None);
    }
    let layout = lease.arena().layout();
    let offset = layout.region_offset(leaf as usize);
    let nbytes = leaves.len() * layout.leaf_bytes[leaf as usize];
    Ok(Some(PyArenaBatch {
        lease,
        offset,
        nbytes,
    }))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_arena_batch, m)?)?;
    m.add_class::<PyArenaPool>()?;
    m.add_class::<PyArenaLeases>()?;
    m.add_class::<PyArenaWriter>()?;
    m.add_class::<PyArenaBatch>()?;
    Ok(())
}
