//! The sample-level engine's assembly thread: it collates the batches the
//! workers complete (they take them from the assembler as they hand in
//! their samples, see `SampleShared::deliver`), and queues them for the
//! consumer. It wakes per batch, not per finished task. The consumer's
//! thread (the training loop) only takes a finished batch.
//!
//! Where a batch may be collated on any thread (`Collate::any_thread`),
//! the worker completing it collates it instead, and the thread only moves
//! batches on past late samples and tells the consumer what changed.

use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{after, never, select, unbounded, Receiver, Sender};

use super::collate::Collate;
use super::error::EngineError;
use super::pool::{panic_message, WorkerHooks};
use super::sample_core::SampleShared;
use super::task::Sample;

/// What the assembly thread hands the consumer.
pub(crate) enum Output<B> {
    /// A collated batch of `epoch`, of `samples` samples, the `ordinal`th
    /// taken that epoch: collated on several threads, batches may arrive out
    /// of that order.
    Batch {
        epoch: u64,
        ordinal: u64,
        samples: usize,
        batch: B,
    },
    /// No batch, but the state changed in a way the waiting consumer must
    /// see (broken, starved, or nothing left pending): it looks again.
    Changed,
}

/// Collates the batches taken and queues them for the consumer, on
/// whichever thread took them (see [`SampleShared::collate_taken`]).
pub(crate) trait CollateTaken<S>: Send + Sync {
    /// Whether the workers collate the batches they complete.
    fn on_workers(&self) -> bool;

    /// Collates `batch`, the `ordinal`th taken in `epoch`, and queues it:
    /// the collate's panic message if it panicked, or Err once the
    /// consumer is gone.
    fn collate_one(&self, epoch: u64, ordinal: u64, batch: Vec<S>) -> Result<Option<String>, ()>;

    /// Tells the consumer to look at the state again; false once it is gone.
    fn changed(&self) -> bool;
}

/// The engine's collate and the queue to the consumer.
struct Collator<C: Collate<S>, S> {
    collate: C,
    output: Sender<Output<C::Batch>>,
    samples: PhantomData<fn(S)>,
}

impl<S: Send + 'static, C: Collate<S>> CollateTaken<S> for Collator<C, S> {
    fn on_workers(&self) -> bool {
        self.collate.any_thread()
    }

    fn collate_one(&self, epoch: u64, ordinal: u64, batch: Vec<S>) -> Result<Option<String>, ()> {
        let samples = batch.len();
        match catch_unwind(AssertUnwindSafe(|| self.collate.collate(batch))) {
            Ok(batch) => self
                .output
                .send(Output::Batch {
                    epoch,
                    ordinal,
                    samples,
                    batch,
                })
                .map(|()| None)
                .map_err(|_| ()),
            Err(payload) => Ok(Some(panic_message(&*payload))),
        }
    }

    fn changed(&self) -> bool {
        self.output.send(Output::Changed).is_ok()
    }
}

/// A started thread, and the receiver of what it delivers.
type Started<B> = (AssemblyThread, Receiver<Output<B>>);

pub(crate) struct AssemblyThread {
    /// Stops the thread when sent to or dropped.
    stop: Sender<()>,
    exited: Receiver<()>,
    handle: Option<JoinHandle<()>>,
}

impl AssemblyThread {
    /// Starts the thread; what it delivers arrives on the returned receiver.
    pub fn start<S, W, C>(
        shared: Arc<SampleShared<S, W>>,
        collate: C,
    ) -> Result<Started<C::Batch>, EngineError>
    where
        S: Send + 'static,
        W: WorkerHooks<Output = Vec<Sample<S>>>,
        C: Collate<S>,
    {
        let (stop, stop_rx) = crossbeam_channel::bounded(1);
        let (exited_tx, exited) = crossbeam_channel::bounded(1);
        // Unbounded: batches in it count toward the engine's in-flight
        // bound on samples, which bounds it.
        let (output_tx, output) = unbounded();
        let collator = Arc::new(Collator {
            collate,
            output: output_tx,
            samples: PhantomData,
        });
        shared.set_collator(collator.clone());
        let handle = std::thread::Builder::new()
            .name("minato-collate".to_owned())
            .spawn(move || {
                collator.collate.enter_thread(&mut || {
                    run(&shared, &stop_rx);
                });
                let _ = exited_tx.send(());
            })
            .map_err(|err| EngineError::Spawn(err.to_string()))?;
        Ok((
            AssemblyThread {
                stop,
                exited,
                handle: Some(handle),
            },
            output,
        ))
    }

    /// Stops the thread, waiting at most `grace` for a collation it is in;
    /// idempotent. Returns 1 if it was left to finish on its own, else 0.
    pub fn stop(&mut self, grace: Duration) -> usize {
        let Some(handle) = self.handle.take() else {
            return 0;
        };
        let _ = self.stop.try_send(());
        if self.exited.recv_timeout(grace).is_ok() {
            let _ = handle.join();
            0
        } else {
            1 // detached: it exits once its collation returns
        }
    }
}

fn run<S, W>(shared: &SampleShared<S, W>, stop: &Receiver<()>)
where
    W: WorkerHooks<Output = Vec<Sample<S>>>,
{
    let wake_ups = shared.wake_ups();
    // Set while the next batch waits for a sample not yet late: it may be
    // late by then, and move on without it.
    let mut wake_in: Option<Duration> = None;
    loop {
        let wake = wake_in.map_or_else(never, after);
        select! {
            recv(wake_ups) -> _ => {}
            recv(stop) -> _ => return, // asked to stop, or the engine is gone
            recv(wake) -> _ => {}
        }
        match assemble(shared) {
            Some(next) => wake_in = next,
            None => return,
        }
    }
}

/// Takes the batches waiting and any now ready, then collates and sends
/// them. Returns when to look again without news (the next batch waits for
/// a sample that may be late by then), or None once the consumer is gone.
fn assemble<S, W>(shared: &SampleShared<S, W>) -> Option<Option<Duration>>
where
    W: WorkerHooks<Output = Vec<Sample<S>>>,
{
    #[cfg(test)]
    shared
        .passes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (epoch, batches, changed, wake_in) = {
        let mut core = shared.lock();
        core.hand_ready();
        let batches: Vec<(u64, Vec<S>)> = core.taken.drain(..).collect();
        let changed = batches.is_empty() && core.no_batch_coming().is_some();
        let wake_in = core.assembler.wake_in();
        core.look_at = wake_in.map(|due| Instant::now() + due);
        (core.workers.epoch(), batches, changed, wake_in)
    };
    if !shared.collate_taken(epoch, batches) {
        return None;
    }
    if changed && !shared.tell_changed() {
        return None;
    }
    // A batch delivered may have been held by a sample that is no longer
    // pending: the next one is looked at afresh on the next news.
    Some(wake_in)
}
