//! Batch assembly without Python: copying equally sized samples into one
//! preallocated batch buffer (pinned memory, when the caller asks for it),
//! in parallel, so the bindings can do it with the GIL released.

mod stack;

pub use stack::{stack_into, StackError};
