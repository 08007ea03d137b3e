//! `minato._minato.SampleLedger` (see `engine::SampleLedger`): an epoch's
//! pending indices, each with its position, kept in Rust so that the
//! training thread hands whole batches in and out.

use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::errors::LoaderError;
use crate::engine::SampleLedger;

#[pyclass(name = "SampleLedger", module = "minato._minato", frozen)]
pub(crate) struct PySampleLedger {
    // Held only for the bookkeeping of one call, with the GIL held and
    // nothing inside waiting for anything: no lock-order question arises.
    ledger: Mutex<SampleLedger<Py<PyAny>>>,
}

impl PySampleLedger {
    fn ledger(&self) -> MutexGuard<'_, SampleLedger<Py<PyAny>>> {
        // A panic inside leaves plain data behind: still consistent enough
        // to read, and a poisoned lock must not take the loader down.
        self.ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Hands out `from_queue` queued units, then `fresh` ones: (position, index) each.
    pub(crate) fn hand_out(
        &self,
        py: Python<'_>,
        from_queue: usize,
        fresh: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(u64, Py<PyAny>)>> {
        let fresh: Vec<Py<PyAny>> = fresh
            .try_iter()?
            .map(|index| index.map(Bound::unbind))
            .collect::<PyResult<_>>()?;
        Ok(self
            .ledger()
            .hand_out(from_queue, fresh, |index| index.clone_ref(py)))
    }
}

#[pymethods]
impl PySampleLedger {
    /// A ledger whose first fresh unit gets `next_position`, with the units
    /// `carried` over from a checkpoint (indices, at `carried_positions`)
    /// handed out first.
    #[new]
    #[pyo3(signature = (next_position=0, carried_positions=Vec::new(), carried=Vec::new()))]
    fn new(
        next_position: u64,
        carried_positions: Vec<u64>,
        carried: Vec<Py<PyAny>>,
    ) -> PyResult<Self> {
        if carried_positions.len() != carried.len() {
            return Err(LoaderError::PositionsMismatch {
                positions: carried_positions.len(),
                indices: carried.len(),
            }
            .into());
        }
        let carried = carried_positions.into_iter().zip(carried).collect();
        Ok(PySampleLedger {
            ledger: Mutex::new(SampleLedger::new(next_position, carried)),
        })
    }

    /// Units waiting to be handed out before fresh ones.
    #[getter]
    fn queued(&self) -> usize {
        self.ledger().queued()
    }

    /// The position the next fresh unit gets.
    #[getter]
    fn next_position(&self) -> u64 {
        self.ledger().next_position()
    }

    /// Hands out `from_queue` queued units, then the `fresh` indices, as a
    /// list of (position, index), now pending.
    #[pyo3(name = "hand_out")]
    fn py_hand_out<'py>(
        &self,
        py: Python<'py>,
        from_queue: usize,
        fresh: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let units = self.hand_out(py, from_queue, fresh)?;
        let tuples = units
            .into_iter()
            .map(|(position, index)| {
                PyTuple::new(
                    py,
                    [position.into_pyobject(py)?.into_any(), index.into_bound(py)],
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, tuples)
    }

    /// The units at `positions` reached the training loop.
    fn delivered(&self, positions: Vec<u64>) {
        self.ledger().delivered(positions);
    }

    /// The unit at `position` was skipped: it is not handed out again.
    fn skipped(&self, position: u64) {
        self.ledger().skipped(position);
    }

    /// The indices of the pending units at `positions` (None for others).
    fn indices_of(&self, py: Python<'_>, positions: Vec<u64>) -> Vec<Option<Py<PyAny>>> {
        let ledger = self.ledger();
        positions
            .into_iter()
            .map(|position| ledger.index_of(position).map(|index| index.clone_ref(py)))
            .collect()
    }

    /// The pending units' workers are gone: they are handed out again first.
    fn requeue_pending(&self) {
        self.ledger().requeue_pending();
    }

    /// Every unit not delivered, as (positions, indices), in the sampler's order.
    fn undelivered(&self, py: Python<'_>) -> (Vec<u64>, Vec<Py<PyAny>>) {
        self.ledger()
            .undelivered()
            .into_iter()
            .map(|(position, index)| (position, index.clone_ref(py)))
            .unzip()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySampleLedger>()
}
