//! The adaptive worker-count controller: pure logic over measured windows,
//! so that it can be tested on synthetic signals.
//!
//! MinatoLoader (paper §4.3, Formula 1) grows the pool when the ready queue
//! runs empty and shrinks it when the queue stays full, in bounded steps.
//! Here growth is multiplicative while each step pays (the count doubles:
//! an I/O-bound pool reaches tens of workers in a few steps, not tens of
//! them; it quadruples after two steps that gained about what their workers
//! should, work scaling linearly), and after the first step that does not
//! pay, it refines in bounded steps. A quadrupling that falls short of
//! linear is not kept whole: the doubling within it is judged instead.
//! That alone cannot tell work that scales with threads (I/O, code that
//! releases the GIL) from work that does not (code that holds the GIL, or
//! cores already busy): more threads then only add contention. So every
//! growth step is a probe: the throughput of the window after it is compared
//! with the window before, and a step that did not raise samples/s by at
//! least 30% of what the added workers should give (judged on the mean of
//! two windows, so one noisy window is not enough) is taken back; the
//! count it reached becomes a ceiling for a while — briefly the first time
//! (one noisy step should not stall a ramp), twice as long after each
//! further failure in a row (work that does not scale is probed ever more
//! rarely), and briefly again once a step pays. A step that did not pay
//! is followed by one probe downwards, kept only if one worker fewer loses
//! nothing: work that holds the GIL often runs fastest on a single thread.
//! A saturated CPU (its moving average: one short window's reading is
//! noisy) stops growth outright, and so does a window in which nothing
//! finished. Workers that compute (on a CPU for most of their task
//! time, by their threads' own clocks, or together for most of the cores'
//! time) grow no further than the cores: more would share them, and the
//! window's noise could still read as a gain; until the consumer's first
//! step they leave its thread a core.
//!
//! A full ready queue shrinks the pool only down to the workers the
//! consumer's pace keeps busy (Little's law: the mean count on a task over
//! the window), with headroom: a queue that is full because the loop is
//! slow needs no more workers than it keeps busy, but the queue drains
//! only after many windows (its bound is the prefetch of the starting
//! count), so a shrink judged on its occupancy alone ran on past what the
//! loop needed and starved it (benchmarks/RESULTS.md).
//!
//! A worker also costs the training loop: threads share its GIL. The
//! consumer's step (its time between two requests for a batch) is measured
//! per window, and a growth step after which the loop's steps ran more than
//! `max_step_slowdown` slower than before does not pay, whatever it gained.

use super::cpu::available_cores;

/// What the engine measured over one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// Samples finished per second.
    pub throughput: f64,
    /// Mean ready-queue occupancy (0..=1) seen by the consumer when it asked
    /// for a batch: 0 means it always had to wait. None when it did not ask.
    pub occupancy: Option<f64>,
    /// The process's CPU use over recent time, as a fraction of all cores;
    /// None until known.
    pub cpu: Option<f64>,
    /// The share of the workers' task time they spent on a CPU (their own
    /// threads' clocks): high for work that computes, low for work that
    /// waits (I/O, sleeps, the GIL). None when no task finished.
    pub compute: Option<f64>,
    /// The consumer's mean step, in seconds: its time between receiving a
    /// batch and asking for the next. None when it took no step.
    pub step: Option<f64>,
    /// The consumer's mean wait, in seconds: its time between asking for a
    /// batch and receiving it. None when it received none.
    pub wait: Option<f64>,
    /// The mean number of workers on a task over the window (their task
    /// time over its length). None when not measured.
    pub busy_workers: Option<f64>,
}

impl Window {
    /// The mean of two windows' measurements (of one where only it has one).
    fn mean_with(self, other: Window) -> Window {
        fn mean(a: Option<f64>, b: Option<f64>) -> Option<f64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(0.5 * (a + b)),
                (a, b) => a.or(b),
            }
        }
        Window {
            throughput: 0.5 * (self.throughput + other.throughput),
            occupancy: other.occupancy,
            cpu: other.cpu,
            compute: other.compute.or(self.compute),
            step: mean(self.step, other.step),
            wait: mean(self.wait, other.wait),
            busy_workers: mean(self.busy_workers, other.busy_workers),
        }
    }
}

/// The controller's bounds and thresholds.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Fewest workers (at least 1).
    pub min_workers: usize,
    /// Most workers.
    pub max_workers: usize,
    /// Largest change per decision once refining (MinatoLoader's clip to
    /// ±2); until the first growth step that does not pay, the count doubles.
    pub max_step: usize,
    /// Occupancy below which the consumer is starving: grow.
    pub starving_below: f64,
    /// Occupancy above which data is well ahead of the consumer: shrink...
    pub ahead_above: f64,
    /// ...while the pool, one worker fewer, still has this many times the
    /// workers the consumer's pace keeps busy.
    pub shrink_headroom: f64,
    /// CPU use at or above which no worker is added.
    pub cpu_saturated: f64,
    /// Workers that spend this share of their task time on a CPU compute:
    /// the pool grows no further than `cores` (more would only share them).
    pub compute_bound: f64,
    /// Workers whose demand for CPU (their share of task time on one, times
    /// their count) is this share of the cores grow no further than the
    /// cores either: threads beyond the cores each get a CPU only part of
    /// their time (8 threads decoding on 2 cores, a quarter each).
    pub cores_bound: f64,
    /// The cores this process may run on.
    pub cores: usize,
    /// A growth step must raise throughput by this fraction of the ideal
    /// gain (linear in the worker count) to be kept.
    pub min_gain_share: f64,
    /// Two doublings in a row that raised throughput by this fraction of
    /// the ideal gain or more show work that scales linearly: the next step
    /// quadruples, and is kept only if it does as well.
    pub linear_gain_share: f64,
    /// Decisions during which a count found useless is not probed again,
    /// after a first failure; doubled after each further failure in a row...
    pub ceiling_windows: u32,
    /// ...up to this many.
    pub max_ceiling_windows: u32,
    /// A growth step after which the consumer's steps ran slower than this
    /// share above their time before it does not pay (the GIL it took from
    /// the training loop cost more than the data it added).
    pub max_step_slowdown: f64,
    /// ...and by at least this many seconds: a loop whose steps take
    /// microseconds (data alone) varies by more than 10% from noise.
    pub min_step_slowdown_s: f64,
}

impl ControllerConfig {
    pub fn new(min_workers: usize, max_workers: usize) -> Self {
        let min_workers = min_workers.max(1);
        ControllerConfig {
            min_workers,
            max_workers: max_workers.max(min_workers),
            max_step: 2,
            starving_below: 0.5,
            ahead_above: 0.9,
            shrink_headroom: 1.25,
            cpu_saturated: 0.9,
            compute_bound: 0.3,
            cores_bound: 0.75,
            cores: available_cores(),
            min_gain_share: 0.3,
            linear_gain_share: 0.7,
            ceiling_windows: 4,
            max_ceiling_windows: 128,
            max_step_slowdown: 0.1,
            min_step_slowdown_s: 0.0005,
        }
    }
}

/// A growth step waiting for the window that judges it.
#[derive(Debug, Clone, Copy)]
struct Probe {
    from: usize,
    baseline: f64,
    /// The consumer's step and wait in the baseline window.
    baseline_step: Option<f64>,
    baseline_wait: Option<f64>,
    /// A first judging window that fell short: one noisy window does not
    /// take a step back, the mean of two does (the loop's steps at 64
    /// threads vary a hundredfold).
    first_look: Option<Window>,
    /// For a quadrupling, the doubling within it, judged against the same
    /// baseline if the quadrupling falls short of linear.
    half_way: Option<usize>,
    /// The step reached the most workers allowed: no step after it would
    /// take back a lucky window's verdict, so it is judged as a refining
    /// step is.
    at_limit: bool,
}

impl Probe {
    fn downwards(&self, to: usize) -> bool {
        to < self.from
    }
}

/// Why the controller changed the worker count: recorded with each change,
/// so that `stats()` says why a pool grew or shrank, not only when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeReason {
    /// The loop starved for data: a growth step, kept if it pays.
    Grow,
    /// A quadrupling fell short of linear: the doubling within it is judged.
    HalfWay,
    /// A growth step did not raise samples/s enough, or slowed the loop.
    TakenBack,
    /// After a step that did not pay: one worker fewer, kept if it loses nothing.
    TryFewer,
    /// One worker fewer lost samples/s: back to the count before.
    FewerLost,
    /// The ready queue stayed full: one worker fewer.
    QueueFull,
}

impl ResizeReason {
    pub fn describe(self) -> &'static str {
        match self {
            ResizeReason::Grow => "the loop starved: a growth step",
            ResizeReason::HalfWay => "a quadrupling fell short of linear: its doubling judged",
            ResizeReason::TakenBack => "a growth step did not pay: taken back",
            ResizeReason::TryFewer => "after a step that did not pay: one fewer tried",
            ResizeReason::FewerLost => "one fewer lost samples/s: back",
            ResizeReason::QueueFull => "the ready queue stayed full: one fewer",
        }
    }
}

/// One change of the worker count: when, to what, why, and the window
/// that decided it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resize {
    /// Time since the pool started.
    pub at: std::time::Duration,
    pub workers: usize,
    pub reason: ResizeReason,
    pub window: Window,
}

/// Decides the worker count, one window at a time.
#[derive(Debug, Clone)]
pub struct Controller {
    config: ControllerConfig,
    workers: usize,
    /// Moving average of the occupancy.
    occupancy: Option<f64>,
    probe: Option<Probe>,
    /// A count that did not pay, and for how many more decisions it holds.
    ceiling: Option<(usize, u32)>,
    /// How long the next ceiling holds.
    ceiling_windows: u32,
    /// A growth step just failed: try one worker fewer next.
    try_fewer: bool,
    /// Growth is multiplicative until a growth step first fails to pay,
    /// then by at most `max_step`.
    doubling: bool,
    /// No quadrupling fell short yet: after one did, the work has stopped
    /// scaling linearly somewhere, and growth at most doubles.
    may_quadruple: bool,
    /// Growth steps in a row that gained about what their workers should:
    /// two make the next quadruple (one alone can be the epoch's cold
    /// start, where anything looks linear).
    linear_steps: u32,
    /// Moving average of the process's CPU use: one short window's reading
    /// varies by a tenth.
    cpu: Option<f64>,
    /// Why the last call of `observe` changed the count.
    reason: Option<ResizeReason>,
    /// The consumer has taken a step (a window measured one).
    stepped: bool,
}

impl Controller {
    pub fn new(config: ControllerConfig, workers: usize) -> Self {
        let workers = workers.clamp(config.min_workers, config.max_workers);
        Controller {
            ceiling_windows: config.ceiling_windows,
            config,
            workers,
            occupancy: None,
            probe: None,
            ceiling: None,
            try_fewer: false,
            doubling: true,
            may_quadruple: true,
            linear_steps: 0,
            cpu: None,
            reason: None,
            stepped: false,
        }
    }

    /// The worker count decided so far.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The count it stands by so far: the count before a step still
    /// waiting for its verdict (a growth step not yet judged may yet be
    /// taken back), for a pool that takes over its work.
    pub fn settled_workers(&self) -> usize {
        self.probe.map_or(self.workers, |probe| probe.from)
    }

    /// Why the last call of [`Self::observe`] changed the worker count;
    /// None where it did not (a count the pool was given from elsewhere is
    /// not the controller's change).
    pub fn reason(&self) -> Option<ResizeReason> {
        self.reason
    }

    /// Takes one window's measurements; returns the worker count to use next.
    pub fn observe(&mut self, window: Window) -> usize {
        self.reason = None;
        self.stepped |= window.step.is_some();
        self.occupancy = match (self.occupancy, window.occupancy) {
            (Some(average), Some(now)) => Some(0.5 * average + 0.5 * now),
            (average, now) => now.or(average),
        };
        self.cpu = match (self.cpu, window.cpu) {
            (Some(average), Some(now)) => Some(0.7 * average + 0.3 * now),
            (average, now) => now.or(average),
        };
        if let Some((at, left)) = self.ceiling {
            self.ceiling = (left > 1).then_some((at, left - 1));
        }
        if let Some(mut probe) = self.probe.take() {
            let looked = match probe.first_look {
                Some(first) => first.mean_with(window),
                None => window,
            };
            let throughput = looked.throughput;
            let growth = !probe.downwards(self.workers);
            // Once refining, a step of a worker or two promises a few
            // percent, which one window's noise shows as often as not: it
            // is judged on two windows, and its gain must also exceed the
            // spread between them (busy cores: windows in a row read from
            // 2,000 to 19,000 samples/s, and steps kept on one such window
            // took a pool from 32 to 60 threads that gained nothing). So is
            // a step to the most workers allowed: no later step would take
            // a lucky window's verdict back (a doubling from 32 to 64 kept
            // on its first window stayed for the epoch at a third of the
            // rate).
            let two_looks = growth && (!self.doubling || probe.at_limit);
            let mut paid = self.paid_off(probe, looked);
            if let (true, Some(first)) = (two_looks, probe.first_look) {
                let spread = (first.throughput - window.throughput).abs();
                paid = paid && throughput - probe.baseline >= spread;
            }
            if growth && probe.first_look.is_none() && (!paid || two_looks) {
                probe.first_look = Some(window);
                self.probe = Some(probe);
                return self.workers;
            }
            if !paid {
                if let Some(half_way) = probe.half_way.filter(|_| growth) {
                    // Short of linear: judge the doubling within it.
                    self.may_quadruple = false;
                    self.workers = half_way;
                    self.reason = Some(ResizeReason::HalfWay);
                    self.probe = Some(Probe {
                        first_look: None,
                        half_way: None,
                        at_limit: false,
                        ..probe
                    });
                    return self.workers;
                }
                if growth && self.workers - probe.from > self.config.max_step {
                    // A doubling that did not pay: refine below where it went.
                    self.doubling = false;
                    self.ceiling = Some((self.workers - 1, self.ceiling_windows));
                } else if growth {
                    self.doubling = false;
                    self.ceiling = Some((probe.from, self.ceiling_windows));
                    self.ceiling_windows =
                        (self.ceiling_windows * 2).min(self.config.max_ceiling_windows);
                    self.try_fewer = true;
                }
                if growth {
                    self.linear_steps = 0;
                }
                self.workers = probe.from;
                self.reason = Some(if growth {
                    ResizeReason::TakenBack
                } else {
                    ResizeReason::FewerLost
                });
                return self.workers;
            }
            if !growth {
                return self.workers;
            }
            self.ceiling_windows = self.config.ceiling_windows;
            if self.gain_share(probe, throughput) >= self.config.linear_gain_share {
                self.linear_steps += 1;
                if !self.doubling && self.linear_steps >= 2 {
                    // Two refining steps in a row gained what their workers
                    // should: the work scales again, and growth doubles
                    // (quadrupling stays off: it stopped scaling once).
                    self.doubling = true;
                    self.may_quadruple = false;
                    self.linear_steps = 0;
                }
            } else {
                self.linear_steps = 0;
            }
            // A growth step that paid: the window that judged it is also the
            // next step's baseline, so a ramp takes one window a step.
        }
        if std::mem::take(&mut self.try_fewer) && self.workers > self.config.min_workers {
            self.probe = Some(Probe {
                from: self.workers,
                baseline: window.throughput,
                baseline_step: window.step,
                baseline_wait: window.wait,
                first_look: None,
                half_way: None,
                at_limit: false,
            });
            self.workers -= 1;
            self.reason = Some(ResizeReason::TryFewer);
            return self.workers;
        }
        // Occupancy is what the consumer found when it asked for a batch:
        // in a window where it did not ask (a long training step, or a loop
        // that stopped iterating) there is no new evidence, and the average
        // of older windows must not keep the pool growing.
        let (Some(occupancy), Some(_)) = (self.occupancy, window.occupancy) else {
            return self.workers;
        };
        let config = &self.config;
        if occupancy < config.starving_below {
            let mut limit = match self.ceiling {
                Some((at, _)) => at.min(config.max_workers),
                None => config.max_workers,
            };
            let demand = self.workers as f64 / config.cores.max(1) as f64;
            if window.compute.is_some_and(|share| {
                share >= config.compute_bound || share * demand >= config.cores_bound
            }) {
                // Until the consumer's first step, what its own thread needs
                // is unknown, and no step's slowdown can judge a growth: the
                // workers leave it a core (a training loop that computes ran
                // its first steps far over their time alone beside computing
                // threads on every core: benchmarks/RESULTS.md, session 24).
                let cores = if self.stepped {
                    config.cores
                } else {
                    config.cores.saturating_sub(1).max(1)
                };
                limit = limit.min(cores.max(self.workers));
            }
            let cpu_saturated = self.cpu.is_some_and(|cpu| cpu >= config.cpu_saturated);
            // Starving while nothing finishes is the loop waiting on hung
            // or very slow samples: more workers would only wait beside them.
            let finishing = window.throughput > 0.0;
            if self.workers < limit && !cpu_saturated && finishing {
                let quadrupling = self.doubling && self.may_quadruple && self.linear_steps >= 2;
                let step = if quadrupling {
                    3 * self.workers
                } else if self.doubling {
                    self.workers.max(config.max_step)
                } else {
                    config.max_step
                };
                let to = (self.workers + step).min(limit);
                let doubled = 2 * self.workers;
                self.probe = Some(Probe {
                    from: self.workers,
                    baseline: window.throughput,
                    baseline_step: window.step,
                    baseline_wait: window.wait,
                    first_look: None,
                    half_way: (to > doubled).then_some(doubled),
                    at_limit: to == limit,
                });
                self.workers = to;
                self.reason = Some(ResizeReason::Grow);
            }
        } else if occupancy > config.ahead_above
            && self.workers > config.min_workers
            && window.busy_workers.map_or(true, |busy| {
                (self.workers - 1) as f64 >= busy * config.shrink_headroom
            })
        {
            self.workers -= 1;
            self.reason = Some(ResizeReason::QueueFull);
        }
        self.workers
    }

    /// Whether going from `probe.from` to the current count raised
    /// throughput enough without slowing the consumer's steps past the
    /// tolerance, or, downwards, lost no throughput.
    fn paid_off(&self, probe: Probe, window: Window) -> bool {
        let throughput = window.throughput;
        if !probe.downwards(self.workers) {
            if let (Some(before), Some(after)) = (probe.baseline_step, window.step) {
                let allowed =
                    (before * self.config.max_step_slowdown).max(self.config.min_step_slowdown_s);
                // A loop that waited for data is slowed only if its whole
                // iteration, step and wait, got longer: steps longer by
                // less than its waits got shorter leave it iterating faster
                // (data alone at 64 threads: steps several times longer,
                // each batch sooner).
                let iteration_shorter = match (probe.baseline_wait, window.wait) {
                    (Some(waited), Some(waits)) => after + waits + allowed <= before + waited,
                    _ => false,
                };
                if after > before + allowed && !iteration_shorter {
                    return false;
                }
            }
        }
        if probe.downwards(self.workers) {
            return probe.baseline <= 0.0 || throughput >= probe.baseline;
        }
        let wanted = if probe.half_way.is_some() {
            self.config.linear_gain_share
        } else {
            self.config.min_gain_share
        };
        self.gain_share(probe, throughput) >= wanted
    }

    /// A growth step's gain in throughput as a share of the ideal gain
    /// (linear in the worker count); infinite from a baseline of nothing
    /// finished (a cold start: the step is kept).
    fn gain_share(&self, probe: Probe, throughput: f64) -> f64 {
        if probe.baseline <= 0.0 {
            return f64::INFINITY;
        }
        let ideal_gain = (self.workers - probe.from) as f64 / probe.from as f64;
        (throughput / probe.baseline - 1.0) / ideal_gain
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn steps_are_bounded_and_the_count_stays_in_range(
            min in 1usize..4,
            span in 0usize..40,
            start in 0usize..60,
            windows in prop::collection::vec(
                (0.0f64..1e5, prop::option::of(0.0f64..=1.0), prop::option::of(0.0f64..=1.0)),
                1..200,
            ),
        ) {
            let max = min + span;
            let mut controller = Controller::new(ControllerConfig::new(min, max), start);
            let mut before = controller.workers();
            prop_assert!((min..=max).contains(&before));
            for (throughput, occupancy, cpu) in windows {
                let after = controller.observe(Window { throughput, occupancy, cpu, compute: None, step: None, wait: None, busy_workers: None });
                prop_assert!((min..=max).contains(&after));
                // Quadrupling while steps scale linearly, and taken back.
                prop_assert!(after.abs_diff(before) <= 3 * before.max(2));
                before = after;
            }
        }
    }

    fn window(throughput: f64, occupancy: f64, cpu: Option<f64>) -> Window {
        Window {
            throughput,
            occupancy: Some(occupancy),
            cpu,
            compute: None,
            step: None,
            wait: None,
            busy_workers: None,
        }
    }

    /// Runs the controller against a workload whose throughput is
    /// `rate(workers)`, with the consumer always starving.
    fn settle(
        controller: &mut Controller,
        mut rate: impl FnMut(usize) -> f64,
        windows: usize,
    ) -> Vec<usize> {
        (0..windows)
            .map(|_| {
                let throughput = rate(controller.workers());
                controller.observe(window(throughput, 0.0, Some(0.2)))
            })
            .collect()
    }

    #[test]
    fn it_stands_by_the_count_before_a_step_still_to_be_judged() {
        // Flat work from 8 workers: the doubling to 16 waits for two looks
        // and is taken back; so is a step of two, after which one fewer is
        // probed.
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 8);
        assert_eq!(controller.settled_workers(), 8);
        let seen: Vec<(usize, usize)> = (0..7)
            .map(|_| {
                let workers = controller.observe(window(800.0, 0.0, Some(0.2)));
                (workers, controller.settled_workers())
            })
            .collect();
        assert_eq!(
            seen,
            [(16, 8), (16, 8), (8, 8), (10, 8), (10, 8), (8, 8), (7, 8)],
            "{seen:?}"
        );
        // One fewer lost nothing: kept.
        controller.observe(window(800.0, 0.0, Some(0.2)));
        assert_eq!((controller.workers(), controller.settled_workers()), (7, 7));
    }

    #[test]
    fn scaling_work_doubles_then_quadruples_up_to_the_maximum() {
        let mut controller = Controller::new(ControllerConfig::new(1, 40), 2);
        let counts = settle(&mut controller, |n| 100.0 * n as f64, 10);
        assert_eq!(&counts[..4], &[4, 8, 32, 40], "{counts:?}");
        assert!(counts[4..].iter().all(|&n| n == 40), "{counts:?}");
    }

    #[test]
    fn work_that_stops_scaling_linearly_is_not_quadrupled_again() {
        // Linear up to 32 workers, a fifth of that per worker after.
        let rate = |n: usize| 100.0 * n.min(32) as f64 + 20.0 * n.saturating_sub(32) as f64;
        let mut controller = Controller::new(ControllerConfig::new(1, 256), 4);
        let counts = settle(&mut controller, rate, 9);
        // 4 to 8 to 16 scale linearly: quadruple. 16 to 64 gains 0.47 of
        // the ideal, short of linear (two looks): the doubling within it,
        // 32, is judged against 16 instead, and pays in full; yet growth
        // only doubles now (to 64, which does not pay: back to 32).
        assert_eq!(&counts[..8], &[8, 16, 64, 64, 32, 64, 64, 32], "{counts:?}");
    }

    #[test]
    fn work_that_does_not_scale_returns_to_where_it_started() {
        // GIL-bound: throughput is flat in the worker count.
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 2);
        let counts = settle(&mut controller, |_| 300.0, 10);
        assert_eq!(counts[0], 4, "one probe");
        assert_eq!(counts[1], 4, "a second look");
        assert_eq!(counts[2], 2, "taken back");
        assert_eq!(counts[3], 1, "one fewer, probed");
        assert_eq!(counts[4], 1, "kept: it lost nothing");
        assert!(counts[5..].iter().all(|&n| n <= 2), "{counts:?}");
    }

    #[test]
    fn one_worker_fewer_is_taken_back_when_it_loses_throughput() {
        // Scales up to 2 workers (the cores), flat after.
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 2);
        let counts = settle(&mut controller, |n| 100.0 * n.min(2) as f64, 6);
        assert_eq!(counts, [4, 4, 2, 1, 2, 2], "{counts:?}");
    }

    /// The windows at which a count above `at` was probed.
    fn probes_above(counts: &[usize], at: usize) -> Vec<usize> {
        (0..counts.len())
            .filter(|&i| counts[i] > at && (i == 0 || counts[i - 1] <= at))
            .collect()
    }

    #[test]
    fn growth_stops_where_the_gain_ends() {
        // Scales linearly up to 10 workers, flat after.
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 2);
        let counts = settle(&mut controller, |n| 100.0 * n.min(10) as f64, 80);
        // 2 to 4 to 8 scale linearly: quadrupling to 32, which falls short
        // of linear (two looks): the doubling within it, 16, is judged
        // against 8 and does not pay either (two looks): back to 8, then
        // steps of two, each judged on two windows, up to 12, which does
        // not pay; 9 is probed and loses; then 10, with 12 probed again ever
        // more rarely.
        assert_eq!(
            &counts[..14],
            &[4, 8, 32, 32, 16, 16, 8, 10, 10, 12, 12, 10, 9, 10],
            "{counts:?}"
        );
        assert!(counts[6..].iter().all(|&n| n <= 12));
        let probes = probes_above(&counts[6..], 10);
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() >= 3, "{counts:?}");
        assert!(gaps.windows(2).all(|g| g[1] > g[0]), "{gaps:?}");
        let settled = counts.iter().filter(|&&n| n == 10).count();
        assert!(settled * 10 >= counts.len() * 7, "mostly at 10: {counts:?}");
    }

    #[test]
    fn a_ceiling_expires_and_the_count_is_probed_again_ever_more_rarely() {
        let mut config = ControllerConfig::new(1, 64);
        config.ceiling_windows = 5;
        let mut controller = Controller::new(config, 2);
        let counts = settle(&mut controller, |n| 100.0 * n.min(2) as f64, 40);
        // Probed at the start, again when the 5-window ceiling expired, then
        // after 10 windows, then 20.
        assert_eq!(probes_above(&counts, 2), [0, 7, 19], "{counts:?}");
        assert_eq!(&counts[..12], &[4, 4, 2, 1, 2, 2, 2, 4, 4, 2, 1, 2]);
    }

    #[test]
    fn a_step_that_pays_resets_the_back_off() {
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 2);
        // Flat at first (three failed probes, ceilings of 4 then 8 windows)...
        let flat = settle(&mut controller, |n| 100.0 * n.min(2) as f64, 24);
        assert!(probes_above(&flat, 2).len() >= 2, "{flat:?}");
        // ...then the work starts to scale: the next probe pays, two steps
        // of two (two windows each) gain linearly, and growth doubles again.
        let scaling = settle(&mut controller, |n| 100.0 * n as f64, 50);
        let first_step = scaling.iter().position(|&n| n > 2).unwrap();
        assert!(first_step <= 16, "the ceiling expired: {scaling:?}");
        let ramp = &scaling[first_step..];
        assert_eq!(&ramp[..8], &[4, 4, 6, 6, 12, 24, 48, 64], "{scaling:?}");
        assert!(ramp[7..].iter().all(|&n| n == 64), "{scaling:?}");
    }

    #[test]
    fn a_step_to_the_maximum_is_not_kept_on_one_lucky_window() {
        // Flat work; the first window at 64 workers (the maximum) reads
        // half again as much as the rest.
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 32);
        let mut lucky = true;
        let counts = settle(
            &mut controller,
            |n| {
                if n == 64 && std::mem::take(&mut lucky) {
                    1500.0
                } else {
                    1000.0
                }
            },
            4,
        );
        // Judged on two windows: taken back, then refined from 32 in steps
        // of two.
        assert_eq!(counts, [64, 64, 32, 34], "{counts:?}");
    }

    #[test]
    fn noise_alone_does_not_grow_a_refining_pool() {
        // Flat work whose windows read 40 % above or below its rate, in a
        // fixed pseudo-random order, with the loop always starving: once
        // refining, steps of two are kept only on a gain beyond the spread
        // of their two windows.
        let mut controller = Controller::new(ControllerConfig::new(1, 256), 32);
        let mut state = 12345u64;
        let noisy = |_: usize| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if (state >> 33) & 1 == 1 {
                1400.0
            } else {
                600.0
            }
        };
        let counts = settle(&mut controller, noisy, 400);
        // The doubling at the start may take a lucky window; once refining
        // (from the first step taken back), the count drifts no higher.
        let refining = counts.windows(2).position(|w| w[1] < w[0]).unwrap() + 1;
        let from = counts[refining];
        assert!(
            counts[refining..].iter().all(|&n| n <= from + 2),
            "drifted up from {from}: {counts:?}"
        );
    }

    #[test]
    fn a_starving_loop_with_nothing_finishing_does_not_grow_the_pool() {
        // One hung sample holds the batch the loop waits for, and the other
        // workers have nothing left to run: starving, yet nothing finishes.
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 2);
        for _ in 0..50 {
            assert_eq!(controller.observe(window(0.0, 0.0, Some(0.05))), 2);
        }
        // Once samples finish again, a starving loop grows the pool.
        assert_eq!(controller.observe(window(100.0, 0.0, Some(0.05))), 4);
    }

    fn stepping(throughput: f64, step: f64, wait: f64) -> Window {
        Window {
            throughput,
            occupancy: Some(0.0),
            cpu: Some(0.2),
            compute: None,
            step: Some(step),
            wait: Some(wait),
            busy_workers: None,
        }
    }

    #[test]
    fn a_growth_step_that_slows_the_training_loop_is_taken_back() {
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 2);
        assert_eq!(controller.observe(stepping(200.0, 0.010, 0.005)), 4);
        // Twice the samples, but the loop's steps ran 30% slower, by more
        // than its waits shrank: each iteration took longer. Twice.
        let slower = stepping(400.0, 0.013, 0.004);
        assert_eq!(controller.observe(slower), 4, "look again");
        assert_eq!(controller.observe(slower), 2, "taken back");
    }

    #[test]
    fn a_growth_step_within_the_loops_tolerance_is_kept() {
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 2);
        assert_eq!(controller.observe(stepping(200.0, 0.010, 0.005)), 4);
        // 5% slower steps, within the 10% tolerance: kept, and on.
        assert_eq!(controller.observe(stepping(400.0, 0.0105, 0.005)), 8);
    }

    #[test]
    fn longer_steps_are_kept_where_the_loop_iterates_faster() {
        // Data alone, 32 to 64 threads: the loop's steps grow from 0.7 to
        // 2.8 ms (the GIL), but its waits fall from 3.1 ms to nothing: each
        // batch takes 2.8 ms instead of 3.8.
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 32);
        assert_eq!(controller.observe(stepping(8500.0, 0.0007, 0.0031)), 64);
        assert_eq!(controller.observe(stepping(15000.0, 0.0028, 0.0)), 64);
        assert_eq!(controller.workers(), 64, "kept");
        // Without the waits it knew of, the same steps are a slower loop.
        let mut blind = Controller::new(ControllerConfig::new(1, 64), 32);
        let unknown_waits = |window: Window| Window {
            wait: None,
            ..window
        };
        blind.observe(unknown_waits(stepping(8500.0, 0.0007, 0.0031)));
        blind.observe(unknown_waits(stepping(15000.0, 0.0028, 0.0)));
        assert_eq!(
            blind.observe(unknown_waits(stepping(15000.0, 0.0028, 0.0))),
            32
        );
    }

    #[test]
    fn microsecond_steps_slowed_by_noise_do_not_stop_growth() {
        // A loop that only takes batches: 50 us steps, 100 us after the
        // step (twice, but by less than the 0.5 ms that matters).
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 2);
        assert_eq!(controller.observe(stepping(200.0, 0.000_05, 0.01)), 4);
        assert_eq!(controller.observe(stepping(400.0, 0.000_1, 0.01)), 8);
    }

    #[test]
    fn a_saturated_cpu_adds_no_worker() {
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 2);
        for _ in 0..10 {
            assert_eq!(controller.observe(window(500.0, 0.0, Some(0.95))), 2);
        }
    }

    #[test]
    fn one_window_below_saturation_does_not_grow_a_saturated_process() {
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 4);
        for _ in 0..5 {
            assert_eq!(controller.observe(window(100.0, 0.0, Some(0.95))), 4);
        }
        assert_eq!(controller.observe(window(100.0, 0.0, Some(0.8))), 4);
        // CPU to spare for a while: growth resumes.
        let counts: Vec<usize> = (0..3)
            .map(|_| controller.observe(window(100.0, 0.0, Some(0.5))))
            .collect();
        assert!(counts.iter().any(|&n| n > 4), "{counts:?}");
    }

    #[test]
    fn workers_that_compute_grow_no_further_than_the_cores() {
        let config = ControllerConfig {
            cores: 4,
            ..ControllerConfig::new(1, 64)
        };
        // Where every step pays in full: only the cores hold the pool back.
        let settled_by = |start: usize, compute: f64, cpu: f64, step: Option<f64>| {
            let mut controller = Controller::new(config.clone(), start);
            for _ in 0..12 {
                let throughput = 100.0 * controller.workers() as f64;
                controller.observe(Window {
                    compute: Some(compute),
                    step,
                    ..window(throughput, 0.0, Some(cpu))
                });
            }
            controller.workers()
        };
        let settled = |start, compute, cpu| settled_by(start, compute, cpu, Some(0.001));
        assert_eq!(settled(1, 0.8, 0.5), 4);
        // Before the consumer's first step, they leave its thread a core.
        assert_eq!(settled_by(1, 0.8, 0.5, None), 3);
        // Four times as many threads as cores, each on a CPU a fifth of its
        // time (waiting for one the rest), keep the cores busy: no more.
        assert_eq!(settled(16, 0.2, 0.5), 16);
        // Workers that mostly wait (I/O) grow past the cores, stepped or not.
        let waiting = settled(1, 0.05, 0.2);
        assert!(waiting > 4, "{waiting}");
        let waiting = settled_by(1, 0.05, 0.2, None);
        assert!(waiting > 4, "{waiting}");
    }

    #[test]
    fn a_single_core_leaves_computing_workers_one() {
        let config = ControllerConfig {
            cores: 1,
            ..ControllerConfig::new(1, 64)
        };
        let mut controller = Controller::new(config, 1);
        for _ in 0..6 {
            let throughput = 100.0 * controller.workers() as f64;
            controller.observe(Window {
                compute: Some(0.9),
                ..window(throughput, 0.0, Some(0.5))
            });
        }
        assert_eq!(controller.workers(), 1);
    }

    #[test]
    fn each_change_says_why() {
        // Flat in the worker count (GIL-bound): a growth step of one
        // `max_step`, taken back after two looks, then one fewer tried.
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 2);
        assert_eq!(controller.reason(), None);
        let mut changes = Vec::new();
        for _ in 0..5 {
            let before = controller.workers();
            let after = controller.observe(window(400.0, 0.0, Some(0.2)));
            if after != before {
                changes.push((after, controller.reason().unwrap()));
            }
        }
        assert_eq!(
            changes,
            [
                (4, ResizeReason::Grow),
                (2, ResizeReason::TakenBack),
                (1, ResizeReason::TryFewer)
            ]
        );
        // A queue that stays full.
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 5);
        controller.observe(window(100.0, 1.0, Some(0.1)));
        assert_eq!(controller.reason(), Some(ResizeReason::QueueFull));
    }

    #[test]
    fn a_full_ready_queue_shrinks_one_at_a_time_down_to_the_minimum() {
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 5);
        let counts: Vec<usize> = (0..8)
            .map(|_| controller.observe(window(100.0, 1.0, Some(0.1))))
            .collect();
        assert_eq!(counts, [4, 3, 2, 1, 1, 1, 1, 1]);
    }

    #[test]
    fn a_full_ready_queue_shrinks_no_further_than_the_workers_the_consumer_keeps_busy() {
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 32);
        // The loop keeps 20 workers on a task: 25 (20 with headroom) stay,
        // however long the queue stays full.
        let busy = |workers| Window {
            busy_workers: Some(workers),
            ..window(20_000.0, 1.0, Some(0.5))
        };
        let counts: Vec<usize> = (0..12).map(|_| controller.observe(busy(20.0))).collect();
        assert_eq!(counts, [31, 30, 29, 28, 27, 26, 25, 25, 25, 25, 25, 25]);
        // A loop that slows down needs fewer: the shrink goes on.
        assert_eq!(controller.observe(busy(10.0)), 24);
    }

    #[test]
    fn a_half_full_queue_holds_the_count() {
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 6);
        for _ in 0..10 {
            assert_eq!(controller.observe(window(100.0, 0.7, None)), 6);
        }
    }

    #[test]
    fn without_a_consumer_request_only_a_pending_probe_is_judged() {
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 2);
        let idle = Window {
            throughput: 100.0,
            occupancy: None,
            cpu: None,
            compute: None,
            step: None,
            wait: None,
            busy_workers: None,
        };
        assert_eq!(controller.observe(idle), 2);
        assert_eq!(controller.observe(window(100.0, 0.0, None)), 4);
        assert_eq!(controller.observe(idle), 4, "no gain: a second look");
        assert_eq!(controller.observe(idle), 2, "still none: taken back");
        assert_eq!(controller.observe(idle), 1, "one fewer, probed");
    }

    #[test]
    fn windows_without_a_consumer_request_never_resize() {
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 4);
        assert_eq!(controller.observe(window(400.0, 0.0, None)), 8);
        assert_eq!(
            controller.observe(window(600.0, 0.0, None)),
            16,
            "kept, and the next step taken"
        );
        assert_eq!(controller.observe(window(800.0, 1.0, None)), 16, "kept");
        let idle = Window {
            throughput: 0.0,
            occupancy: None,
            cpu: None,
            compute: None,
            step: None,
            wait: None,
            busy_workers: None,
        };
        // The average still says "starving", but nobody asked: hold.
        for _ in 0..20 {
            assert_eq!(controller.observe(idle), 16);
        }
        // A full queue moves the average up from 0: 0.5, 0.75, 0.875, then
        // past 0.9, where the pool shrinks.
        let full = window(600.0, 1.0, None);
        let counts: Vec<usize> = (0..4).map(|_| controller.observe(full)).collect();
        assert_eq!(counts, [16, 16, 15, 14]);
    }

    #[test]
    fn one_noisy_window_does_not_take_a_step_back() {
        let mut controller = Controller::new(ControllerConfig::new(1, 64), 4);
        assert_eq!(controller.observe(window(400.0, 0.0, None)), 8);
        assert_eq!(
            controller.observe(window(380.0, 0.0, None)),
            8,
            "a dip: look again"
        );
        // The mean of the two looks, 540, is a 35% gain for an ideal 100%:
        // kept, and the same window starts the next step.
        assert_eq!(controller.observe(window(700.0, 0.0, None)), 16, "and on");
    }

    #[test]
    fn the_count_stays_within_bounds_whatever_the_signals() {
        let mut controller = Controller::new(ControllerConfig::new(2, 9), 30);
        assert_eq!(controller.workers(), 9);
        let signals = [(0.0, 0.0), (1e6, 0.0), (0.0, 1.0), (5.0, 0.3), (1e9, 0.0)];
        for i in 0..200 {
            let (throughput, occupancy) = signals[i % signals.len()];
            let n = controller.observe(window(throughput, occupancy, None));
            assert!((2..=9).contains(&n));
        }
    }
}
