//! How a frame can fail to arrive.

use std::fmt;

/// A frame that could not be read or written, one variant per cause.
#[derive(Debug)]
pub enum WireError {
    /// The other end closed the socket between frames: it is gone.
    Closed,
    /// The other end closed the socket mid-frame, after `got` of the
    /// `expected` bytes (header and payload together).
    Truncated { got: u64, expected: u64 },
    /// What arrived does not start with a frame's magic bytes.
    BadMagic { found: [u8; 4] },
    /// A header announced more descriptors than a frame may carry.
    TooManyFds { count: u32 },
    /// The descriptors that came with a header are not as many as it announced.
    FdCountMismatch { announced: u32, received: usize },
    /// A header announced a payload larger than any frame may be.
    TooLarge { length: u64 },
    /// No whole frame arrived within the wait.
    TimedOut,
    /// The socket itself failed.
    Io(std::io::Error),
}

impl WireError {
    /// Whether the other end sent something that is not a frame (rather
    /// than going away or being slow).
    pub fn is_malformed(&self) -> bool {
        matches!(
            self,
            WireError::BadMagic { .. }
                | WireError::TooManyFds { .. }
                | WireError::FdCountMismatch { .. }
                | WireError::TooLarge { .. }
        )
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Closed => write!(f, "the other end closed the socket"),
            WireError::Truncated { got, expected } => write!(
                f,
                "the other end closed the socket mid-message ({got} of {expected} bytes)"
            ),
            WireError::BadMagic { found } => write!(
                f,
                "a message that is not a minato frame (starts with b\"{}\")",
                found.escape_ascii()
            ),
            WireError::TooManyFds { count } => write!(
                f,
                "a frame announcing {count} file descriptors (at most {} allowed)",
                super::MAX_FDS
            ),
            WireError::FdCountMismatch {
                announced,
                received,
            } => write!(
                f,
                "a frame announcing {announced} file descriptors came with {received}"
            ),
            WireError::TooLarge { length } => {
                write!(f, "a frame announcing a payload of {length} bytes")
            }
            WireError::TimedOut => write!(f, "no message within the time allowed"),
            WireError::Io(err) => write!(f, "{err}"),
        }
    }
}

impl std::error::Error for WireError {}

impl From<std::io::Error> for WireError {
    fn from(err: std::io::Error) -> Self {
        WireError::Io(err)
    }
}
