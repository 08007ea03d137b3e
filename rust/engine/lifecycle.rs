//! What every engine does between epochs and at the end, so that bindings
//! can drive either engine the same way.

use std::time::Duration;

use super::error::EngineError;

pub trait Lifecycle {
    /// Ends the current epoch: its queued work is skipped, tasks already
    /// running are waited for and their results dropped.
    fn new_epoch(&mut self) -> Result<(), EngineError>;

    /// Stops and joins the workers, waiting at most `grace` for one still
    /// inside a task; idempotent. Returns how many threads were left to
    /// finish their task and exit on their own.
    fn shutdown(&mut self, grace: Duration) -> usize;

    /// [`Self::shutdown`] with the engine's configured grace.
    fn shutdown_with_default_grace(&mut self) -> usize;
}
