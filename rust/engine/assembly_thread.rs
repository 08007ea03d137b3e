//! The sample-level engine's assembly thread: it collates the batches the
//! workers complete (they take them from the assembler as they hand in
//! their samples, see `SampleShared::deliver`), and queues them for the
//! consumer. It wakes per batch, not per finished task. The consumer's
//! thread (the training loop) only takes a finished batch.

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
    /// A collated batch of `epoch`, of `samples` samples.
    Batch {
        epoch: u64,
        samples: usize,
        batch: B,
    },
    /// No batch, but the state changed in a way the waiting consumer must
    /// see (broken, starved, or nothing left pending): it looks again.
    Changed,
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
        let handle = std::thread::Builder::new()
            .name("minato-collate".to_owned())
            .spawn(move || {
                collate.enter_thread(&mut || {
                    run(&shared, &stop_rx, &collate, &output_tx);
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

fn run<S, W, C>(
    shared: &SampleShared<S, W>,
    stop: &Receiver<()>,
    collate: &C,
    output: &Sender<Output<C::Batch>>,
) where
    W: WorkerHooks<Output = Vec<Sample<S>>>,
    C: Collate<S>,
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
        match assemble(shared, collate, output) {
            Some(next) => wake_in = next,
            None => return,
        }
    }
}

/// Takes the batches waiting and any now ready, then collates and sends
/// them. Returns when to look again without news (the next batch waits for
/// a sample that may be late by then), or None once the consumer is gone.
fn assemble<S, W, C>(
    shared: &SampleShared<S, W>,
    collate: &C,
    output: &Sender<Output<C::Batch>>,
) -> Option<Option<Duration>>
where
    W: WorkerHooks<Output = Vec<Sample<S>>>,
    C: Collate<S>,
{
    #[cfg(test)]
    shared
        .passes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (epoch, batches, changed, wake_in) = {
        let mut core = shared.lock();
        core.hand_ready();
        let batches: Vec<Vec<S>> = core.taken.drain(..).collect();
        let changed = batches.is_empty() && core.no_batch_coming().is_some();
        let wake_in = core.assembler.wake_in();
        core.look_at = wake_in.map(|due| Instant::now() + due);
        (core.workers.epoch(), batches, changed, wake_in)
    };
    for batch in batches {
        let samples = batch.len();
        // Outside the lock: collating calls the user's code.
        match catch_unwind(AssertUnwindSafe(|| collate.collate(batch))) {
            Ok(batch) => {
                if output
                    .send(Output::Batch {
                        epoch,
                        samples,
                        batch,
                    })
                    .is_err()
                {
                    return None;
                }
            }
            Err(payload) => {
                let mut core = shared.lock();
                if core.workers.epoch() == epoch {
                    core.broken = Some(EngineError::CollatorPanicked(panic_message(&*payload)));
                }
                drop(core);
                if output.send(Output::Changed).is_err() {
                    return None;
                }
            }
        }
    }
    if changed && output.send(Output::Changed).is_err() {
        return None;
    }
    // A batch delivered may have been held by a sample that is no longer
    // pending: the next one is looked at afresh on the next news.
    Some(wake_in)
}
