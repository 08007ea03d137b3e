//! A frame: its header, and reading one from any byte source.

use std::os::fd::OwnedFd;

use super::WireError;

/// The bytes every frame starts with.
const MAGIC: [u8; 4] = *b"MNW1";
/// Magic, descriptor count (u32), payload length (u64), little-endian.
pub const HEADER_BYTES: usize = 16;
/// Descriptors per frame, below the kernel's `SCM_MAX_FD` (253).
pub const MAX_FDS: usize = 240;
/// No payload is this large: a length past it is garbage, not a frame.
const MAX_PAYLOAD_BYTES: u64 = 1 << 40;
/// A payload's buffer starts this large and at most doubles as its bytes
/// arrive: a garbage length allocates little more than what was received.
const FIRST_READ: usize = 64 << 10;

/// What a frame's header announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub fds: u32,
    pub length: u64,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut bytes = [0u8; HEADER_BYTES];
        bytes[..4].copy_from_slice(&MAGIC);
        bytes[4..8].copy_from_slice(&self.fds.to_le_bytes());
        bytes[8..].copy_from_slice(&self.length.to_le_bytes());
        bytes
    }

    /// The header in `bytes`, checked.
    pub fn parse(bytes: &[u8; HEADER_BYTES]) -> Result<Self, WireError> {
        let found: [u8; 4] = bytes[..4].try_into().expect("4 bytes");
        if found != MAGIC {
            return Err(WireError::BadMagic { found });
        }
        let fds = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        let length = u64::from_le_bytes(bytes[8..].try_into().expect("8 bytes"));
        if fds as usize > MAX_FDS {
            return Err(WireError::TooManyFds { count: fds });
        }
        if length > MAX_PAYLOAD_BYTES {
            return Err(WireError::TooLarge { length });
        }
        Ok(FrameHeader { fds, length })
    }
}

/// A frame received whole: its payload, and the descriptors that came with
/// it (closed when dropped, unless taken).
#[derive(Debug)]
pub struct Frame {
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

/// Where frames come from: a socket, or bytes in a test.
pub trait Transport {
    /// Reads up to `buf.len()` bytes into `buf`, appending any descriptors
    /// that arrive with them to `fds`; 0 at the end of the stream.
    fn receive(&mut self, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<usize, WireError>;
}

/// Reads one frame from `source`. Descriptors received before a failure are
/// closed.
pub fn read_frame(source: &mut impl Transport) -> Result<Frame, WireError> {
    let mut fds = Vec::new();
    let mut header = [0u8; HEADER_BYTES];
    let mut got = 0;
    while got < HEADER_BYTES {
        let count = source.receive(&mut header[got..], &mut fds)?;
        if count == 0 {
            return Err(if got == 0 {
                WireError::Closed
            } else {
                WireError::Truncated {
                    got: got as u64,
                    expected: HEADER_BYTES as u64,
                }
            });
        }
        got += count;
    }
    let header = FrameHeader::parse(&header)?;
    // The kernel delivers a message's descriptors with its first byte: all
    // of them have arrived with the header.
    if fds.len() != header.fds as usize {
        return Err(WireError::FdCountMismatch {
            announced: header.fds,
            received: fds.len(),
        });
    }
    let length = header.length as usize;
    let mut payload = Vec::with_capacity(length.min(FIRST_READ));
    while payload.len() < length {
        let filled = payload.len();
        let grow_to = length.min((2 * filled).max(FIRST_READ));
        payload.resize(grow_to, 0);
        let count = source.receive(&mut payload[filled..], &mut fds)?;
        payload.truncate(filled + count);
        if count == 0 {
            return Err(WireError::Truncated {
                got: (HEADER_BYTES + filled) as u64,
                expected: HEADER_BYTES as u64 + header.length,
            });
        }
    }
    if fds.len() != header.fds as usize {
        // Descriptors arrived mid-payload: not from a frame's sender.
        return Err(WireError::FdCountMismatch {
            announced: header.fds,
            received: fds.len(),
        });
    }
    Ok(Frame { payload, fds })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bytes handed out in pieces of the given sizes.
    struct Pieces<'a> {
        bytes: &'a [u8],
        sizes: Vec<usize>,
        at: usize,
    }

    impl Transport for Pieces<'_> {
        fn receive(&mut self, buf: &mut [u8], _fds: &mut Vec<OwnedFd>) -> Result<usize, WireError> {
            let size = if self.sizes.is_empty() {
                buf.len()
            } else {
                self.sizes.remove(0).max(1)
            };
            let count = size.min(buf.len()).min(self.bytes.len() - self.at);
            buf[..count].copy_from_slice(&self.bytes[self.at..self.at + count]);
            self.at += count;
            Ok(count)
        }
    }

    fn frame_bytes(payload: &[u8]) -> Vec<u8> {
        let header = FrameHeader {
            fds: 0,
            length: payload.len() as u64,
        };
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(payload);
        bytes
    }

    fn read(bytes: &[u8], sizes: Vec<usize>) -> Result<Frame, WireError> {
        read_frame(&mut Pieces {
            bytes,
            sizes,
            at: 0,
        })
    }

    #[test]
    fn a_frame_reads_back_whole_however_it_is_split() {
        let bytes = frame_bytes(b"hello, worker");
        for split in 1..bytes.len() {
            let frame = read(&bytes, vec![split, 1, 3]).unwrap();
            assert_eq!(frame.payload, b"hello, worker");
        }
    }

    #[test]
    fn each_malformed_frame_is_its_own_error() {
        assert!(matches!(read(b"", vec![]), Err(WireError::Closed)));
        let bytes = frame_bytes(b"payload");
        assert!(matches!(
            read(&bytes[..5], vec![]),
            Err(WireError::Truncated {
                got: 5,
                expected: 16
            })
        ));
        assert!(matches!(
            read(&bytes[..20], vec![]),
            Err(WireError::Truncated {
                got: 20,
                expected: 23
            })
        ));
        assert!(matches!(
            read(b"GARBAGE GARBAGE GARBAGE", vec![]),
            Err(WireError::BadMagic { .. })
        ));
        let mut too_many = frame_bytes(b"");
        too_many[4..8].copy_from_slice(&1000u32.to_le_bytes());
        assert!(matches!(
            read(&too_many, vec![]),
            Err(WireError::TooManyFds { count: 1000 })
        ));
        let mut missing = frame_bytes(b"");
        missing[4..8].copy_from_slice(&2u32.to_le_bytes());
        assert!(matches!(
            read(&missing, vec![]),
            Err(WireError::FdCountMismatch {
                announced: 2,
                received: 0
            })
        ));
        let mut huge = frame_bytes(b"");
        huge[8..].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            read(&huge, vec![]),
            Err(WireError::TooLarge { .. })
        ));
        assert!(WireError::TooLarge { length: 0 }.is_malformed());
        assert!(!WireError::Closed.is_malformed());
    }

    #[test]
    fn a_long_announced_payload_allocates_only_what_arrived() {
        let mut bytes = frame_bytes(b"");
        bytes[8..].copy_from_slice(&(1u64 << 39).to_le_bytes());
        bytes.extend_from_slice(&[7; 100]);
        match read(&bytes, vec![]) {
            Err(WireError::Truncated { got, .. }) => assert_eq!(got, 116),
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        /// Any bytes at all: a frame or a typed error, never a panic.
        #[test]
        fn any_bytes_give_a_frame_or_an_error(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            sizes in proptest::collection::vec(1usize..20, 0..8),
            magic in any::<bool>(),
        ) {
            let mut bytes = bytes;
            if magic && bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&MAGIC);
            }
            let _ = read(&bytes, sizes);
        }

        #[test]
        fn a_frame_followed_by_more_reads_back_exactly(
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            sizes in proptest::collection::vec(1usize..50, 0..10),
        ) {
            let mut bytes = frame_bytes(&payload);
            bytes.extend_from_slice(&frame_bytes(b"next"));
            let mut source = Pieces { bytes: &bytes, sizes, at: 0 };
            prop_assert_eq!(read_frame(&mut source).unwrap().payload, payload);
            prop_assert_eq!(read_frame(&mut source).unwrap().payload, b"next".to_vec());
            prop_assert!(matches!(read_frame(&mut source), Err(WireError::Closed)));
        }
    }
}
