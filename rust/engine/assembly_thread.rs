//! The sample-level engine's assembly thread: it takes finished samples off
//! the workers' result queue, builds batches as soon as their samples are
//! ready, collates them, and queues them for the consumer. The consumer's
//! thread (the training loop) only takes a finished batch.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{after, never, select, unbounded, Receiver, Sender};

use super::collate::Collate;
use super::error::EngineError;
use super::pool::{panic_message, WorkerHooks};
use super::sample_core::SampleShared;
use super::task::{Done, Sample};

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

enum Control {
    /// Batches may be ready without a new result (a submission or the
    /// epoch's close changed the plan): look.
    Check,
    Stop,
}

/// A started thread, and the receiver of what it delivers.
type Started<B> = (AssemblyThread, Receiver<Output<B>>);

pub(crate) struct AssemblyThread {
    control: Sender<Control>,
    exited: Receiver<()>,
    handle: Option<JoinHandle<()>>,
}

impl AssemblyThread {
    /// Starts the thread; what it delivers arrives on the returned receiver.
    pub fn start<S, W, C>(
        shared: Arc<SampleShared<S, W>>,
        results: Receiver<Done<Vec<Sample<S>>>>,
        collate: C,
    ) -> Result<Started<C::Batch>, EngineError>
    where
        S: Send + 'static,
        W: WorkerHooks<Output = Vec<Sample<S>>>,
        C: Collate<S>,
    {
        let (control, control_rx) = unbounded();
        let (exited_tx, exited) = crossbeam_channel::bounded(1);
        // Unbounded: batches in it count toward the engine's in-flight
        // bound on samples, which bounds it.
        let (output_tx, output) = unbounded();
        let handle = std::thread::Builder::new()
            .name("minato-collate".to_owned())
            .spawn(move || {
                collate.enter_thread(&mut || {
                    run(&shared, &results, &control_rx, &collate, &output_tx);
                });
                let _ = exited_tx.send(());
            })
            .map_err(|err| EngineError::Spawn(err.to_string()))?;
        Ok((
            AssemblyThread {
                control,
                exited,
                handle: Some(handle),
            },
            output,
        ))
    }

    /// Asks the thread to look for ready batches.
    pub fn check(&self) {
        let _ = self.control.send(Control::Check);
    }

    /// Stops the thread, waiting at most `grace` for a collation it is in;
    /// idempotent. Returns 1 if it was left to finish on its own, else 0.
    pub fn stop(&mut self, grace: Duration) -> usize {
        let Some(handle) = self.handle.take() else {
            return 0;
        };
        let _ = self.control.send(Control::Stop);
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
    results: &Receiver<Done<Vec<Sample<S>>>>,
    control: &Receiver<Control>,
    collate: &C,
    output: &Sender<Output<C::Batch>>,
) where
    W: WorkerHooks<Output = Vec<Sample<S>>>,
    C: Collate<S>,
{
    // Set while the next batch waits for a sample not yet late: it may be
    // late by then, and move on without it.
    let mut wake_in: Option<Duration> = None;
    loop {
        let wake = wake_in.map_or_else(never, after);
        let done = select! {
            recv(results) -> done => match done {
                Ok(done) => Some(done),
                Err(_) => return, // every worker is gone: the engine shut down
            },
            recv(control) -> message => match message {
                Ok(Control::Check) => None,
                Ok(Control::Stop) | Err(_) => return,
            },
            recv(wake) -> _ => None,
        };
        match assemble(shared, done, collate, output) {
            Some(next) => wake_in = next,
            None => return,
        }
    }
}

/// Takes in `done`, then collates and sends every batch it completed.
/// Returns when to look again without news (the next batch waits for a
/// sample that may be late by then), or None once the consumer is gone.
fn assemble<S, W, C>(
    shared: &SampleShared<S, W>,
    done: Option<Done<Vec<Sample<S>>>>,
    collate: &C,
    output: &Sender<Output<C::Batch>>,
) -> Option<Option<Duration>>
where
    W: WorkerHooks<Output = Vec<Sample<S>>>,
    C: Collate<S>,
{
    let (epoch, batches, changed, wake_in) = {
        let mut core = shared.lock();
        if let Some(done) = done {
            core.workers.received(done.worker);
            shared.notify_received();
            core.accept(done);
        }
        let batches = core.take_ready();
        let changed = batches.is_empty() && core.no_batch_coming().is_some();
        (
            core.workers.epoch(),
            batches,
            changed,
            core.assembler.wake_in(),
        )
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
