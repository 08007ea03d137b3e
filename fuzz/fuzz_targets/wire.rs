//! The worker-process wire's frame reader: any bytes, split anywhere, give
//! a frame or a typed error, and a frame never claims more than arrived.
#![no_main]

use std::os::fd::OwnedFd;

use libfuzzer_sys::fuzz_target;
use minato::wire::{read_frame, Transport, WireError, HEADER_BYTES};

/// The input's bytes, handed out in pieces whose sizes the input's first
/// byte sets.
struct Pieces<'a> {
    bytes: &'a [u8],
    piece: usize,
}

impl Transport for Pieces<'_> {
    fn receive(&mut self, buf: &mut [u8], _fds: &mut Vec<OwnedFd>) -> Result<usize, WireError> {
        let count = self.piece.min(buf.len()).min(self.bytes.len());
        buf[..count].copy_from_slice(&self.bytes[..count]);
        self.bytes = &self.bytes[count..];
        Ok(count)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&piece, bytes)) = data.split_first() else {
        return;
    };
    let mut source = Pieces {
        bytes,
        piece: usize::from(piece).max(1),
    };
    while let Ok(frame) = read_frame(&mut source) {
        assert!(HEADER_BYTES + frame.payload.len() <= bytes.len());
        assert!(frame.fds.is_empty());
    }
});
