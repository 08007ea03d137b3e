//! Engine behaviour: delivery order, exactly-once, epochs, shutdown.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

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
    let jobs: Vec<Job> = (0..40)
        .map(|i| Job::Value {
            value: i,
            sleep_us: (40 - i) * 100,
        })
        .collect();
    let values: Vec<u64> = run_all(&mut engine, &jobs)
        .into_iter()
        .map(|r| r.unwrap().1)
        .collect();
    assert_eq!(values, (0..40).collect::<Vec<_>>());
}

#[test]
fn completion_order_lets_fast_tasks_pass_a_slow_one() {
    let (mut engine, _) = start(config(2, 4, Order::Completion, Dispatch::Shared));
    engine
        .submit(Job::Value {
            value: 0,
            sleep_us: 300_000,
        })
        .unwrap();
    engine
        .submit(Job::Value {
            value: 1,
            sleep_us: 0,
        })
        .unwrap();
    assert_eq!(engine.recv(WAIT).unwrap().1, 1);
    assert_eq!(engine.recv(WAIT).unwrap().1, 0);
    assert_eq!(engine.recv(WAIT), Err(EngineError::Idle));
}

#[test]
fn submit_refuses_past_the_in_flight_bound() {
    let (mut engine, _) = start(config(1, 2, Order::Submission, Dispatch::Shared));
    engine
        .submit(Job::Value {
            value: 0,
            sleep_us: 0,
        })
        .unwrap();
    engine
        .submit(Job::Value {
            value: 1,
            sleep_us: 0,
        })
        .unwrap();
    assert!(!engine.can_submit());
    assert_eq!(
        engine.submit(Job::Value {
            value: 2,
            sleep_us: 0
        }),
        Err(EngineError::Full)
    );
    engine.recv(WAIT).unwrap();
    assert!(engine.can_submit());
}

#[test]
fn recv_reports_an_elapsed_wait_and_the_result_still_arrives() {
    let (mut engine, _) = start(config(1, 1, Order::Submission, Dispatch::Shared));
    engine
        .submit(Job::Value {
            value: 7,
            sleep_us: 200_000,
        })
        .unwrap();
    assert_eq!(
        engine.recv(Duration::from_millis(1)),
        Err(EngineError::WaitElapsed)
    );
    assert_eq!(engine.recv(WAIT).unwrap().1, 7);
}

#[test]
fn round_robin_gives_task_i_to_worker_i_mod_n_and_drops_exhausted_workers() {
    let (mut engine, _) = start(config(3, 6, Order::Submission, Dispatch::RoundRobin));
    for i in 0..3 {
        engine
            .submit(Job::Value {
                value: i,
                sleep_us: 0,
            })
            .unwrap();
    }
    let workers: Vec<usize> = (0..3).map(|_| engine.recv(WAIT).unwrap().0).collect();
    assert_eq!(workers, vec![0, 1, 2]);
    // Worker 0 reports exhaustion: it delivers nothing and gets no more tasks.
    engine.submit(Job::Exhaust).unwrap();
    engine
        .submit(Job::Value {
            value: 4,
            sleep_us: 0,
        })
        .unwrap();
    assert_eq!(engine.recv(WAIT).unwrap(), (1, 4));
    engine
        .submit(Job::Value {
            value: 5,
            sleep_us: 0,
        })
        .unwrap();
    engine
        .submit(Job::Value {
            value: 6,
            sleep_us: 0,
        })
        .unwrap();
    assert_eq!(engine.recv(WAIT).unwrap(), (2, 5));
    assert_eq!(engine.recv(WAIT).unwrap(), (1, 6));
}

#[test]
fn a_panicking_task_is_reported_in_its_place_and_the_worker_survives() {
    let (mut engine, inside) = start(config(1, 4, Order::Submission, Dispatch::Shared));
    engine
        .submit(Job::Value {
            value: 0,
            sleep_us: 0,
        })
        .unwrap();
    engine.submit(Job::Panic).unwrap();
    engine
        .submit(Job::Value {
            value: 2,
            sleep_us: 0,
        })
        .unwrap();
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
        engine
            .submit(Job::Value {
                value: i,
                sleep_us: 20_000,
            })
            .unwrap();
    }
    engine.recv(WAIT).unwrap();
    engine.new_epoch().unwrap();
    assert_eq!(engine.pending(), 0);
    assert_eq!(engine.recv(WAIT), Err(EngineError::Idle));
    engine
        .submit(Job::Value {
            value: 100,
            sleep_us: 0,
        })
        .unwrap();
    assert_eq!(engine.recv(WAIT).unwrap(), (0, 100));
}

#[test]
fn shutdown_joins_every_worker_and_refuses_more_work() {
    let (mut engine, inside) = start(config(4, 8, Order::Submission, Dispatch::Shared));
    assert_eq!(engine.num_workers(), 4);
    for i in 0..8 {
        engine
            .submit(Job::Value {
                value: i,
                sleep_us: 1_000,
            })
            .unwrap();
    }
    assert_eq!(engine.shutdown(Duration::from_secs(10)), 0);
    assert_eq!(inside.load(AtomicOrdering::SeqCst), 0);
    assert_eq!(engine.submit(Job::Exhaust), Err(EngineError::ShutDown));
    assert_eq!(engine.recv(WAIT), Err(EngineError::ShutDown));
}

#[test]
fn shutdown_leaves_a_stuck_worker_after_the_grace_period() {
    let (mut engine, inside) = start(config(1, 1, Order::Submission, Dispatch::Shared));
    engine
        .submit(Job::Value {
            value: 0,
            sleep_us: 300_000,
        })
        .unwrap();
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
                engine.submit(Job::Value { value: next as u64, sleep_us: sleeps[next] }).unwrap();
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
