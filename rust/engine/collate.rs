//! What the sample-level engine does with a batch's samples once they are
//! assembled, on its own thread: the consumer's thread (the training loop)
//! receives the batch ready to use.

/// Turns a batch's samples into the batch delivered (the user's
/// `collate_fn`, then pinning, in the Python bindings).
pub trait Collate<S>: Send + Sync + 'static {
    type Batch: Send + 'static;

    /// Wraps the collating thread's whole life (the bindings attach it to
    /// the interpreter once, as they do a worker thread).
    fn enter_thread(&self, body: &mut (dyn FnMut() + Send)) {
        body()
    }

    fn collate(&self, samples: Vec<S>) -> Self::Batch;

    /// Whether a batch may be collated on whichever worker thread completes
    /// it, in parallel with others, instead of on the engine's one collate
    /// thread: a collate whose result does not depend on the thread it runs
    /// on (one that draws no random numbers from a thread's generators).
    /// Many workers then share the collates, as whole-batch workers do,
    /// where one collate thread among them gets a core as seldom as any.
    fn any_thread(&self) -> bool {
        false
    }
}

/// Delivers the samples as they are: the batch is the list of samples.
pub struct Uncollated;

impl<S: Send + 'static> Collate<S> for Uncollated {
    type Batch = Vec<S>;

    fn collate(&self, samples: Vec<S>) -> Vec<S> {
        samples
    }

    fn any_thread(&self) -> bool {
        true
    }
}
