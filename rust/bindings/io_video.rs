//! Bindings for minato.io's video decoder: arguments extracted, then the
//! decoding runs with the GIL released. Without the `video` cargo feature
//! the function still exists and raises DecodeError saying how to enable it.

use numpy::PyArray4;
use pyo3::prelude::*;

#[cfg(feature = "video")]
use super::detach;
#[cfg(feature = "video")]
use super::io_source::Source;

/// Decodes `num_frames` frames from index `start`, every `stride`-th, to a
/// (frames, height, width, 3) uint8 RGB array that owns the decoder's buffer.
/// `max_pixels=None` is the default cap (2**30 pixels over all frames).
#[cfg(feature = "video")]
#[pyfunction]
#[pyo3(signature = (data, *, num_frames, start=0, stride=1, size=None, max_pixels=None))]
fn _decode_video<'py>(
    py: Python<'py>,
    data: Source,
    num_frames: usize,
    start: usize,
    stride: usize,
    size: Option<(usize, usize)>,
    max_pixels: Option<u64>,
) -> PyResult<Bound<'py, PyArray4<u8>>> {
    use numpy::ndarray::Array4;
    use numpy::IntoPyArray;
    use pyo3::exceptions::PyValueError;

    use super::io_source::buffer_bytes;
    use crate::io::{self, VideoOptions, VideoSource};

    let options = VideoOptions {
        start,
        num_frames,
        stride,
        size,
        max_pixels: max_pixels.unwrap_or(io::DEFAULT_MAX_VIDEO_PIXELS),
    };
    let decoded = detach(py, || {
        // A path goes to FFmpeg as a path: it reads the file as it decodes.
        let source = match &data {
            Source::Bytes(bytes) => VideoSource::Bytes(bytes),
            Source::Buffer(buffer) => VideoSource::Bytes(buffer_bytes(buffer)),
            Source::Path(path) => VideoSource::Path(path),
        };
        io::decode_video(source, &options)
    })?;
    let shape = (decoded.frames, decoded.height, decoded.width, 3);
    let array = Array4::from_shape_vec(shape, decoded.data)
        .map_err(|err| PyValueError::new_err(err.to_string()))?;
    Ok(array.into_pyarray(py))
}

/// This build has no FFmpeg: raises DecodeError saying how to enable it.
#[cfg(not(feature = "video"))]
#[pyfunction]
#[pyo3(signature = (data, *, num_frames, start=0, stride=1, size=None, max_pixels=None))]
#[allow(unused_variables)]
fn _decode_video<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    num_frames: usize,
    start: usize,
    stride: usize,
    size: Option<(usize, usize)>,
    max_pixels: Option<u64>,
) -> PyResult<Bound<'py, PyArray4<u8>>> {
    Err(crate::io::DecodeError::VideoDisabled.into())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("_HAS_VIDEO", cfg!(feature = "video"))?;
    m.add_function(wrap_pyfunction!(_decode_video, m)?)?;
    Ok(())
}
