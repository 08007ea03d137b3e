//! Bindings for minato.io's image decoders: arguments extracted, then the
//! decoding runs with the GIL released.

use numpy::ndarray::Array3;
use numpy::{IntoPyArray, PyArray3};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::detach;
use super::io_source::Source;
use crate::io::{self, DecodeError, ImageOptions, Mode};

fn options(size: Option<(usize, usize)>, mode: &str, max_pixels: u64) -> PyResult<ImageOptions> {
    Ok(ImageOptions {
        size,
        mode: Mode::parse(mode)?,
        max_pixels,
    })
}

/// Decodes one image to a (height, width, channels) uint8 array that owns
/// the decoder's buffer.
#[pyfunction]
#[pyo3(signature = (data, *, size=None, mode="RGB", max_pixels=io::DEFAULT_MAX_PIXELS))]
fn _decode_image<'py>(
    py: Python<'py>,
    data: Source,
    size: Option<(usize, usize)>,
    mode: &str,
    max_pixels: u64,
) -> PyResult<Bound<'py, PyArray3<u8>>> {
    let options = options(size, mode, max_pixels)?;
    let decoded = detach(py, || io::decode_image(&data.bytes()?, &options))?;
    let shape = (decoded.height, decoded.width, decoded.channels);
    let array = Array3::from_shape_vec(shape, decoded.data)
        .map_err(|err| PyValueError::new_err(err.to_string()))?;
    Ok(array.into_pyarray(py))
}

/// Decodes `sources` in parallel into `out`, a writable C-contiguous buffer
/// of exactly len(sources) images of `size` in `mode`.
#[pyfunction]
#[pyo3(signature = (sources, out, *, size, mode="RGB", max_pixels=io::DEFAULT_MAX_PIXELS))]
fn _decode_images_into(
    py: Python<'_>,
    sources: Vec<Source>,
    out: &Bound<'_, PyAny>,
    size: (usize, usize),
    mode: &str,
    max_pixels: u64,
) -> PyResult<()> {
    let options = options(Some(size), mode, max_pixels)?;
    let out = PyBuffer::<u8>::get(out)?;
    if out.readonly() || !out.is_c_contiguous() {
        return Err(DecodeError::InvalidArgument(
            "out must be a writable, C-contiguous uint8 buffer".to_owned(),
        )
        .into());
    }
    let (ptr, len) = (out.buf_ptr() as usize, out.len_bytes());
    detach(py, || {
        let out: &mut [u8] = if len == 0 {
            &mut []
        } else {
            // SAFETY: `out` (the PyBuffer) is held until this function
            // returns, so the exporter keeps the memory alive and in place;
            // it is writable, C-contiguous with item size 1 and spans `len`
            // bytes from `ptr`. No other Rust reference to it exists; Python
            // code touching the same memory meanwhile races with the decoder,
            // as it would with any GIL-free writer (numpy's own `out=`).
            unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) }
        };
        io::decode_images_into(sources.len(), |i| sources[i].bytes(), &options, out)
    })?;
    Ok(())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_decode_image, m)?)?;
    m.add_function(wrap_pyfunction!(_decode_images_into, m)?)?;
    m.add("DEFAULT_MAX_PIXELS", io::DEFAULT_MAX_PIXELS)?;
    Ok(())
}
