//! The worker-thread engine: framework-agnostic, no Python in sight.
//!
//! A consumer submits tasks (a payload each) and receives their outputs, in
//! submission order or in completion order. Worker threads run a
//! [`WorkerHooks`] implementation; the Python bindings supply one that calls
//! into the user's dataset. Everything here is tested by `cargo test`.

mod assembler;
mod assembly_thread;
mod collate;
mod consumer_steps;
mod controller;
mod cpu;
mod dispatch;
mod error;
mod fetch_times;
mod gil_contention;
mod lifecycle;
mod look;
mod monitor;
mod moved_stalls;
mod pool;
mod sample_core;
mod sample_ledger;
mod sample_scheduler;
mod sample_seed;
mod sample_sequence;
mod sample_timeout;
mod scheduler;
mod sequencer;
mod stats;
mod task;
mod task_clock;
mod thread_state;
mod workers;

pub use collate::{Collate, Uncollated};
pub use controller::{Controller, ControllerConfig, Resize, ResizeReason, Window};
pub use cpu::{cores_busy_time, runnable_wait, thread_cpu_time, thread_runnable_wait};
pub use dispatch::Dispatch;
pub use error::EngineError;
pub use lifecycle::Lifecycle;
pub use pool::WorkerHooks;
pub use sample_ledger::SampleLedger;
pub use sample_scheduler::{SampleEngine, SampleEngineConfig};
pub use sample_seed::{epoch_seed, sample_seed};
pub use sample_timeout::SampleTimeout;
pub use scheduler::{Engine, EngineConfig};
pub use sequencer::Order;
pub use stats::EngineStats;
pub use task::{Outcome, Sample};
pub use task_clock::{Pause, TaskClock};
pub use thread_state::computes_in;

#[cfg(test)]
mod tests;
