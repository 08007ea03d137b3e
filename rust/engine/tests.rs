//! Engine behaviour: delivery order, exactly-once, epochs, shutdown.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

/// What a test task asks its worker to do.
#[derive(Debug, Clone, Copy)]
enum Job {
    /// Sleep this many microseconds, then return the value.
    Value {
        value: u64,
        sleep_us: u64,
    },
    Exhaust,
    Panic,
}

/// Test hooks: counts the threads alive inside them.
struct Hooks {
    inside: Arc<AtomicUsize>,
}

impl WorkerHooks for Hooks {
    type Payload = Job;
    type Output = (usize, u64);
    type State = usize;

    fn enter_thread(&self, _worker_id: usize, body: &mut (dyn FnMut() + Send)) {
        self.inside.fetch_add(1, AtomicOrdering::SeqCst);
        body();
        self.inside.fetch_sub(1, AtomicOrdering::SeqCst);
    }

    fn init(&self, worker_id: usize) -> usize {
        worker_id
    }

    fn run(&self, worker: &mut usize, _epoch: u64, job: Job) -> Outcome<(usize, u64)> {
        match job {
            Job::Value { value, sleep_us } => {
                thread::sleep(Duration::from_micros(sleep_us));
                Outcome::Value((*worker, value))
            }
            Job::Exhaust => Outcome::Exhausted,
            Job::Panic => panic!("task asked to panic"),
        }
    }
}

fn config(
    num_workers: usize,
    max_in_flight: usize,
    order: Order,
    dispatch: Dispatch,
) -> EngineConfig {
    EngineConfig {
        num_workers,
        max_in_flight,
        order,
        dispatch,
        shutdown_grace: Duration::from_secs(10),
        adaptive: None,
    }
}

fn start(cfg: EngineConfig) -> (Engine<Hooks>, Arc<AtomicUsize>) {
    let inside = Arc::new(AtomicUsize::new(0));
    let engine = Engine::start(
        cfg,
        Hooks {
            inside: inside.clone(),
        },
    )
    .expect("threads start");
    (engine, inside)
}

const WAIT: Duration = Duration::from_secs(10);

/// The pool's sizes over its life, in order.
fn pool_sizes(stats: &EngineStats) -> Vec<usize> {
    stats.worker_history.iter().map(|&(_, n)| n).collect()
}

/// A job that sleeps `sleep_us` microseconds, then returns `value`.
fn value_after(value: u64, sleep_us: u64) -> Job {
    Job::Value { value, sleep_us }
}

/// Jobs that return each value at once.
fn instant_values(values: std::ops::Range<u64>) -> Vec<Job> {
    values.map(|value| value_after(value, 0)).collect()
}

/// Submits `jobs` keeping the engine full, receiving as it goes; returns the outputs.
fn run_all(engine: &mut Engine<Hooks>, jobs: &[Job]) -> Vec<Result<(usize, u64), EngineError>> {
    let mut jobs = jobs.iter().copied();
    let mut out = Vec::new();
    let mut more = true;
    loop {
        while more && engine.can_submit() {
            match jobs.next() {
                Some(job) => engine.submit(job).unwrap(),
                None => more = false,
            }
        }
        match engine.recv(WAIT) {
            Err(EngineError::Idle) if !more => return out,
            Err(EngineError::Idle) => continue,
            other => out.push(other),
        }
    }
}

#[test]
fn submission_order_is_kept_whatever_the_task_durations() {
    let (mut engine, _) = start(config(4, 8, Order::Submission, Dispatch::Shared));
    let jobs: Vec<Job> = (0..40).map(|i| value_after(i, (40 - i) * 100)).collect();
    let values: Vec<u64> = run_all(&mut engine, &jobs)
        .into_iter()
        .map(|r| r.unwrap().1)
        .collect();
    assert_eq!(values, (0..40).collect::<Vec<_>>());
}

#[test]
fn completion_order_lets_fast_tasks_pass_a_slow_one() {
    let (mut engine, _) = start(config(2, 4, Order::Completion, Dispatch::Shared));
    engine.submit(value_after(0, 300_000)).unwrap();
    engine.submit(value_after(1, 0)).unwrap();
    assert_eq!(engine.recv(WAIT).unwrap().1, 1);
    assert_eq!(engine.recv(WAIT).unwrap().1, 0);
    assert_eq!(engine.recv(WAIT), Err(EngineError::Idle));
}

#[test]
fn submit_refuses_past_the_in_flight_bound() {
    let (mut engine, _) = start(config(1, 2, Order::Submission, Dispatch::Shared));
    engine.submit(value_after(0, 0)).unwrap();
    engine.submit(value_after(1, 0)).unwrap();
    assert!(!engine.can_submit());
    assert_eq!(engine.submit(value_after(2, 0)), Err(EngineError::Full));
    engine.recv(WAIT).unwrap();
    assert!(engine.can_submit());
}

#[test]
fn recv_reports_an_elapsed_wait_and_the_result_still_arrives() {
    let (mut engine, _) = start(config(1, 1, Order::Submission, Dispatch::Shared));
    engine.submit(value_after(7, 200_000)).unwrap();
    assert_eq!(
        engine.recv(Duration::from_millis(1)),
        Err(EngineError::WaitElapsed)
    );
    assert_eq!(engine.recv(WAIT).unwrap().1, 7);
}

#[test]
fn a_zero_wait_only_looks_and_takes_a_result_already_waiting() {
    // The consumer's first look for a batch is made with the GIL held: it
    // answers at once, with the result if one is waiting.
    let (mut engine, _) = start(config(1, 1, Order::Submission, Dispatch::Shared));
    engine.submit(value_after(7, 200_000)).unwrap();
    assert_eq!(engine.recv(Duration::ZERO), Err(EngineError::WaitElapsed));
    let deadline = Instant::now() + WAIT;
    loop {
        match engine.recv(Duration::ZERO) {
            Ok(output) => {
                assert_eq!(output.1, 7);
                break;
            }
            Err(EngineError::WaitElapsed) if Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(1));
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn round_robin_gives_task_i_to_worker_i_mod_n_and_drops_exhausted_workers() {
    let (mut engine, _) = start(config(3, 6, Order::Submission, Dispatch::RoundRobin));
    for i in 0..3 {
        engine.submit(value_after(i, 0)).unwrap();
    }
    let workers: Vec<usize> = (0..3).map(|_| engine.recv(WAIT).unwrap().0).collect();
    assert_eq!(workers, vec![0, 1, 2]);
    // Worker 0 reports exhaustion: it delivers nothing and gets no more tasks.
    engine.submit(Job::Exhaust).unwrap();
    engine.submit(value_after(4, 0)).unwrap();
    assert_eq!(engine.recv(WAIT).unwrap(), (1, 4));
    engine.submit(value_after(5, 0)).unwrap();
    engine.submit(value_after(6, 0)).unwrap();
    assert_eq!(engine.recv(WAIT).unwrap(), (2, 5));
    assert_eq!(engine.recv(WAIT).unwrap(), (1, 6));
}

#[test]
fn a_panicking_task_is_reported_in_its_place_and_the_worker_survives() {
    let (mut engine, inside) = start(config(1, 4, Order::Submission, Dispatch::Shared));
    engine.submit(value_after(0, 0)).unwrap();
    engine.submit(Job::Panic).unwrap();
    engine.submit(value_after(2, 0)).unwrap();
    assert_eq!(engine.recv(WAIT).unwrap().1, 0);
    match engine.recv(WAIT) {
        Err(EngineError::WorkerPanicked { worker: 0, message }) => {
            assert!(message.contains("asked to panic"))
        }
        other => panic!("expected a panic report, got {other:?}"),
    }
    assert_eq!(engine.recv(WAIT).unwrap().1, 2);
    assert_eq!(inside.load(AtomicOrdering::SeqCst), 1);
}

#[test]
fn a_new_epoch_drops_stale_tasks_and_restarts_round_robin() {
    let (mut engine, _) = start(config(2, 8, Order::Submission, Dispatch::RoundRobin));
    for i in 0..8 {
        engine.submit(value_after(i, 20_000)).unwrap();
    }
    engine.recv(WAIT).unwrap();
    engine.new_epoch().unwrap();
    assert_eq!(engine.pending(), 0);
    assert_eq!(engine.recv(WAIT), Err(EngineError::Idle));
    engine.submit(value_after(100, 0)).unwrap();
    assert_eq!(engine.recv(WAIT).unwrap(), (0, 100));
}

#[test]
fn shutdown_joins_every_worker_and_refuses_more_work() {
    let (mut engine, inside) = start(config(4, 8, Order::Submission, Dispatch::Shared));
    assert_eq!(engine.num_workers(), 4);
    for i in 0..8 {
        engine.submit(value_after(i, 1_000)).unwrap();
    }
    assert_eq!(engine.shutdown(Duration::from_secs(10)), 0);
    assert_eq!(inside.load(AtomicOrdering::SeqCst), 0);
    assert_eq!(engine.submit(Job::Exhaust), Err(EngineError::ShutDown));
    assert_eq!(engine.recv(WAIT), Err(EngineError::ShutDown));
}

#[test]
fn shutdown_leaves_a_stuck_worker_after_the_grace_period() {
    let (mut engine, inside) = start(config(1, 1, Order::Submission, Dispatch::Shared));
    engine.submit(value_after(0, 300_000)).unwrap();
    thread::sleep(Duration::from_millis(50));
    assert_eq!(engine.shutdown(Duration::from_millis(10)), 1);
    // It finishes its task and exits on its own.
    for _ in 0..200 {
        if inside.load(AtomicOrdering::SeqCst) == 0 {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!("the stuck worker never exited");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the durations, worker count, bound, order, and however early
    /// the consumer stops: every submitted task is delivered at most once,
    /// all of them when it reads to the end, and no thread outlives the engine.
    #[test]
    fn exactly_once_bounded_and_no_leaked_thread(
        sleeps in prop::collection::vec(0u64..2_000, 0..60),
        workers in 1usize..6,
        bound in 1usize..10,
        in_order in any::<bool>(),
        stop_after in prop::option::of(0usize..60),
    ) {
        let order = if in_order { Order::Submission } else { Order::Completion };
        let (mut engine, inside) = start(config(workers, bound, order, Dispatch::Shared));
        let mut next = 0usize;
        let mut seen = Vec::new();
        loop {
            while next < sleeps.len() && engine.can_submit() {
                engine.submit(value_after(next as u64, sleeps[next])).unwrap();
                next += 1;
            }
            prop_assert!(engine.pending() <= bound);
            if stop_after.is_some_and(|n| seen.len() >= n) {
                break;
            }
            match engine.recv(WAIT) {
                Ok((_, value)) => seen.push(value),
                Err(EngineError::Idle) => break,
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }
        let unique: BTreeSet<u64> = seen.iter().copied().collect();
        prop_assert_eq!(unique.len(), seen.len());
        if stop_after.is_none_or(|n| n >= sleeps.len()) {
            prop_assert_eq!(unique, (0..sleeps.len() as u64).collect::<BTreeSet<_>>());
        }
        if in_order {
            prop_assert_eq!(seen.clone(), (0..seen.len() as u64).collect::<Vec<_>>());
        }
        drop(engine);
        prop_assert_eq!(inside.load(AtomicOrdering::SeqCst), 0);
    }
}

/// Sample-level test hooks: each payload item sleeps its duration and
/// returns its value (or, for a duration of `SKIP`, skips it); threads
/// alive inside are counted.
struct SampleHooks {
    inside: Arc<AtomicUsize>,
}

/// The duration that makes a test sample skipped.
const SKIP: u64 = u64::MAX;
/// Added to a duration: the sample computes (spins) for it instead of sleeping.
const SPIN: u64 = 1 << 40;

fn spin_for(duration: Duration) {
    let until = Instant::now() + duration;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

impl WorkerHooks for SampleHooks {
    type Payload = Vec<(u64, u64)>;
    type Output = Vec<Sample<u64>>;
    type State = ();

    fn enter_thread(&self, _worker_id: usize, body: &mut (dyn FnMut() + Send)) {
        self.inside.fetch_add(1, AtomicOrdering::SeqCst);
        body();
        self.inside.fetch_sub(1, AtomicOrdering::SeqCst);
    }

    fn init(&self, _worker_id: usize) {}

    fn run(&self, _state: &mut (), _epoch: u64, run: Vec<(u64, u64)>) -> Outcome<Vec<Sample<u64>>> {
        Outcome::Value(
            run.into_iter()
                .map(|(value, sleep_us)| {
                    if sleep_us == SKIP {
                        return Sample::Skipped(value);
                    }
                    if sleep_us >= SPIN {
                        spin_for(Duration::from_micros(sleep_us - SPIN));
                    } else {
                        thread::sleep(Duration::from_micros(sleep_us));
                    }
                    Sample::Loaded(value)
                })
                .collect(),
        )
    }
}

type Samples = SampleEngine<(u64, u64), u64, SampleHooks>;

fn start_samples(
    num_workers: usize,
    max_samples_in_flight: usize,
    sample_timeout: SampleTimeout,
    max_slow_in_flight: usize,
) -> (Samples, Arc<AtomicUsize>) {
    start_samples_with(
        num_workers,
        max_samples_in_flight,
        sample_timeout,
        max_slow_in_flight,
        false,
    )
}

/// `start_samples`; with `in_sequence`, batches keep the order submitted.
fn start_samples_with(
    num_workers: usize,
    max_samples_in_flight: usize,
    sample_timeout: SampleTimeout,
    max_slow_in_flight: usize,
    in_sequence: bool,
) -> (Samples, Arc<AtomicUsize>) {
    let inside = Arc::new(AtomicUsize::new(0));
    let config = SampleEngineConfig {
        num_workers,
        max_samples_in_flight,
        max_batch_size: 8,
        sample_timeout,
        max_slow_in_flight,
        shutdown_grace: Duration::from_secs(10),
        adaptive: None,
        drop_last: false,
        in_sequence,
    };
    let engine = Samples::start(
        config,
        SampleHooks {
            inside: inside.clone(),
        },
    )
    .unwrap();
    (engine, inside)
}

/// Submits `sizes` batches of consecutive values with `sleeps`, keeping the
/// engine full, and returns the batches delivered.
fn run_batches(engine: &mut Samples, sizes: &[usize], sleeps: &[u64]) -> Vec<Vec<u64>> {
    run_batches_skipping(engine, sizes, sleeps).0
}

/// `run_batches`, closing the epoch once every batch is submitted (as the
/// Python iterator does), and also returning the skipped samples.
fn run_batches_skipping(
    engine: &mut Samples,
    sizes: &[usize],
    sleeps: &[u64],
) -> (Vec<Vec<u64>>, Vec<u64>) {
    let mut next_value = 0u64;
    let mut batches = sizes.iter();
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    let mut more = true;
    loop {
        while more && engine.can_submit() {
            match batches.next() {
                Some(&size) => {
                    let batch = (next_value..next_value + size as u64)
                        .map(|v| (v, sleeps[v as usize % sleeps.len()]))
                        .collect();
                    next_value += size as u64;
                    engine.submit(batch).unwrap();
                }
                None => {
                    more = false;
                    engine.close_epoch();
                }
            }
        }
        let received = engine.recv(WAIT);
        skipped.extend(engine.take_skipped());
        match received {
            Ok(batch) => out.push(batch),
            Err(EngineError::Idle) if !more => return (out, skipped),
            Err(EngineError::Idle | EngineError::Starved) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
}

/// The batch sizes a skipping epoch delivers: the planned ones, less the
/// skipped samples taken off the last batches; with drop_last a batch left
/// short is dropped.
fn sizes_after_skipping(planned: &[usize], skipped: usize, drop_last: bool) -> Vec<usize> {
    let mut sizes = planned.to_vec();
    let mut shortfall = skipped;
    let mut cut_short = false;
    while shortfall > 0 {
        let Some(last) = sizes.last_mut() else { break };
        let cut = shortfall.min(*last);
        *last -= cut;
        shortfall -= cut;
        cut_short = *last > 0;
        if *last == 0 {
            sizes.pop();
        }
    }
    if cut_short && drop_last {
        sizes.pop();
    }
    sizes
}

#[test]
fn a_slow_sample_does_not_hold_up_its_batch() {
    let (mut engine, _) = start_samples(2, 16, SampleTimeout::Off, 2);
    // Sample 0 takes 300 ms; the other seven are instant.
    engine
        .submit(
            (0..4)
                .map(|v| (v, if v == 0 { 300_000 } else { 0 }))
                .collect(),
        )
        .unwrap();
    engine.submit((4..8).map(|v| (v, 0)).collect()).unwrap();
    let first = engine.recv(WAIT).unwrap();
    assert!(!first.contains(&0), "{first:?}");
    let second = engine.recv(WAIT).unwrap();
    assert!(second.contains(&0));
    assert_eq!(engine.recv(WAIT), Err(EngineError::Idle));
}

#[test]
fn in_sequence_batches_keep_the_order_submitted_whatever_the_timing() {
    let (mut engine, _) = start_samples_with(3, 32, SampleTimeout::Auto { warmup: 4 }, 3, true);
    // Uneven costs, all far below the late threshold (at least 100 ms).
    let sleeps = [3_000, 0, 200, 15_000, 0, 1_000, 0];
    let sizes = [4, 4, 4, 3, 4, 4, 1];
    let batches = run_batches(&mut engine, &sizes, &sleeps);
    let mut next = 0u64;
    let expected: Vec<Vec<u64>> = sizes
        .iter()
        .map(|&size| {
            let batch = (next..next + size as u64).collect();
            next += size as u64;
            batch
        })
        .collect();
    assert_eq!(batches, expected);
    assert_eq!(engine.stats().moved_samples, 0);
}

#[test]
fn in_sequence_a_late_sample_joins_a_later_batch_and_is_counted() {
    let (mut engine, _) = start_samples_with(
        2,
        16,
        SampleTimeout::Fixed(Duration::from_millis(20)),
        2,
        true,
    );
    // Sample 0 takes 400 ms, past the 20 ms fixed timeout; the rest are instant.
    engine
        .submit(
            (0..4)
                .map(|v| (v, if v == 0 { 400_000 } else { 0 }))
                .collect(),
        )
        .unwrap();
    engine.submit((4..8).map(|v| (v, 0)).collect()).unwrap();
    assert_eq!(engine.recv(WAIT), Ok(vec![1, 2, 3, 4]));
    assert_eq!(engine.recv(WAIT), Ok(vec![0, 5, 6, 7]));
    assert_eq!(engine.stats().moved_samples, 1);
    assert_eq!(engine.recv(WAIT), Err(EngineError::Idle));
}

#[test]
fn a_worker_past_the_timeout_gets_a_replacement_which_retires_after() {
    let (mut engine, inside) =
        start_samples(2, 64, SampleTimeout::Fixed(Duration::from_millis(20)), 4);
    engine.submit(vec![(0, 400_000)]).unwrap();
    let mut grew = false;
    for _ in 0..200 {
        if engine.num_workers() == 3 {
            grew = true;
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    assert!(grew, "no replacement was started");
    assert_eq!(engine.recv(WAIT), Ok(vec![0]));
    assert_eq!(engine.slow_samples(), 1);
    // The flagged worker leaves once its sample is done.
    for _ in 0..200 {
        if engine.num_workers() == 2 {
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(engine.num_workers(), 2);
    engine.shutdown(Duration::from_secs(10));
    assert_eq!(inside.load(AtomicOrdering::SeqCst), 0);
}

#[test]
fn a_computing_slow_sample_gets_no_replacement_when_every_core_has_a_worker() {
    let cores = cpu::available_cores();
    let (mut engine, _) = start_samples(
        cores,
        64,
        SampleTimeout::Fixed(Duration::from_millis(20)),
        4,
    );
    engine.submit(vec![(0, SPIN + 400_000)]).unwrap();
    let (batch, most) = recv_watching_workers(&mut engine);
    assert_eq!(batch, vec![0]);
    assert_eq!(engine.slow_samples(), 1, "it is still flagged slow");
    assert_eq!(
        most, cores,
        "a replacement would only take a core from the others"
    );
    engine.shutdown(Duration::from_secs(10));
}

#[test]
fn a_computing_slow_sample_gets_a_replacement_while_cores_are_free() {
    let cores = cpu::available_cores();
    if cores < 2 {
        return; // no free core to give it
    }
    let (mut engine, _) = start_samples(1, 64, SampleTimeout::Fixed(Duration::from_millis(20)), 4);
    engine.submit(vec![(0, SPIN + 400_000)]).unwrap();
    let (batch, most) = recv_watching_workers(&mut engine);
    assert_eq!(batch, vec![0]);
    assert_eq!(most, 2);
    engine.shutdown(Duration::from_secs(10));
}

// ---- collation: off the consumer's thread, ahead of its asking ----

/// Tags each batch with the thread that collated it, and counts batches.
struct ThreadTagging {
    collated: Arc<AtomicUsize>,
    panic_on: Option<u64>,
    /// Collated on the workers (see `Collate::any_thread`).
    any_thread: bool,
    /// Each batch's collate sleeps this many microseconds less than the
    /// one before: later batches finish collating first.
    slower_first_us: Option<u64>,
}

impl Collate<u64> for ThreadTagging {
    type Batch = (thread::ThreadId, Vec<u64>);

    fn any_thread(&self) -> bool {
        self.any_thread
    }

    fn collate(&self, samples: Vec<u64>) -> Self::Batch {
        if self.panic_on.is_some_and(|value| samples.contains(&value)) {
            panic!("collate refused {samples:?}");
        }
        if let Some(step) = self.slower_first_us {
            let first = samples.iter().min().copied().unwrap_or(0);
            thread::sleep(Duration::from_micros(step * 64u64.saturating_sub(first)));
        }
        self.collated.fetch_add(1, AtomicOrdering::SeqCst);
        (thread::current().id(), samples)
    }
}

type Collating = SampleEngine<(u64, u64), u64, SampleHooks, ThreadTagging>;

fn start_collating(panic_on: Option<u64>) -> (Collating, Arc<AtomicUsize>) {
    let collate = ThreadTagging {
        collated: Arc::new(AtomicUsize::new(0)),
        panic_on,
        any_thread: false,
        slower_first_us: None,
    };
    start_collating_with(collate, 2, false)
}

/// An engine collating with `collate`, `num_workers` workers, batches in
/// the order submitted when `in_sequence`.
fn start_collating_with(
    collate: ThreadTagging,
    num_workers: usize,
    in_sequence: bool,
) -> (Collating, Arc<AtomicUsize>) {
    let collated = collate.collated.clone();
    let config = SampleEngineConfig {
        num_workers,
        max_samples_in_flight: 32,
        max_batch_size: 8,
        sample_timeout: SampleTimeout::Off,
        max_slow_in_flight: 0,
        shutdown_grace: Duration::from_secs(10),
        adaptive: None,
        drop_last: false,
        in_sequence,
    };
    let hooks = SampleHooks {
        inside: Arc::new(AtomicUsize::new(0)),
    };
    (
        Collating::start_collating(config, hooks, collate).unwrap(),
        collated,
    )
}

#[test]
fn batches_are_collated_off_the_consumers_thread_before_it_asks() {
    let (mut engine, collated) = start_collating(None);
    engine.submit((0..4).map(|v| (v, 0)).collect()).unwrap();
    engine.submit((4..8).map(|v| (v, 0)).collect()).unwrap();
    // Nobody asks: both batches are collated all the same, ready to take.
    assert!(eventually(|| collated.load(AtomicOrdering::SeqCst) == 2));
    assert_eq!(engine.pending(), 2);
    let mut values = Vec::new();
    for _ in 0..2 {
        let (thread, batch) = engine.recv(Duration::ZERO).unwrap();
        assert_ne!(thread, thread::current().id());
        values.extend(batch);
    }
    values.sort_unstable();
    assert_eq!(values, (0..8).collect::<Vec<_>>());
    assert_eq!(engine.recv(WAIT), Err(EngineError::Idle));
}

#[test]
fn batches_collated_on_the_workers_reach_the_consumer_in_order() {
    // Earlier batches take longer to collate: on four workers, later ones
    // are collated first, and wait for their turn.
    let collate = ThreadTagging {
        collated: Arc::new(AtomicUsize::new(0)),
        panic_on: None,
        any_thread: true,
        slower_first_us: Some(300),
    };
    let (mut engine, collated) = start_collating_with(collate, 4, true);
    let consumer = thread::current().id();
    let mut delivered = Vec::new();
    let mut threads = std::collections::HashSet::new();
    for epoch in 0..2 {
        if epoch > 0 {
            engine.new_epoch().unwrap();
        }
        let mut submitted = 0;
        let mut received = 0;
        while received < 16 {
            while submitted < 16 && engine.can_submit() {
                let first = 4 * submitted;
                engine
                    .submit((first..first + 4).map(|v| (v, 0)).collect())
                    .unwrap();
                submitted += 1;
            }
            let (thread, batch) = engine.recv(WAIT).unwrap();
            assert_ne!(thread, consumer);
            threads.insert(thread);
            delivered.push(batch);
            received += 1;
        }
    }
    let expected: Vec<Vec<u64>> = (0..2)
        .flat_map(|_| (0..16).map(|b| (4 * b..4 * b + 4).collect()))
        .collect();
    assert_eq!(delivered, expected);
    assert_eq!(collated.load(AtomicOrdering::SeqCst), 32);
    assert!(threads.len() > 1, "collated on {} thread", threads.len());
    assert_eq!(engine.recv(WAIT), Err(EngineError::Idle));
}

#[test]
fn the_assembly_thread_wakes_per_batch_not_per_finished_task() {
    // One sample a task (each takes longer than a run's target), so every
    // batch is eight tasks; the workers hand their samples in themselves.
    let (mut engine, _) = start_samples(2, 32, SampleTimeout::Off, 0);
    let batches = 8;
    let delivered = run_batches(&mut engine, &vec![8; batches], &[1_000]);
    assert_eq!(delivered.len(), batches);
    let mut values: Vec<u64> = delivered.into_iter().flatten().collect();
    values.sort_unstable();
    assert_eq!(values, (0..64).collect::<Vec<_>>());
    // A pass per batch completed, per submission that found samples
    // waiting, and one for the epoch's close, at most; wake-ups that come
    // together are taken in one pass, so a busy machine only lowers it.
    let passes = engine.assembly_passes();
    assert!(passes <= 2 * batches + 1, "{passes} passes for 64 tasks");
}

#[test]
fn shutdown_waits_for_a_worker_handing_in_its_last_task() {
    // The worker ends its task while shutdown waits for it, and hands the
    // task in under the engine's lock: shutdown must not hold that lock.
    let (mut engine, _) = start_samples(1, 32, SampleTimeout::Off, 0);
    engine.submit(vec![(0, 0)]).unwrap();
    engine.submit(vec![(1, 300_000)]).unwrap();
    // The worker takes the long task as it hands in the first.
    assert_eq!(engine.recv(WAIT).unwrap(), vec![0]);
    assert_eq!(engine.shutdown(Duration::from_secs(30)), 0);
}

#[test]
fn a_new_epoch_drops_the_old_epochs_collated_batches() {
    let (mut engine, collated) = start_collating(None);
    engine.submit((0..4).map(|v| (v, 0)).collect()).unwrap();
    assert!(eventually(|| collated.load(AtomicOrdering::SeqCst) == 1));
    engine.new_epoch().unwrap();
    assert_eq!(engine.pending(), 0);
    assert_eq!(engine.recv(WAIT), Err(EngineError::Idle));
    engine.submit((10..14).map(|v| (v, 0)).collect()).unwrap();
    let (_, mut batch) = engine.recv(WAIT).unwrap();
    batch.sort_unstable();
    assert_eq!(batch, vec![10, 11, 12, 13]);
}

#[test]
fn a_panicking_collator_breaks_the_engine_with_its_message() {
    let (mut engine, _) = start_collating(Some(2));
    engine.submit((0..4).map(|v| (v, 0)).collect()).unwrap();
    match engine.recv(WAIT) {
        Err(EngineError::CollatorPanicked(message)) => {
            assert!(message.contains("collate refused"), "{message}")
        }
        other => panic!("unexpected {:?}", other.map(|(_, batch)| batch)),
    }
}

// ---- a run of samples is judged by the sample it is on ----

/// Sample hooks that report each sample of a run as it begins (as the
/// Python runner does); the sample of value 0 waits until `gate` opens.
struct ReportingHooks {
    gate: Arc<std::sync::atomic::AtomicBool>,
}

impl WorkerHooks for ReportingHooks {
    type Payload = Vec<(u64, u64)>;
    type Output = Vec<Sample<u64>>;
    type State = ();

    fn init(&self, _worker_id: usize) {}

    fn run(&self, state: &mut (), epoch: u64, run: Vec<(u64, u64)>) -> Outcome<Vec<Sample<u64>>> {
        self.run_timed(state, epoch, run, &TaskClock::default())
    }

    fn run_timed(
        &self,
        _state: &mut (),
        _epoch: u64,
        run: Vec<(u64, u64)>,
        clock: &TaskClock,
    ) -> Outcome<Vec<Sample<u64>>> {
        Outcome::Value(
            run.into_iter()
                .map(|(value, _)| {
                    clock.begin_sample();
                    while value == 0 && !self.gate.load(AtomicOrdering::SeqCst) {
                        thread::sleep(Duration::from_millis(1));
                    }
                    Sample::Loaded(value)
                })
                .collect(),
        )
    }
}

#[test]
fn a_run_is_late_by_the_sample_it_is_on_not_by_its_whole_bound() {
    // Runs of 8 samples (a costly task: a batch spread over the two
    // workers); a sample stuck past the timeout makes its run late at once,
    // not after the run's bound of 8 timeouts (1.6 s), and its batch moves
    // on without that run's samples.
    let timeout = Duration::from_millis(200);
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let config = SampleEngineConfig {
        num_workers: 2,
        max_samples_in_flight: 64,
        max_batch_size: 16,
        sample_timeout: SampleTimeout::Fixed(timeout),
        max_slow_in_flight: 0,
        shutdown_grace: Duration::from_secs(10),
        adaptive: None,
        drop_last: false,
        in_sequence: true,
    };
    let hooks = ReportingHooks { gate: gate.clone() };
    let mut engine = SampleEngine::<(u64, u64), u64, ReportingHooks>::start(config, hooks).unwrap();
    engine.set_run_target(Duration::from_secs(10));
    for first in [0u64, 16, 32] {
        engine
            .submit((first..first + 16).map(|v| (v, 0)).collect())
            .unwrap();
    }
    let opener = {
        let gate = gate.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(1_200));
            gate.store(true, AtomicOrdering::SeqCst);
        })
    };
    let first = engine.recv(WAIT).unwrap();
    let still_stuck = !gate.load(AtomicOrdering::SeqCst);
    assert!(still_stuck, "the first batch waited for its stuck sample");
    assert_eq!(first.len(), 16);
    assert!(!first.contains(&0), "{first:?}");
    gate.store(true, AtomicOrdering::SeqCst);
    opener.join().unwrap();
    let mut values: Vec<u64> = first;
    while let Ok(batch) = engine.recv(WAIT) {
        values.extend(batch);
        if values.len() == 48 {
            break;
        }
    }
    values.sort_unstable();
    assert_eq!(values, (0..48).collect::<Vec<_>>());
}

// ---- pauses: a wait to take the GIL is not slowness ----

/// [`SampleHooks`] whose every task first waits `wait` (standing for a wait
/// to take the GIL), reported to the task's clock as a pause when `report`.
struct WaitingHooks {
    samples: SampleHooks,
    wait: Duration,
    report: bool,
}

impl WorkerHooks for WaitingHooks {
    type Payload = Vec<(u64, u64)>;
    type Output = Vec<Sample<u64>>;
    type State = ();

    fn enter_thread(&self, worker_id: usize, body: &mut (dyn FnMut() + Send)) {
        self.samples.enter_thread(worker_id, body);
    }

    fn init(&self, worker_id: usize) {
        self.samples.init(worker_id);
    }

    fn run(&self, state: &mut (), epoch: u64, run: Vec<(u64, u64)>) -> Outcome<Vec<Sample<u64>>> {
        self.run_timed(state, epoch, run, &TaskClock::default())
    }

    fn run_timed(
        &self,
        state: &mut (),
        epoch: u64,
        run: Vec<(u64, u64)>,
        clock: &TaskClock,
    ) -> Outcome<Vec<Sample<u64>>> {
        let pause = self.report.then(|| clock.pause());
        thread::sleep(self.wait);
        drop(pause);
        self.samples.run(state, epoch, run)
    }
}

type WaitingSamples = SampleEngine<(u64, u64), u64, WaitingHooks>;

/// Two workers, up to four replacements for slow samples.
fn start_waiting(wait: Duration, report: bool, sample_timeout: SampleTimeout) -> WaitingSamples {
    let config = SampleEngineConfig {
        num_workers: 2,
        max_samples_in_flight: 16,
        max_batch_size: 8,
        sample_timeout,
        max_slow_in_flight: 4,
        shutdown_grace: Duration::from_secs(10),
        adaptive: None,
        drop_last: false,
        in_sequence: false,
    };
    let samples = SampleHooks {
        inside: Arc::new(AtomicUsize::new(0)),
    };
    let hooks = WaitingHooks {
        samples,
        wait,
        report,
    };
    WaitingSamples::start(config, hooks).unwrap()
}

/// The next batch, and the most worker threads seen while it loaded
/// (a replacement retires once the slow task is done, so the count after
/// would not show it).
fn recv_watching_workers<W>(engine: &mut SampleEngine<(u64, u64), u64, W>) -> (Vec<u64>, usize)
where
    W: WorkerHooks<Payload = Vec<(u64, u64)>, Output = Vec<Sample<u64>>>,
{
    let deadline = Instant::now() + WAIT;
    let mut most = engine.num_workers();
    loop {
        match engine.recv(Duration::from_millis(2)) {
            Ok(batch) => return (batch, most.max(engine.num_workers())),
            Err(EngineError::WaitElapsed) if Instant::now() < deadline => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
        most = most.max(engine.num_workers());
    }
}

/// 520 ms waiting then 30 ms working, against a 100 ms timeout (a slow task
/// gets its replacement after `REPLACE_AFTER_TIMEOUTS` of them).
const WAIT_FOR_GIL: Duration = Duration::from_millis(520);
const WORK_US: u64 = 30_000;
const TIMEOUT: Duration = Duration::from_millis(100);

#[test]
fn a_task_paused_past_the_timeout_is_not_slow_and_its_pause_is_not_fetch_time() {
    let mut engine = start_waiting(WAIT_FOR_GIL, true, SampleTimeout::Fixed(TIMEOUT));
    engine.submit(vec![(0, WORK_US)]).unwrap();
    let (batch, most_workers) = recv_watching_workers(&mut engine);
    assert_eq!(batch, [0]);
    assert_eq!(most_workers, 2, "a replacement was started");
    assert_eq!(engine.slow_samples(), 0);
    let stats = engine.stats();
    // The sample's time is its work (plus scheduling noise), not the wait.
    let fetch = stats.fetch_p50.unwrap();
    assert!(
        fetch >= Duration::from_micros(WORK_US) && fetch < Duration::from_millis(200),
        "{fetch:?}"
    );
    // Busy time is wall time: the wait is in it.
    assert!(stats.busy >= WAIT_FOR_GIL, "{:?}", stats.busy);
}

#[test]
fn the_same_wait_not_reported_as_a_pause_is_slow() {
    let mut engine = start_waiting(WAIT_FOR_GIL, false, SampleTimeout::Fixed(TIMEOUT));
    engine.submit(vec![(0, WORK_US)]).unwrap();
    let (batch, most_workers) = recv_watching_workers(&mut engine);
    assert_eq!(batch, [0]);
    assert_eq!(most_workers, 3, "no replacement was started");
    assert_eq!(engine.slow_samples(), 1);
    let fetch = engine.stats().fetch_p50.unwrap();
    assert!(fetch >= WAIT_FOR_GIL, "{fetch:?}");
}

#[test]
fn pauses_do_not_raise_the_automatic_timeout() {
    // Each sample waits 60 ms and works 5 ms: the timeout follows the work.
    let wait = Duration::from_millis(60);
    let mut engine = start_waiting(wait, true, SampleTimeout::Auto { warmup: 4 });
    for value in 0..8 {
        engine.submit(vec![(value, 5_000)]).unwrap();
    }
    engine.close_epoch();
    for _ in 0..8 {
        assert_eq!(engine.recv(WAIT).unwrap().len(), 1);
    }
    let timeout = engine.sample_timeout().unwrap();
    assert!(timeout < Duration::from_millis(40), "{timeout:?}");
}

#[test]
fn cheap_samples_go_to_workers_in_runs() {
    let (mut engine, _) = start_samples(1, 4096, SampleTimeout::Off, 1);
    let sizes = vec![8; 300];
    let batches = run_batches(&mut engine, &sizes, &[0]);
    assert_eq!(batches.len(), 300);
    assert!(
        engine.run_length() > 1,
        "instant samples still went one per task"
    );
}

#[test]
fn long_waits_to_enter_send_samples_in_runs() {
    // Samples of 2 ms whose tasks each wait 2 ms to enter, a pause (a GIL
    // handed around many threads): a task per sample would pay it per
    // sample; runs pay it once per run.
    let mut engine = start_waiting(Duration::from_millis(2), true, SampleTimeout::Off);
    for batch in 0..6u64 {
        engine
            .submit((0..8).map(|i| (batch * 8 + i, 2_000)).collect())
            .unwrap();
        assert_eq!(engine.recv(WAIT).unwrap().len(), 8);
    }
    assert!(
        engine.run_length() > 1,
        "2 ms samples waiting 2 ms each went one per task"
    );
    // Without waits the same samples go one per task.
    let mut engine = start_waiting(Duration::ZERO, true, SampleTimeout::Off);
    for batch in 0..6u64 {
        engine
            .submit((0..8).map(|i| (batch * 8 + i, 2_000)).collect())
            .unwrap();
        assert_eq!(engine.recv(WAIT).unwrap().len(), 8);
    }
    assert_eq!(engine.run_length(), 1);
}

#[test]
fn many_workers_get_samples_in_runs_that_few_would_get_one_by_one() {
    // 1 ms samples: past the run target, one per task for two workers; 32
    // workers would be given 32,000 tasks a second, and get runs.
    let (mut few, _) = start_samples(2, 4096, SampleTimeout::Off, 1);
    run_batches(&mut few, &[8; 8], &[1_000]);
    assert_eq!(few.run_length(), 1);
    let (mut many, _) = start_samples(32, 4096, SampleTimeout::Off, 1);
    run_batches(&mut many, &[8; 16], &[1_000]);
    assert!(
        many.run_length() > 1,
        "32 workers got 1 ms samples one by one"
    );
}

#[test]
fn a_longer_run_target_sends_costlier_samples_in_runs() {
    let (mut engine, _) = start_samples(1, 4096, SampleTimeout::Off, 1);
    // Samples of 2 ms: past the default target, one per task.
    run_batches(&mut engine, &[8; 8], &[2_000]);
    assert_eq!(engine.run_length(), 1);
    // Worker processes' tasks cost a round trip: a 100 ms target groups them.
    engine.set_run_target(Duration::from_millis(100));
    assert!(
        engine.run_length() > 4,
        "run length {} for 2 ms samples and a 100 ms target",
        engine.run_length()
    );
    engine.shutdown(Duration::from_secs(10));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Whatever the durations, timeout and worker counts: the batches have the
    /// planned sizes, every sample is delivered exactly once, the in-flight
    /// bound holds, and no worker (replacements included) outlives the engine.
    #[test]
    fn sample_batches_exactly_once_with_planned_sizes(
        sleeps in prop::collection::vec(prop::sample::select(vec![0u64, 0, 200, 3_000, 20_000]), 1..30),
        sizes in prop::collection::vec(1usize..9, 0..12),
        workers in 1usize..5,
        batches_in_flight in 1usize..4,
        timeout_us in prop::option::of(prop::sample::select(vec![100u64, 1_000, 5_000])),
        max_slow in 0usize..4,
        in_sequence in any::<bool>(),
    ) {
        let bound = batches_in_flight * 8;
        let timeout = timeout_us.map_or(SampleTimeout::Off, |us| SampleTimeout::Fixed(Duration::from_micros(us)));
        let (mut engine, inside) = start_samples_with(workers, bound, timeout, max_slow, in_sequence);
        let batches = run_batches(&mut engine, &sizes, &sleeps);
        prop_assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), sizes.clone());
        if in_sequence && timeout_us.is_none() {
            // Nothing is ever late: the batches are the submitted ones.
            let flat: Vec<u64> = batches.iter().flatten().copied().collect();
            prop_assert_eq!(flat, (0..sizes.iter().sum::<usize>() as u64).collect::<Vec<_>>());
        }
        let mut values: Vec<u64> = batches.into_iter().flatten().collect();
        values.sort_unstable();
        prop_assert_eq!(values, (0..sizes.iter().sum::<usize>() as u64).collect::<Vec<_>>());
        prop_assert!(engine.num_workers() <= workers + max_slow);
        drop(engine);
        prop_assert_eq!(inside.load(AtomicOrdering::SeqCst), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Skipped samples, wherever they fall: every loaded sample is delivered
    /// and every skipped one handed over, exactly once (bar the samples of a
    /// last batch dropped short under drop_last), and the batches keep the
    /// planned sizes except at the epoch's end.
    #[test]
    fn skipped_samples_are_made_up_by_later_ones(
        pattern in prop::collection::vec(prop::sample::select(vec![0u64, 0, 0, 300, SKIP]), 1..20),
        sizes in prop::collection::vec(1usize..9, 0..12),
        workers in 1usize..4,
        batches_in_flight in 1usize..4,
        drop_last in any::<bool>(),
        in_sequence in any::<bool>(),
    ) {
        let inside = Arc::new(AtomicUsize::new(0));
        let config = SampleEngineConfig {
            num_workers: workers,
            max_samples_in_flight: batches_in_flight * 8,
            max_batch_size: 8,
            sample_timeout: SampleTimeout::Off,
            max_slow_in_flight: 0,
            shutdown_grace: Duration::from_secs(10),
            adaptive: None,
            drop_last,
            in_sequence,
        };
        let mut engine = Samples::start(config, SampleHooks { inside: inside.clone() }).unwrap();
        let (batches, mut skipped) = run_batches_skipping(&mut engine, &sizes, &pattern);
        let total = sizes.iter().sum::<usize>() as u64;
        let expected_skipped: Vec<u64> =
            (0..total).filter(|v| pattern[*v as usize % pattern.len()] == SKIP).collect();
        skipped.sort_unstable();
        prop_assert_eq!(
            batches.iter().map(Vec::len).collect::<Vec<_>>(),
            sizes_after_skipping(&sizes, skipped.len(), drop_last)
        );
        let mut values: Vec<u64> = batches.into_iter().flatten().collect();
        values.sort_unstable();
        let loaded: Vec<u64> = (0..total).filter(|v| !expected_skipped.contains(v)).collect();
        if drop_last {
            // The samples of a batch dropped short are not waited for: they
            // are neither delivered nor, when they fail, reported.
            prop_assert!(values.iter().all(|v| loaded.contains(v)));
            prop_assert!(skipped.iter().all(|v| expected_skipped.contains(v)));
            prop_assert!(values.windows(2).all(|pair| pair[0] < pair[1]));
            prop_assert!(skipped.windows(2).all(|pair| pair[0] < pair[1]));
            prop_assert!(total as usize - values.len() - skipped.len() < 8);
        } else {
            prop_assert_eq!(&skipped, &expected_skipped);
            prop_assert_eq!(values, loaded);
        }
        drop(engine);
        prop_assert_eq!(inside.load(AtomicOrdering::SeqCst), 0);
    }
}

#[test]
fn a_short_batch_filled_past_the_bound_never_finds_the_queues_full() {
    // Found by the property above: sizes [2, 1, 4, 8] at a bound of 8 with
    // every third sample skipped; the last batch went in while the one
    // before was short, and its tasks overflowed queues sized to the bound.
    for _ in 0..20 {
        let (mut engine, _) = start_samples_with(1, 8, SampleTimeout::Off, 0, false);
        let (batches, skipped) =
            run_batches_skipping(&mut engine, &[2, 1, 4, 8], &[300, SKIP, 300]);
        assert_eq!(
            batches.iter().map(Vec::len).sum::<usize>() + skipped.len(),
            15
        );
    }
}

// ---- adaptive worker count ----

/// Waits (bounded) until `check` holds.
fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn an_adaptive_engine_grows_on_scaling_work_and_delivers_everything_once() {
    let mut cfg = config(1, 2, Order::Completion, Dispatch::Shared);
    cfg.adaptive = Some(ControllerConfig::new(1, 6));
    let (mut engine, inside) = start(cfg);
    // Sleeping tasks scale with threads, and the consumer never waits for them.
    let jobs: Vec<Job> = (0..600).map(|value| value_after(value, 2_000)).collect();
    let mut values: Vec<u64> = run_all(&mut engine, &jobs)
        .into_iter()
        .map(|r| r.unwrap().1)
        .collect();
    values.sort_unstable();
    assert_eq!(values, (0..600).collect::<Vec<_>>());
    let stats = engine.stats();
    assert!(
        stats.worker_history.iter().any(|&(_, n)| n > 1),
        "{:?}",
        stats.worker_history
    );
    assert!(stats
        .worker_history
        .iter()
        .all(|&(_, n)| (1..=6).contains(&n)));
    assert_eq!(stats.samples_loaded, 600);
    assert!(stats.occupancy.is_some());
    // What its controller stands by is a count the pool had.
    let settled = stats
        .settled_workers
        .expect("the controller judged windows");
    assert!(
        stats.worker_history.iter().any(|&(_, n)| n == settled),
        "{settled} {:?}",
        stats.worker_history
    );
    engine.shutdown(WAIT);
    assert_eq!(inside.load(AtomicOrdering::SeqCst), 0);
}

/// An adaptive pool starting at `workers` (1 to 16) whose first task takes
/// `first`, then 1 ms tasks taken as they come: the consumer starves and
/// the pool grows a step a judged window. Returns its first `resizes`.
fn starved_pool_resizes(workers: usize, first: Duration, resizes: usize) -> Vec<Resize> {
    let mut cfg = config(workers, 16, Order::Completion, Dispatch::Shared);
    cfg.adaptive = Some(ControllerConfig::new(1, 16));
    let (mut engine, _) = start(cfg);
    engine
        .submit(value_after(0, first.as_micros() as u64))
        .unwrap();
    let mut value = 1;
    while engine.stats().resizes.len() < resizes {
        while engine.can_submit() {
            engine.submit(value_after(value, 1_000)).unwrap();
            value += 1;
        }
        engine.recv(WAIT).unwrap();
    }
    let stats = engine.stats();
    engine.shutdown(WAIT);
    stats.resizes
}

#[test]
fn an_adaptive_pool_judges_no_window_before_the_tasks_running_at_its_start_end() {
    // The first task is long, the rest short: a window of a few short tasks
    // would measure workers that have not yet met a long one.
    let long = Duration::from_millis(400);
    let first = starved_pool_resizes(4, long, 1)[0];
    assert!(first.at >= long, "{first:?}");
}

#[test]
fn a_task_that_ran_a_whole_window_before_one_started_does_not_lengthen_it() {
    // A sample that hangs (no sample timeout flags it): the first window
    // waits for it, up to the longest a window lasts; later ones do not,
    // and the pool grows 2 -> 4 -> 8 -> 16.
    let resizes = starved_pool_resizes(2, Duration::from_secs(3), 3);
    // With every window waiting for the hung task, the third came at 3 s.
    assert!(resizes[2].at < Duration::from_secs(2), "{resizes:?}");
}

/// Test hooks whose workers but the first take `start` to set up (a worker
/// thread copying its dataset, a worker process starting).
/// Tasks run as [`Hooks`] runs them.
struct SlowStart {
    start: Duration,
    hooks: Hooks,
}

impl WorkerHooks for SlowStart {
    type Payload = Job;
    type Output = (usize, u64);
    type State = usize;

    fn init(&self, worker_id: usize) -> usize {
        if worker_id > 0 {
            thread::sleep(self.start);
        }
        self.hooks.init(worker_id)
    }

    fn run(&self, worker: &mut usize, epoch: u64, job: Job) -> Outcome<(usize, u64)> {
        self.hooks.run(worker, epoch, job)
    }
}

#[test]
fn an_adaptive_pool_is_not_judged_while_its_first_workers_start() {
    // One worker runs while the other three start: the consumer waits for
    // every batch then, which must not read as a pool too small.
    let start = Duration::from_millis(400);
    let mut cfg = config(4, 8, Order::Completion, Dispatch::Shared);
    cfg.adaptive = Some(ControllerConfig::new(1, 16));
    let hooks = Hooks {
        inside: Arc::default(),
    };
    let mut engine = Engine::start(cfg, SlowStart { start, hooks }).expect("threads start");
    let began = Instant::now();
    let mut received = 0;
    let mut value = 0;
    while began.elapsed() < start / 2 {
        while engine.can_submit() {
            engine.submit(value_after(value, 200)).unwrap();
            value += 1;
        }
        engine.recv(WAIT).unwrap();
        received += 1;
    }
    assert!(
        received > 20,
        "the first worker ran tasks meanwhile: {received}"
    );
    let history = pool_sizes(&engine.stats());
    assert_eq!(history, [4]);
    engine.shutdown(WAIT);
}

/// The pool sizes of an adaptive engine (1 to 6 workers) that ran the
/// scaling work that makes such a pool grow (test above), after `resized`,
/// and the count its controller stood by at the end.
fn sizes_after_scaling_work(resized: impl FnOnce(&Engine<Hooks>)) -> (Vec<usize>, Option<usize>) {
    let mut cfg = config(1, 2, Order::Completion, Dispatch::Shared);
    cfg.adaptive = Some(ControllerConfig::new(1, 6));
    let (mut engine, inside) = start(cfg);
    resized(&engine);
    let jobs: Vec<Job> = (0..600).map(|value| value_after(value, 2_000)).collect();
    let mut values: Vec<u64> = run_all(&mut engine, &jobs)
        .into_iter()
        .map(|r| r.unwrap().1)
        .collect();
    values.sort_unstable();
    assert_eq!(values, (0..600).collect::<Vec<_>>());
    let stats = engine.stats();
    engine.shutdown(WAIT);
    assert_eq!(inside.load(AtomicOrdering::SeqCst), 0);
    (pool_sizes(&stats), stats.settled_workers)
}

#[test]
fn each_worker_threads_first_task_is_counted_apart() {
    let (mut engine, _) = start(config(3, 6, Order::Completion, Dispatch::Shared));
    let jobs: Vec<Job> = (0..60).map(|value| value_after(value, 200)).collect();
    let workers_that_ran: BTreeSet<usize> = run_all(&mut engine, &jobs)
        .into_iter()
        .map(|out| out.unwrap().0)
        .collect();
    let stats = engine.stats();
    // One task of one sample each, for every worker that ran one.
    assert_eq!(stats.first_task_samples, workers_that_ran.len() as u64);
    assert!(stats.first_task_cpu <= stats.cpu);
    engine.shutdown(WAIT);
}

#[test]
fn a_fixed_pool_is_no_longer_resized_by_the_controller() {
    let (history, settled) = sizes_after_scaling_work(|engine| engine.fix_workers(2));
    assert_eq!(history, [1, 2]);
    // Its controller sizes it no more: no count to stand by.
    assert_eq!(settled, None);
}

#[test]
fn a_pool_fixed_then_released_is_resized_by_the_controller_again() {
    // Fixed as auto decided on processes, released as it kept threads after
    // all: the pool grows past the fixed size.
    let (history, _) = sizes_after_scaling_work(|engine| {
        engine.fix_workers(1);
        engine.adapt_workers();
    });
    assert!(history.iter().any(|&size| size > 1), "{history:?}");
}

#[test]
fn a_round_robin_engine_keeps_its_size() {
    let mut cfg = config(2, 4, Order::Submission, Dispatch::RoundRobin);
    cfg.adaptive = Some(ControllerConfig::new(1, 8));
    let (mut engine, _) = start(cfg);
    let jobs: Vec<Job> = (0..200).map(|value| value_after(value, 1_000)).collect();
    assert_eq!(run_all(&mut engine, &jobs).len(), 200);
    assert_eq!(engine.stats().worker_history.len(), 1);
    assert_eq!(engine.num_workers(), 2);
}

#[test]
fn a_shrunk_pool_lets_idle_workers_go_and_a_grown_one_starts_them() {
    let (mut engine, inside) = start(config(4, 8, Order::Completion, Dispatch::Shared));
    let pool = engine.workers_for_tests().pool_for_tests();
    pool.set_target(1);
    assert!(eventually(|| engine.num_workers() == 1));
    assert!(eventually(|| inside.load(AtomicOrdering::SeqCst) == 1));
    pool.set_target(3);
    assert_eq!(engine.num_workers(), 3);
    let jobs = instant_values(0..30);
    assert_eq!(run_all(&mut engine, &jobs).len(), 30);
    let history = pool_sizes(&engine.stats());
    assert_eq!(history, [4, 1, 3]);
    engine.shutdown(WAIT);
    assert_eq!(inside.load(AtomicOrdering::SeqCst), 0);
}

#[test]
fn fetch_percentiles_and_busy_time_are_reported() {
    let (mut engine, _) = start(config(2, 4, Order::Submission, Dispatch::Shared));
    let jobs: Vec<Job> = (0..20).map(|value| value_after(value, 500)).collect();
    run_all(&mut engine, &jobs);
    let stats = engine.stats();
    let (p50, p90, p99) = (
        stats.fetch_p50.unwrap(),
        stats.fetch_p90.unwrap(),
        stats.fetch_p99.unwrap(),
    );
    assert!(p50 <= p90 && p90 <= p99);
    assert!(p50 >= Duration::from_micros(500));
    assert!(stats.busy >= Duration::from_micros(500) * 20);
    assert_eq!(stats.samples_loaded, 20);
}

#[test]
fn a_pool_that_keeps_resizing_joins_the_threads_that_retired() {
    let (mut engine, inside) = start(config(2, 8, Order::Completion, Dispatch::Shared));
    let pool = engine.workers_for_tests().pool_for_tests().clone();
    for _ in 0..20 {
        pool.set_target(6);
        assert_eq!(pool.live_workers(), 6);
        pool.set_target(1);
        // Idle surplus workers leave within an idle check.
        assert!(eventually(|| inside.load(AtomicOrdering::SeqCst) == 1));
    }
    pool.set_target(2);
    // 20 x 5 threads retired; only those still running (and the last few
    // to end since the latest start) are unjoined.
    assert!(pool.unjoined_threads() <= 7, "{}", pool.unjoined_threads());
    let jobs = instant_values(0..16);
    let values: BTreeSet<u64> = run_all(&mut engine, &jobs)
        .into_iter()
        .map(|out| out.unwrap().1)
        .collect();
    assert_eq!(values, (0..16).collect());
}

#[test]
fn a_thread_that_cannot_be_started_leaves_the_pool_working() {
    let (mut engine, _inside) = start(config(2, 8, Order::Completion, Dispatch::Shared));
    let pool = engine.workers_for_tests().pool_for_tests().clone();
    pool.shared.fail_spawns.store(true, AtomicOrdering::SeqCst);
    // Growing while no thread can be started (a resource limit) returns,
    // with the pool as it was: no deadlock on the pool's own lock.
    let (tx, rx) = crossbeam_channel::bounded(1);
    let grower = pool.clone();
    thread::spawn(move || {
        grower.set_target(5);
        tx.send(grower.live_workers()).unwrap();
    });
    assert_eq!(rx.recv_timeout(WAIT), Ok(2));
    pool.shared.fail_spawns.store(false, AtomicOrdering::SeqCst);
    pool.set_target(5);
    assert_eq!(pool.live_workers(), 5);
    // The engine was sized for 2 workers (its queues hold 8 tasks): submit
    // within that, since this test grows the pool by hand.
    for value in 0..8 {
        engine.submit(value_after(value, 100)).unwrap();
    }
    let values: BTreeSet<u64> = (0..8).map(|_| engine.recv(WAIT).unwrap().1).collect();
    assert_eq!(values, (0..8).collect());
}

#[test]
fn a_new_epoch_does_not_wait_for_a_stuck_task() {
    let (mut engine, _inside) = start(config(2, 4, Order::Completion, Dispatch::Shared));
    let stuck = value_after(0, 3_000_000);
    engine.submit(stuck).unwrap();
    engine.submit(value_after(1, 0)).unwrap();
    assert_eq!(engine.recv(WAIT).unwrap().1, 1);
    let started = Instant::now();
    engine.new_epoch().unwrap();
    // The next epoch is served beside the stuck task, by a replacement.
    let jobs = instant_values(10..30);
    let values: BTreeSet<u64> = run_all(&mut engine, &jobs)
        .into_iter()
        .map(|out| out.unwrap().1)
        .collect();
    assert_eq!(values, (10..30).collect());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "waited for the stuck task"
    );
    assert_eq!(engine.num_workers(), 3);
    // Once its task is done, the stuck worker leaves; its result is dropped.
    assert!(eventually(|| engine.num_workers() == 2));
    let jobs = instant_values(40..44);
    assert_eq!(run_all(&mut engine, &jobs).len(), 4);
}

// ---- the consumer's signals ----

#[test]
fn a_long_wait_counts_as_one_request_in_the_occupancy_signal() {
    let (mut engine, _) = start(config(2, 4, Order::Submission, Dispatch::Shared));
    engine.submit(value_after(0, 100_000)).unwrap();
    engine.submit(value_after(1, 0)).unwrap();
    // The request for the first output finds nothing ready (0 of 4), and
    // is made again after each short wait runs out, as the bindings do
    // while they look for signals.
    assert_eq!(
        engine.recv(Duration::from_millis(1)),
        Err(EngineError::WaitElapsed)
    );
    let mut again = engine.recv_again(Duration::from_millis(1));
    while again == Err(EngineError::WaitElapsed) {
        again = engine.recv_again(Duration::from_millis(1));
    }
    assert_eq!(again.unwrap().1, 0);
    // The second output has long been ready: its request finds 1 of 4.
    thread::sleep(Duration::from_millis(50));
    assert_eq!(engine.recv(WAIT).unwrap().1, 1);
    let occupancy = engine.stats().occupancy.unwrap();
    assert!(
        (occupancy - 0.125).abs() < 1e-9,
        "two requests, (0 + 1/4) / 2: {occupancy}"
    );
}

#[test]
fn the_consumers_steps_are_measured_between_receipt_and_request() {
    let (mut engine, _) = start(config(1, 4, Order::Submission, Dispatch::Shared));
    for value in 0..3 {
        engine.submit(value_after(value, 0)).unwrap();
    }
    engine.recv(WAIT).unwrap();
    assert_eq!(engine.stats().loop_step, None, "no step yet");
    thread::sleep(Duration::from_millis(30)); // the training step
    engine.recv(WAIT).unwrap();
    let step = engine.stats().loop_step.unwrap();
    assert!(step >= Duration::from_millis(30), "{step:?}");
}

/// The batches `withdraw_unstarted` gives back, as their values.
fn take_back(engine: &mut Samples) -> Vec<Vec<u64>> {
    engine
        .withdraw_unstarted()
        .unwrap()
        .into_iter()
        .map(|batch| batch.into_iter().map(|(value, _)| value).collect())
        .collect()
}

/// Every batch the engine still delivers, until it has none pending.
fn deliver_the_rest(engine: &mut Samples) -> Vec<Vec<u64>> {
    let mut delivered = Vec::new();
    loop {
        match engine.recv(WAIT) {
            Ok(batch) => delivered.push(batch),
            Err(EngineError::Idle) => return delivered,
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Batches taken back from a sample engine whenever it is asked, with
    /// any samples running: the batches it still delivers, then the ones it
    /// gave back, are exactly the batches submitted, in order, each whole;
    /// nothing else is delivered, and the engine goes on to a next epoch.
    #[test]
    fn batches_taken_back_and_delivered_are_those_submitted_in_order(
        pattern in prop::collection::vec(prop::sample::select(vec![0u64, 0, 200, 2000]), 1..10),
        sizes in prop::collection::vec(1usize..9, 1..10),
        workers in 1usize..4,
        received_first in 0usize..4,
    ) {
        let (mut engine, inside) = start_samples_with(workers, 64, SampleTimeout::Off, 0, true);
        let mut submitted = Vec::new();
        let mut next_value = 0u64;
        for &size in &sizes {
            let batch: Vec<u64> = (next_value..next_value + size as u64).collect();
            next_value += size as u64;
            engine
                .submit(batch.iter().map(|&v| (v, pattern[v as usize % pattern.len()])).collect())
                .unwrap();
            submitted.push(batch);
        }
        let mut delivered = Vec::new();
        for _ in 0..received_first.min(sizes.len()) {
            delivered.push(engine.recv(WAIT).unwrap());
        }
        let withdrawn = take_back(&mut engine);
        delivered.extend(deliver_the_rest(&mut engine));
        prop_assert_eq!(engine.pending(), 0);
        let together: Vec<Vec<u64>> = delivered.into_iter().chain(withdrawn).collect();
        prop_assert_eq!(together, submitted);
        engine.new_epoch().unwrap();
        engine.submit(vec![(100, 0), (101, 0)]).unwrap();
        prop_assert_eq!(engine.recv(WAIT).unwrap(), vec![100, 101]);
        drop(engine);
        prop_assert_eq!(inside.load(AtomicOrdering::SeqCst), 0);
    }
}

/// Batches behind one a worker is stuck on are taken back whole.
#[test]
fn batches_no_worker_started_are_taken_back() {
    let (mut engine, _) = start_samples_with(1, 64, SampleTimeout::Off, 1, true);
    // The one worker sleeps on the first batch's sample while three more wait.
    engine.submit(vec![(0, 300_000)]).unwrap();
    for first in [1u64, 3, 5] {
        engine.submit(vec![(first, 0), (first + 1, 0)]).unwrap();
    }
    let withdrawn = take_back(&mut engine);
    let behind = vec![vec![1, 2], vec![3, 4], vec![5, 6]];
    assert!(withdrawn.ends_with(&behind), "{withdrawn:?}");
    // The first batch is taken back too where the worker had not started it.
    let delivered = deliver_the_rest(&mut engine);
    let together: Vec<Vec<u64>> = delivered.into_iter().chain(withdrawn).collect();
    assert_eq!(together, vec![vec![0], vec![1, 2], vec![3, 4], vec![5, 6]]);
}
