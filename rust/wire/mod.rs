//! The wire between the loader and its worker processes: frames over a Unix
//! stream socket, each a fixed header, a payload (a pickle, to Python) and
//! the file descriptors sent beside it (`SCM_RIGHTS`: the shared memory a
//! payload's large tensors live in).
//!
//! Read and written here, with the GIL released, so that a worker thread
//! takes the GIL once to pickle a task and once to unpickle its answer,
//! not around every socket call. A frame the other end cuts short, or one
//! that is not a frame, is a typed [`WireError`]: the caller fails the task
//! and stops the process, and nothing is allocated from a length it has not
//! received. Large payloads go beside the frames, in shared memory
//! ([`SlotRing`] and [`SlotMap`]), or in their place in a batch
//! ([`ArenaPool`]).

mod arena;
mod arena_pool;
mod error;
mod frame;
mod slots;
mod socket;

pub use arena::{Arena, ArenaLayout};
pub use arena_pool::{
    ArenaPool, Destination, Lease, Placement, MAX_FREE_ARENAS, MAX_FREE_BYTES, MAX_MISSES,
};
pub use error::WireError;
pub use frame::{read_frame, Frame, FrameHeader, Transport, HEADER_BYTES, MAX_FDS};
pub use slots::{Segment, SlotMap, SlotRing, Taken};
pub use socket::WireSocket;
