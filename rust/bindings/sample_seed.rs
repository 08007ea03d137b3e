//! `minato._minato._epoch_seed` / `_sample_seed` (see `engine::sample_seed`):
//! called per sample, where Python's big-integer arithmetic would cost more.

use pyo3::prelude::*;

use crate::engine::{epoch_seed, sample_seed};

/// The seed of an iterator's `epoch`-th epoch, from its base seed.
#[pyfunction]
fn _epoch_seed(base_seed: u64, epoch: u64) -> u64 {
    epoch_seed(base_seed, epoch)
}

/// The seed of the sample (or batch) at `position` in its epoch.
#[pyfunction]
fn _sample_seed(epoch_seed: u64, position: u64) -> u64 {
    sample_seed(epoch_seed, position)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_epoch_seed, m)?)?;
    m.add_function(wrap_pyfunction!(_sample_seed, m)?)
}
