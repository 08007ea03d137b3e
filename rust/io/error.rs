//! Why a decode failed, one variant each. The bindings turn every variant
//! into `minato.io.DecodeError` (a `ValueError`), except a file that cannot be
//! read, which becomes the `OSError` that `open()` would raise.

use std::fmt;

/// A failure of one of minato's decoders or parsers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The data ended before the format said it would.
    Truncated {
        format: &'static str,
        reason: String,
    },
    /// The data breaks the format's rules.
    Corrupt {
        format: &'static str,
        reason: String,
    },
    /// The data is valid but uses something minato does not decode.
    Unsupported {
        format: &'static str,
        reason: String,
    },
    /// The bytes are not any format minato decodes.
    UnknownFormat,
    /// The decoded output would exceed the caller's pixel (or element) cap:
    /// refused before anything that large is allocated.
    TooLarge {
        format: &'static str,
        pixels: u64,
        limit: u64,
    },
    /// Decompressing would give more bytes than the caller's cap allows:
    /// refused before anything that large is allocated.
    TooManyBytes {
        format: &'static str,
        bytes: u64,
        limit: u64,
    },
    /// The NPY data holds Python objects, which only pickle can read.
    ObjectDtype,
    /// A caller-supplied argument does not fit the data (an `out` buffer of
    /// the wrong size, an unknown mode).
    InvalidArgument(String),
    /// Video decoding was left out of this build (the `video` cargo feature).
    VideoDisabled,
    /// The video ends before the last frame asked for: `frames` frames,
    /// indices from 0, and `last_index` was wanted.
    TooFewFrames { frames: usize, last_index: usize },
    /// One image of a batch failed; `index` is its position in the batch.
    InBatch {
        index: usize,
        source: Box<DecodeError>,
    },
    /// A path could not be read; `kind` is the OS error's kind.
    Io {
        path: String,
        kind: std::io::ErrorKind,
        message: String,
    },
}

impl DecodeError {
    pub fn truncated(format: &'static str, reason: impl Into<String>) -> Self {
        DecodeError::Truncated {
            format,
            reason: reason.into(),
        }
    }

    pub fn corrupt(format: &'static str, reason: impl Into<String>) -> Self {
        DecodeError::Corrupt {
            format,
            reason: reason.into(),
        }
    }

    pub fn unsupported(format: &'static str, reason: impl Into<String>) -> Self {
        DecodeError::Unsupported {
            format,
            reason: reason.into(),
        }
    }

    /// Refuses an output of `pixels` above `limit`.
    pub fn check_size(format: &'static str, pixels: u64, limit: u64) -> Result<(), Self> {
        if pixels > limit {
            Err(DecodeError::TooLarge {
                format,
                pixels,
                limit,
            })
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { format, reason } => write!(f, "{format}: truncated data: {reason}"),
            Self::Corrupt { format, reason } => write!(f, "{format}: corrupt data: {reason}"),
            Self::Unsupported { format, reason } => write!(f, "{format}: unsupported: {reason}"),
            Self::UnknownFormat => write!(
                f,
                "unknown format: the data is not JPEG, PNG or WebP (no known signature)"
            ),
            Self::TooLarge {
                format,
                pixels,
                limit,
            } => write!(
                f,
                "{format}: {pixels} pixels exceed the limit of {limit} (max_pixels); \
                 raise max_pixels if the input is trusted"
            ),
            Self::TooManyBytes {
                format,
                bytes,
                limit,
            } => write!(
                f,
                "{format}: {bytes} bytes once decompressed exceed the limit of {limit} \
                 (max_bytes); raise max_bytes if the input is trusted"
            ),
            Self::ObjectDtype => write!(
                f,
                "NPY: object arrays hold pickled Python objects; minato.io refuses them \
                 (use numpy.load(..., allow_pickle=True) on trusted data)"
            ),
            Self::InvalidArgument(reason) => write!(f, "{reason}"),
            Self::VideoDisabled => write!(
                f,
                "decode_video needs FFmpeg, and this build of minato was made without it: \
                 install Debian's libavcodec-dev libavformat-dev libavutil-dev libswscale-dev \
                 pkg-config clang, then rebuild with \
                 `MATURIN_PEP517_ARGS=\"--features python,video\" pip install .` \
                 (scripts/setup.sh does both)"
            ),
            Self::TooFewFrames { frames, last_index } => write!(
                f,
                "video: the video has {frames} frames, but frame {last_index} \
                 (start + (num_frames - 1) * stride) was asked for"
            ),
            Self::InBatch { index, source } => write!(f, "image {index} of the batch: {source}"),
            Self::Io {
                path,
                kind: _,
                message,
            } => write!(f, "{message}: '{path}'"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Reads a whole file, as the decoders' path inputs do.
pub fn read_path(path: &std::path::Path) -> Result<Vec<u8>, DecodeError> {
    std::fs::read(path).map_err(|err| DecodeError::Io {
        path: path.display().to_string(),
        kind: err.kind(),
        message: err.to_string(),
    })
}
