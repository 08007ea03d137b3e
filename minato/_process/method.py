"""Threads or processes: how a loader's workers run, and the automatic choice.

``worker_method`` takes torch's ``WorkerInfo.worker_method`` values,
``"thread"`` and ``"multiprocessing"``, or ``"auto"`` (the default). Auto
starts on threads, which win wherever the work releases the GIL (I/O,
numpy, torch ops, minato.io): no start-up, no copies. From what it measures
while loading it moves the loader to worker processes when the dataset's
Python holds the GIL, which threads can only share:

- the workers' GIL wait: the share of their fetch time spent waiting to
  take the GIL (measured in Rust at every task); high when the dataset's
  Python serialises the threads;
- the training loop's GIL delay: how long the loop's thread waits to take
  the GIL back after releasing it, as every torch op it runs does. The
  loader probes it on the loop's thread between batches (a bare release and
  re-take, a few microseconds when no worker holds the GIL, up to the
  interpreter's 5 ms switch interval when one does); high when worker
  threads slow the training loop, even a single worker.

Either past its threshold puts the loader on processes *on trial*, and so
do a training loop that keeps the workers ahead of it (it waited for data
under ``LOOP_BOUND_WAITED`` of its time since its first batch, the
workers' start-up left out, and found the ready queue at least
``LOOP_BOUND_OCCUPANCY`` full: a GPU-bound loop, whose speed is all that
counts), as soon as its second batch shows it; or as soon as its first
step does, where that step took longer than the wait for the workers'
first batch, whatever the queue held (a thread beside the loop loads
slower too). Then the training thread waits briefly for the fork server,
so that its next step runs beside processes. And, after
``DECIDE_AFTER_S``, a loop GIL delay past half the bound. Where the loop
sets the pace, the probe, taken as a batch arrives, finds the workers
idle, as a full queue leaves them, while during the loop's step they run
and take its GIL. The trial then asks the question directly: the training
loop's own rate, batches per second as it receives them (what the user's
program gets done, the loop's steps and waits together), is measured on
threads first (for a loop that sets the pace, its steps so far), then on
processes, and the loader keeps the faster, for good (those two trials
keep processes only if the loop ran ``TRIAL_GAIN`` faster on them:
otherwise the threads did not slow it; a threads side of a step or two,
as noisy as a step, keeps them unless the loop ran ``SHORT_SIDE_TOLERANCE``
slower on them). Processes that do not pay (a loop
the GIL does not slow much, a dataset whose samples cost more to send than
to make) go back to threads. Both signals well below their threshold for
``DECIDE_AFTER_S``, the loop waiting for data, keeps threads and ends the
probing.

A third signal needs no GIL at all: the worker threads' own CPU clocks
(read in Rust around each task). Workers on a CPU for ``COMPUTE_SHARE`` of
their fetch time compute, and get a trial that keeps processes only on a
gain, where the GIL reads free: in threads of one process, work that
releases the GIL still hands it over inside (PIL's decoder, chunk by
chunk) and shares one allocator. Samples that take under
``MIN_SAMPLE_WORK_S`` of CPU stay on threads whatever the GIL does. A
decision reached holds for later loaders over the same dataset type in the
process (no thread phase, no trial). On free-threaded Python (no GIL) auto
always keeps threads. The decision and
its reason are in ``stats()`` and logged once (INFO, the ``minato``
logger).
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minato._minato import _cores_busy_time, _runnable_wait, _thread_runnable_wait
from minato._util.log import logger


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


WORKER_METHODS = ("auto", "thread", "multiprocessing")

# Workers that wait this share of their fetch time for the GIL are serialised by it.
GIL_BOUND_SHARE = 0.2
# Twice that is plain from the first samples (two threads taking turns wait
# half their time): decided after CLEAR_WINDOW_S, not MIN_WINDOW_S, since
# every batch more on threads is one the GIL slows.
CLEAR_GIL_SHARE = 2 * GIL_BOUND_SHARE
CLEAR_WINDOW_S = 0.03
# The same sign read from the workers' CPU clocks, which see the GIL's
# hand-overs inside the dataset's Python (the wait above is only taken as a
# task enters Python, and reads anywhere from low to high for two threads of
# pure Python, depending on how their turns fall): workers that are in their
# tasks together (at least SERIAL_PARALLEL of them on average) yet use
# together about one core (SERIAL_CORES), where apart they could use at
# least SERIAL_SPARE times that, run one at a time. Two threads of pure
# Python read just under a core, of GIL-free hashing nearly two, of sleeps a
# third of one (benchmarks/RESULTS.md has the readings).
SERIAL_PARALLEL = 1.3
SERIAL_CORES = (0.75, 1.2)
SERIAL_SPARE = 1.4
# Many threads that sleep (I/O) also use about one core together, each a
# sliver of its time: from SERIAL_MANY threads at work on, the sign also
# wants tasks to wait to enter Python, as threads queued for a GIL held all
# the time do, the longer the more of them there are
# (SERIAL_GIL_SHARE_PER_THREAD each, at most SERIAL_GIL_SHARE_CAP): sixteen
# threads of pure Python wait most of their fetch time, many sleeping
# threads handing round a GIL that is mostly free a small share of it
# (benchmarks/RESULTS.md). (A few threads are judged by their clocks alone:
# where cheap samples go to them in runs, the wait is paid once a run and
# reads low.)
SERIAL_MANY = 8
# Threads that use about one core together because the machine's other
# cores are taken (another process, other ranks' workers) are not run one
# at a time by the GIL: they are runnable, waiting for a core, where threads
# waiting for the GIL are blocked. The sign wants the process's threads to
# have waited for a core less than this share of the time the workers at
# work spent off a CPU (benchmarks/RESULTS.md, session 2026-11-27 (8), has
# the readings: pure Python reads well under it, idle or beside a busy
# core; PIL threads beside a busy core, over it).
SERIAL_RUNNABLE_SHARE = 0.5
SERIAL_GIL_SHARE_PER_THREAD = 0.03
SERIAL_GIL_SHARE_CAP = 0.3
# A training process that keeps this share of the cores busy on threads
# leaves processes no core to load faster on: while the training loop waits
# for data (not LOOP_BOUND_WAITED), its GIL delay only delays a wait, and
# the threads stay. (8 PIL threads on 2 cores kept the process above it,
# and ran faster than processes there: benchmarks/RESULTS.md.)
CORES_BUSY = 0.8
# The same where other processes take the cores (a sampler, other ranks'
# workers): the process's threads were runnable without a core, this many
# on average (threads that compute on too few cores read several; threads
# of pure Python, which wait for the GIL, well under one: RESULTS.md).
NO_SPARE_CORE_RUNNABLE = 1.0
# ...read at most this often.
CORE_CHECK_INTERVAL_S = 0.05
# A loop that waits this long on average to take the GIL back is slowed by
# the workers: a GPU training step takes it back after every op it launches,
# thousands a step, so a fraction of a millisecond each adds up (the trial
# on processes tells whether it added up to more than they cost).
LOOP_DELAY_BOUND_S = 0.0003
# Half of it is not proof (a data-bound loop beside sleeping and numpy
# datasets reads under it, and some runs of a PIL pipeline that loads faster
# on processes read between the two: benchmarks/RESULTS.md): a trial that
# keeps processes only if the loop gains on them (TRIAL_GAIN) settles it.
LOOP_DELAY_TRIAL_S = LOOP_DELAY_BOUND_S / 2
# Evidence wanted before deciding: time since the workers started...
MIN_WINDOW_S = 0.15
# ...samples loaded, and probes of the loop's GIL delay.
MIN_SAMPLES = 16
MIN_PROBES = 6
# ...or 2 probes when their mean is this many times the bound.
CLEAR_DELAY_FACTOR = 4
# A loop's first steps show that it sets the pace (`observe`'s early rule)
# only beside at most this many worker threads at work at once per core.
# More take the cores and the GIL from it in turns whatever it does: 32
# threads sleeping a millisecond a sample, beside a loop that only takes
# its batches, made its first step outlast its wait for the first batch, a
# start-up many times its later steps; a trial on that step kept processes
# that ran the epoch at half the threads' rate (benchmarks/RESULTS.md,
# session 25). The later rules, over a longer window, judge such a loop.
PACE_MAX_PARALLEL = 1.0
# Samples cheaper than this stay on threads whatever the GIL does: a worker
# process's round trip (pickling, two socket hops) would cost more than the
# GIL contention it saves. Measured by the worker threads' own CPU clocks
# where the engine reads them (a sample that sleeps or waits for I/O for a
# millisecond is as cheap to run as its CPU time: many threads handing the
# GIL around for such samples wait for it, yet a process would only add its
# round trip), else by the fetch time's median.
MIN_SAMPLE_WORK_S = 100e-6
# Workers on a CPU for this share of their fetch time (the GIL's waits left
# out) compute: in worker processes they would run on the cores apart from
# the training process, where threads share one interpreter (its GIL's
# hand-overs inside the work, its allocator). On a GPU machine's 16 cores a
# PIL pipeline whose GIL signals both read "free" loaded half as fast on
# threads as on processes, and on 2 cores faster: the trial decides.
COMPUTE_SHARE = 0.3
# Workers on a CPU for less than this share of their fetch time mostly wait
# (I/O): a data-bound loop's GIL delay then comes from many threads handing
# the GIL around, and processes, a fixed pool of num_workers, would not
# replace a pool grown for I/O (several times faster on threads:
# benchmarks/RESULTS.md). Not evidence for processes.
WAITING_SHARE = 0.1
# Both signals low for this long (over every epoch the loader stayed
# undecided through, see WorkerMethod._seen_before): threads stay, and
# probing ends.
DECIDE_AFTER_S = 1.0
# Samples under MIN_SAMPLE_WORK_S keep threads after DECIDE_AFTER_S, or
# sooner once this many were timed: many threads on cheap samples time
# thousands well within the second, and an undecided loader neither hands
# over to whole batches (minato._loader.whole_batches) nor lets its fork
# server go.
DECIDE_AFTER_SAMPLES = 2048
# Probes of the loop's GIL delay, at most this often.
PROBE_INTERVAL_S = 0.01
# Each side of the trial measures the loop's rate over at least this long
# and this many batches...
TRIAL_MIN_S = 1.0
TRIAL_MIN_BATCHES = 8
# ...threads only over the batches they delivered by then, at least
# CLEAR_THREADS_MIN_BATCHES, after a clear sign (the workers' GIL wait, or the
# loop's GIL delay past the bound): every batch more on them is one the GIL
# slows, and there the trial only guards against processes much slower
# (fewer cores than workers): a GIL-bound dataset's first epoch reads the
# further under torch's processes the longer the threads' side
# (benchmarks/RESULTS.md).
CLEAR_THREADS_MIN_S = 0.0
CLEAR_THREADS_MIN_BATCHES = 2
# ...and over one batch for a loop that sets the pace: its first step, which
# ran beside the threads, is their side (see _try_for_the_loop). Such a loop
# shows its pace before MIN_WINDOW_S where its steps took longer than its
# wait for the workers' first batch (see `observe`).
PACE_THREADS_MIN_BATCHES = 1
# Once decided for such a loop, the training thread waits up to this long,
# and at most one of its steps, for the spec's pickle and the fork server,
# so that its next step does not run beside the threads too.
MOVE_WAIT_S = 0.1
# ...and processes keep the loader unless the loop ran this much slower on
# them than on threads (they have been paid for: start-up, memory).
TRIAL_TOLERANCE = 0.03
# A trial that asks only whether processes load faster (workers that
# compute, the loop waiting for data) measures threads from its decision on,
# as it measures processes after their start: the batches before it are the
# epoch's cold start on threads, slower than the threads' later ones
# (benchmarks/RESULTS.md, session 29). So does a trial for a loop that
# never waited while more worker threads were at work than cores (see
# PACE_MAX_PARALLEL): their start-up, not the threads, slowed it, and a
# trial on it kept processes that ran at half the threads' later rate
# (RESULTS.md, session 31). Its first batches after the decision may have
# been loaded before it, and arrive at once: left out.
LOADING_TRIAL_SKIP = 2
# Such a trial keeps processes only where the loop ran this much faster on
# them: a move costs memory that threads do not (the fork server and its
# workers' copies), and two sides of a second each, on threads alike, read
# further apart than TRIAL_GAIN on a busy machine (RESULTS.md, session 29);
# work that threads run one at a time gains many times this on processes.
LOADING_TRIAL_GAIN = 0.15
# A loop that waited for data less than this share of its time sets the
# pace: a trial tells whether worker threads slow it...
LOOP_BOUND_WAITED = 0.1
# ...and found the ready queue at least this full on average when it asked
# (the adaptive pool's own line between starving and not): batches pile up
# before a loop that sets the pace. One that never waits while the queue
# stays short is slowed itself, by worker threads handing the GIL around
# (32 threads sleeping a millisecond a sample, data alone: a short queue at
# its second batch, and a trial that chose processes slower than threads,
# benchmarks/RESULTS.md); the loop's GIL delay judges that.
LOOP_BOUND_OCCUPANCY = 0.5
# ...and keeps processes only if the loop ran this much faster on them.
TRIAL_GAIN = 0.03
# A threads side shorter than TRIAL_MIN_BATCHES (a loop that sets the pace
# moves after a step or two, see PACE_THREADS_MIN_BATCHES) is as noisy as a
# single step: processes, what torch runs, stay unless the loop ran this much
# slower on them (a lucky step on threads otherwise kept a loop on threads
# for good: benchmarks/RESULTS.md, session 24).
SHORT_SIDE_TOLERANCE = 0.15


class _Arm:
    """The loop's rate on one side of the trial: the intervals between the
    batches it received (and their samples, where given), the first `skip`
    of them left out."""

    def __init__(self, skip: int = 0) -> None:
        self.skip = skip
        self.intervals = 0
        self.seconds = 0.0
        self.samples = 0

    def add(self, interval: float, samples: int = 0) -> None:
        if self.skip > 0:
            self.skip -= 1
            return
        self.intervals += 1
        self.seconds += interval
        self.samples += samples

    @property
    def complete(self) -> bool:
        return self.measured_for(TRIAL_MIN_S)

    def measured_for(self, seconds: float, batches: int = TRIAL_MIN_BATCHES) -> bool:
        return self.intervals >= batches and self.seconds >= seconds

    @property
    def rate(self) -> float:
        return self.intervals / self.seconds if self.seconds > 0 else 0.0


def check_worker_method(worker_method: object) -> None:
    if worker_method not in WORKER_METHODS:
        raise ValueError(
            'worker_method option should be "auto", "thread" or "multiprocessing", '
            f"but got worker_method={worker_method!r}"
        )


def fresh_start_method(context: Any) -> str | None:
    """ "spawn" or "forkserver" where the loader's worker processes would, in
    torch, start from a fresh interpreter, never forked from the training
    process (whose CUDA context, say, they could not use): asked for with
    the loader's ``multiprocessing_context``, or, without one, set as
    multiprocessing's start method. (Not "forkserver" where it is Linux's
    default, from Python 3.14: a default is not asked for, and would keep
    auto from ever forking.)"""
    if context is None:
        import multiprocessing

        name = multiprocessing.get_start_method(allow_none=True)
        asked = ("spawn",) if sys.version_info >= (3, 14) else ("spawn", "forkserver")
        return name if name in asked else None
    name = start_method_of(context)
    return name if name in ("spawn", "forkserver") else None


def start_method_of(context: Any) -> str | None:
    """The start method of a loader's ``multiprocessing_context``, which its
    worker processes are started with in torch (None: none given)."""
    if context is None:
        return None
    return context if isinstance(context, str) else context.get_start_method()


def exec_server_wanted() -> bool:
    """``MINATO_FORK_SERVER=exec``: the fork server as a fresh interpreter."""
    return os.environ.get("MINATO_FORK_SERVER") == "exec"


# Whether processes auto decided on (in an earlier epoch, or for an earlier
# loader) are forked from the training process as each engine starts (see
# WorkerMethod.forks_at_start). Tests of the shared fork server's paths
# turn it off, to reach them without a move within an epoch.
DECIDED_PROCESSES_FORKED_AT_START = True


def gil_enabled() -> bool:
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


@dataclass
class _Window:
    started: float
    gil_wait: float
    busy: float
    samples: int
    # The workers' own CPU time in their tasks; None where the engine does
    # not report it.
    cpu: float | None
    # The loop's time waiting for batches, until the window started.
    waited: float = 0.0
    # Its waits for the workers' first batch, and the batches after the
    # first, until the window started.
    started_up: float = 0.0
    paced_batches: int = 0
    # This process's CPU time (all its threads) when the window started.
    process_cpu: float = 0.0
    # The loop's requests for a batch until then, and the sum of the ready
    # queue's occupancy each found.
    asks: int = 0
    occupancy_sum: float = 0.0
    # Its requests for new workers' first batch that found none ready.
    start_up_asks: int = 0
    # The process's threads' time runnable but waiting for a core (None
    # where the kernel does not tell).
    runnable_wait: float | None = None
    # The time the cores this process may run on had spent busy, whatever ran.
    cores_busy_time: float | None = None
    # Of `cpu` and `samples`, each worker thread's first task's (see
    # `_sample_work`).
    first_task_cpu: float = 0.0
    first_task_samples: int = 0

    def cores_used(self, elapsed: float) -> float:
        """The cores this process (all its threads) kept busy on average over
        the `elapsed` seconds since the window started."""
        return (time.process_time() - self.process_cpu) / elapsed


def _sample_work(figures: dict[str, float], window: _Window, cpu: float, samples: int) -> float:
    """The workers' CPU time a sample since `window` started (`cpu` over
    `samples`), their threads' first tasks left out where others ran: those
    carry one-off costs (a thread's first torch op, the process's first) that
    made samples well under MIN_SAMPLE_WORK_S read as over it across a first
    window of 16, and a loop that sets the pace moved them to processes
    (benchmarks/RESULTS.md, session 32)."""
    first_cpu = figures.get("first_task_cpu", 0.0) - window.first_task_cpu
    first_samples = int(figures.get("first_task_samples", 0)) - window.first_task_samples
    if samples > first_samples:
        return max(0.0, cpu - first_cpu) / (samples - first_samples)
    return cpu / samples


def _processes_gain_short(window: _Window, elapsed: float) -> str | None:
    """Why worker processes could not load faster than the threads did since
    `window` started by a loading trial's gain, or None where they might (or
    it is not known): they would load on no more cores than other processes
    leave this one, against those its threads used. (Not from the time the
    workers' own clocks spent off a CPU: on a GPU machine's 16 cores, PIL
    threads on a CPU most of their task time loaded far slower than
    processes.)"""
    now = _cores_busy_time()
    if now is None or window.cores_busy_time is None or elapsed <= 0:
        return None
    own = window.cores_used(elapsed)
    others = max(0.0, (now - window.cores_busy_time) / elapsed - own)
    left = max(0.0, _cores() - others)
    if own <= 0 or left >= own * (1 + LOADING_TRIAL_GAIN):
        return None
    return (
        f"processes could load at most {left / own:.2f}x as fast (other processes left "
        f"this one {left:.1f} of the {_cores()} cores and its threads used {own:.1f})"
    )


def _waiting_for_a_core(window: _Window, elapsed: float) -> float | None:
    """The mean count of this process's threads that were runnable but
    without a core since `window` started (threads that ended since are
    left out)."""
    now = _runnable_wait()
    if now is None or window.runnable_wait is None or elapsed <= 0:
        return None
    return max(0.0, now - window.runnable_wait) / elapsed


def _asked(figures: dict[str, float]) -> tuple[int, float]:
    """The loop's requests for a batch so far, and the sum of the ready
    queue's occupancy each found (from the engine's mean)."""
    asks = int(figures.get("queue_asks", 0))
    return asks, (figures.get("queue_occupancy") or 0.0) * asks


# Every live loader's method (see WorkerMethod.any_may_use_processes).
_methods: weakref.WeakSet[WorkerMethod] = weakref.WeakSet()

# What auto decided for good, by the dataset's type: a later loader over a
# dataset of that type (an evaluation loader, one re-created each epoch, a
# Lightning re-instantiation) starts from it instead of from a thread phase.
# Each entry: whether processes, why, and whether a trial measured the loop
# on both (its verdict holds; a choice without one, or a trial that only
# asked whether processes load faster for a loop that waited for data, is
# judged again by a later loader whose loop sets the pace).
_decided_for: weakref.WeakKeyDictionary[type, tuple[bool, str, bool]] = weakref.WeakKeyDictionary()


class WorkerMethod:
    """A loader's worker method: the one in use, why, and (auto) the
    measurements that decide it. Lives as long as the loader: a decision
    holds for its later epochs, and for later loaders over a dataset of
    the same type (`kind`) in this process."""

    def __init__(self, requested: str, kind: type | None = None, fresh: str | None = None) -> None:
        self.requested = requested
        # The start method ("spawn", "forkserver") the loader asks its worker
        # processes to start by, from a fresh interpreter (see
        # `fresh_start_method`); None: forked, as torch's by default.
        self.fresh = fresh
        # What worker threads read before each task: whether to hand it to
        # their process. Auto sets it once the fork server is up (activate).
        self.processes = requested == "multiprocessing"
        self.wants_processes = self.processes
        self.decided = requested != "auto"
        self.reason = {
            "thread": 'worker_method="thread"',
            "multiprocessing": 'worker_method="multiprocessing"',
            "auto": "auto: threads until the measurements decide",
        }[requested]
        self._kind = kind
        # Decided for an earlier loader: processes at once, without a trial.
        self._inherited = False
        # Threads decided for an earlier loader: this one keeps them unless
        # its own training loop shows what that loader's did not (it sets the
        # pace, or waits to take the GIL back), and a trial shows a gain.
        self._threads_inherited = False
        self._inherited_why = ""
        if requested == "auto" and not gil_enabled():
            self.decided = True
            self.reason = "auto: free-threaded Python, threads run in parallel"
        elif requested == "auto" and fresh is not None:
            # Its processes would be forked: what the loader asked them not to be.
            self.decided = True
            self.reason = (
                f"auto: threads, as the loader asks for worker processes started by "
                f"{fresh!r} (a fresh interpreter) and auto's are forked"
            )
        elif requested == "auto" and kind is not None and kind in _decided_for:
            wants_processes, why, tried = _decided_for[kind]
            self._inherited_why = why
            self.reason = f"{why}; decided for an earlier loader of {kind.__name__}"
            if wants_processes:
                self.decided = self._inherited = self.wants_processes = True
            elif tried:
                # A trial already found threads faster for a loop that set
                # the pace: another would cost this loader a second or more
                # on processes (an evaluation loader re-created each time).
                self.decided = True
            else:
                self._threads_inherited = True
        self._window: _Window | None = None
        # The time and samples the current window was observed over, and
        # those of the earlier windows this loader stayed undecided through
        # (epochs on workers of their own, each shorter than DECIDE_AFTER_S):
        # the rules that keep threads once the signs stayed low for long
        # enough count them all, or a loader of short epochs would never
        # decide (its fork server kept, its epochs never handed to whole
        # batches).
        self._seen: tuple[float, int] = (0.0, 0)
        self._seen_before: tuple[float, int] = (0.0, 0)
        # When the first workers started, and the batches the loop received
        # since, for how soon auto chose (`decided_after`).
        self._first_started: float | None = None
        self._batches_received = 0
        # Seconds and the loop's batches from the first workers' start to
        # auto's choice (its first decision, then a trial's verdict); (0, 0)
        # where it was decided before any worker started (an earlier loader
        # of the dataset's type); None until auto chose, or for a method given.
        self.decided_after: tuple[float, int] | None = None
        if requested == "auto" and (self.decided or self._threads_inherited):
            self.decided_after = (0.0, 0)
        # Back on threads after a trial: the fork server goes once the
        # trial's worker processes have exited (minato._loader.iterator).
        self.left_processes = False
        # Set once an engine's processes were forked from this process as it
        # started (see forks_at_start): the shared fork server is not this
        # loader's any more.
        self.forked_since = False
        _methods.add(self)
        self._worth_probing = False
        self._probe_total = 0.0
        self._probes = 0
        self._next_probe = 0.0
        # When the no-spare-core rule may next read the threads' run-queue
        # waits (a file per thread: a fraction of a millisecond with dozens).
        self._next_core_check = 0.0
        # Every probe taken, for stats().
        self.probe_total = 0.0
        self.probes = 0
        # The trial (auto): the loop's rate on threads, then on processes.
        self._last_batch: float | None = None
        self._on_threads = _Arm()
        self._on_processes: _Arm | None = None
        self._heuristic = ""
        # The loop's time waiting for batches, and whether the trial under
        # way must show a gain (see LOOP_BOUND_WAITED).
        self._waited = 0.0
        # The waits for the first batch from new workers: their start-up, not
        # the loop's pace (left out of the share of its time it waits)...
        self._start_up = 0.0
        # ...and the requests that waited so (an empty queue by construction,
        # left out of the occupancy the loop found: with one worker it made
        # the mean at the second batch half of what that batch found).
        self._start_up_asks = 0
        # The batches after those first ones, which show the loop's pace.
        self._paced_batches = 0
        # The latest of those waits (see shows_pace in `observe`).
        self._first_wait = 0.0
        self._gain_wanted = False
        # Whether the trial asks only whether processes load faster (workers
        # that compute, the loop waiting for data): threads it keeps do not
        # say whether they would slow a loop that sets the pace.
        self._loading_trial = False
        # Whether the trial times threads from its decision on (see
        # LOADING_TRIAL_SKIP), wanting LOADING_TRIAL_GAIN.
        self._threads_from_decision = False
        # Whether the trial's thread side is short though a gain is wanted
        # (see _judge_loop).
        self._short_threads_side = False
        # The samples a second the threads loaded over the window that
        # decided on a trial (see _threads_rate).
        self._threads_loaded: float | None = None
        # The samples of the latest batch received (0: none counted).
        self._batch_samples = 0

    @staticmethod
    def any_may_use_processes() -> bool:
        """Whether a live loader's workers may still run in processes forked
        from this process's fork server."""
        return any(method.uses_fork_server for method in list(_methods))

    @property
    def uses_fork_server(self) -> bool:
        """Whether this loader's workers may run in processes forked from this
        process's fork server (not from a fresh interpreter of their own, nor
        from this process as its engines start)."""
        return self.may_use_processes and self.fresh is None and not self.forked_since

    @property
    def forks_at_start(self) -> bool:
        """Whether this loader's worker processes are forked from this
        process as each engine starts, as torch forks its workers at
        ``iter()``, not from the shared fork server: forced, or processes
        decided by auto (in an earlier epoch, or for an earlier loader), so
        that they see this process's state as the epoch starts (its
        environment, module globals), as torch's do. Auto's move within an
        epoch takes its processes from the shared server."""
        decided = self.requested == "multiprocessing" or (
            DECIDED_PROCESSES_FORKED_AT_START and self.decided and self.wants_processes
        )
        return decided and self.fresh is None and not exec_server_wanted()

    @property
    def may_use_processes(self) -> bool:
        """Whether this loader's workers may run in processes: asked for,
        or auto not yet decided for threads."""
        return self.wants_processes or not self.decided

    @property
    def name(self) -> str:
        """torch's name for the method in use."""
        return "multiprocessing" if self.processes else "thread"

    def restart_window(self, figures: dict[str, float] | None = None) -> None:
        """Measurements start over (new workers: their start-up is not evidence)."""
        if not self.decided:
            (before, samples_before), (seen, samples) = self._seen_before, self._seen
            self._seen_before = (before + seen, samples_before + samples)
        self._seen = (0.0, 0)
        self._window = None if figures is None else self._window_of(figures)
        self._probe_total, self._probes = 0.0, 0
        self._last_batch = None  # no interval spans two epochs

    @property
    def on_trial(self) -> bool:
        """On processes, the trial not yet judged."""
        return self._on_processes is not None

    def batch_received(self, now: float, waited: float = 0.0, samples: int = 0) -> str | None:
        """The loop received a batch of `samples` (0: not counted), after
        waiting `waited` seconds for it: its rate is measured for the trial.
        Returns ``"revert"`` when the trial finds processes slower than
        threads (the loader goes back to threads for good), else None."""
        last, self._last_batch = self._last_batch, now
        self._batches_received += 1
        if samples > 0:
            self._batch_samples = samples
        if last is None:
            self._start_up += waited
            self._first_wait = waited
            self._start_up_asks += int(waited > 0)
        else:
            self._waited += waited
            self._paced_batches += 1
        if last is None or self.requested != "auto":
            return None
        if not self.processes:
            if not self._on_threads.complete:
                self._on_threads.add(now - last, samples)
            return None
        trial = self._on_processes
        if trial is None:
            return None
        trial.add(now - last)
        if not trial.complete:
            return None
        self._on_processes = None
        (threads, on_threads), processes = self._threads_rate(), trial.rate
        if self._on_threads.intervals < TRIAL_MIN_BATCHES:
            margin = -SHORT_SIDE_TOLERANCE
        elif self._threads_from_decision:
            margin = LOADING_TRIAL_GAIN
        elif self._gain_wanted:
            margin = TRIAL_GAIN
        else:
            margin = -TRIAL_TOLERANCE
        if processes >= threads * (1 + margin):
            self.reason = (
                f"auto: worker processes, the training loop ran {processes:.1f} batches/s "
                f"on them against {threads:.1f} {on_threads} ({self._heuristic})"
            )
            self._announce("keeping worker processes")
            self._remember(tried=True)
            return None
        self._back_to_threads(
            f"auto: threads, the training loop ran {threads:.1f} batches/s on them "
            f"against {processes:.1f} on processes ({self._heuristic})"
        )
        return "revert"

    def _threads_rate(self) -> tuple[float, str]:
        """The loop's rate on threads, at most what their pool loaded while
        undecided, and which it was. Batches the threads had loaded before
        the loop asked for them (at start-up, with the loop waiting for data)
        arrive at once: a side of two such batches read as a loop faster
        than threads can feed. Not for a loop that sets the pace: its steps
        are the rate; nor for a trial that asks only whether processes load
        faster, nor for one beside more threads at work than cores: its
        threads side, a second long, starts at its decision (see
        LOADING_TRIAL_SKIP)."""
        arm, loaded = self._on_threads, self._threads_loaded
        if self._short_threads_side or self._threads_from_decision or loaded is None:
            return arm.rate, "on threads"
        # A clear sign moves before the loop received two batches on threads
        # (see ready_for_processes): then what they loaded is their side.
        per_batch = arm.samples / arm.intervals if arm.samples > 0 else self._batch_samples
        if per_batch <= 0:
            return arm.rate, "on threads"
        fed = loaded / per_batch
        if arm.intervals == 0 or fed < arm.rate:
            return fed, "as threads loaded them"
        return arm.rate, "on threads"

    def _back_to_threads(self, reason: str) -> None:
        """The trial found processes slower: threads for good, and the fork
        server to go once the trial's processes have exited."""
        self.processes = self.wants_processes = False
        self.left_processes = True
        self.reason = reason
        self._announce("back to worker threads")
        self._remember(tried=not self._loading_trial)

    def _remember(self, tried: bool = False) -> None:
        if self._kind is not None and not self._inherited:
            _decided_for[self._kind] = (self.wants_processes, self.reason, tried)

    def ready_for_processes(self) -> bool:
        """Auto moves once the loop's rate on threads is measured (sooner
        after a clear sign, see CLEAR_THREADS_MIN_S). A loader after an
        earlier loader's decision starts on processes, never asks (see
        `decided_before`)."""
        if self.requested != "auto" or self._on_threads.complete:
            return True
        if self.threads_serialised and self._threads_loaded is not None:
            # Their side is what they loaded while undecided (see _threads_rate).
            return True
        clear = self.wants_processes and (not self._gain_wanted or self._short_threads_side)
        batches = (
            PACE_THREADS_MIN_BATCHES if self._short_threads_side else CLEAR_THREADS_MIN_BATCHES
        )
        return clear and self._on_threads.measured_for(CLEAR_THREADS_MIN_S, batches)

    @property
    def decided_before(self) -> bool:
        """Processes decided for an earlier loader of the dataset's type: this
        loader's workers start on them, as forced ones do (no thread phase,
        no trial)."""
        return self._inherited

    @property
    def threads_serialised(self) -> bool:
        """Whether this loader decided on processes on a sign that the GIL
        runs its worker threads one at a time (no trial wanting a gain; not
        an earlier loader's decision). Such threads load little while their
        processes start, and slow the starts (each socket call of a start
        waits a switch interval for the GIL they hold): a worker starts its
        process in its next task, and the move waits for no batch more on
        threads."""
        return self.wants_processes and not self._gain_wanted and not self._inherited

    def move_wait(self) -> float:
        """How long the training thread may wait for the workers to move at
        once (see MOVE_WAIT_S): for a loop that sets the pace, and after a
        sign that the GIL runs the threads one at a time."""
        threads = self._on_threads
        if self.wants_processes and self._short_threads_side and threads.intervals:
            return min(MOVE_WAIT_S, threads.seconds / threads.intervals)
        if self.threads_serialised and self._threads_loaded and self._batch_samples:
            # About what the loop would wait for the threads' next batch.
            return min(MOVE_WAIT_S, self._batch_samples / self._threads_loaded)
        return 0.0

    def _window_of(self, figures: dict[str, float]) -> _Window:
        """A window starting now, from the engine's `figures` and the loop's
        waits so far."""
        started = time.perf_counter()
        if self._first_started is None:
            self._first_started = started
        return _Window(
            started,
            figures["gil_wait"],
            figures["busy"],
            int(figures["samples_loaded"]),
            figures.get("cpu"),
            self._waited,
            self._start_up,
            self._paced_batches,
            time.process_time(),
            *_asked(figures),
            self._start_up_asks,
            _runnable_wait(),
            _cores_busy_time(),
            figures.get("first_task_cpu", 0.0),
            int(figures.get("first_task_samples", 0)),
        )

    def wants_probe(self, now: float) -> bool:
        """Probes cost the loop a GIL re-take each: only while undecided, and
        only once samples are worth a process (see MIN_SAMPLE_WORK_S)."""
        return not self.decided and self._worth_probing and now >= self._next_probe

    def probe(self) -> None:
        """Measures, on the training loop's thread, how long taking the GIL
        back after releasing it takes (``time.sleep(0)`` releases it): the
        time it was blocked, not the time it was runnable waiting for a core
        (a machine whose cores are taken delays any thread, a process too)."""
        queued = _thread_runnable_wait()
        started = time.perf_counter()
        time.sleep(0)
        now = time.perf_counter()
        queued_after = _thread_runnable_wait()
        delay = now - started
        if queued is not None and queued_after is not None:
            delay = max(0.0, delay - (queued_after - queued))
        self._next_probe = now + PROBE_INTERVAL_S
        self._probe_total += delay
        self._probes += 1
        self.probe_total += delay
        self.probes += 1

    def observe(self, figures: dict[str, float], can_trial: bool = True) -> str | None:
        """Judges the live engine's figures: ``"move"`` when the loader should
        move to processes now, ``"warm"`` when the first signs point there
        (the fork server should start: it takes about a second), else None.
        Without `can_trial` (the workers cannot go back to threads once
        moved), a loop-bound loader keeps threads."""
        if self.decided:
            return None
        window = self._window
        if window is None:
            self._window = self._window_of(figures)
            return None
        now = time.perf_counter()
        elapsed = now - window.started
        paced_for = elapsed - (self._start_up - window.started_up)
        waited_share = (self._waited - window.waited) / paced_for if paced_for > 0 else 1.0
        # Not before the loop has shown its pace: a batch after the first.
        paced = self._paced_batches > window.paced_batches
        asks, occupancy_sum = _asked(figures)
        asks -= window.asks + self._start_up_asks - window.start_up_asks
        occupancy = (occupancy_sum - window.occupancy_sum) / asks if asks > 0 else None
        ahead = occupancy is None or occupancy >= LOOP_BOUND_OCCUPANCY
        loop_bound = can_trial and paced and waited_share < LOOP_BOUND_WAITED and ahead
        samples = int(figures["samples_loaded"]) - window.samples
        self._seen = (elapsed, samples)
        # Observed undecided in all, over this window and the earlier ones.
        seen_for = self._seen_before[0] + elapsed
        seen_samples = self._seen_before[1] + samples
        busy = figures["busy"] - window.busy
        gil_wait = figures["gil_wait"] - window.gil_wait
        share = gil_wait / busy if busy > 0 else 0.0
        delay = self._probe_total / self._probes if self._probes else 0.0
        cpu = None if window.cpu is None else figures["cpu"] - window.cpu
        # What a sample costs to run (see MIN_SAMPLE_WORK_S), and the share of
        # the workers' time on a CPU (COMPUTE_SHARE).
        if cpu is not None and samples > 0:
            work, what = _sample_work(figures, window, cpu, samples), "of CPU"
        else:
            work, what = figures.get("fetch_p50"), ""
        working = busy - gil_wait
        # (The clocks are read at slightly different points: at most 1.)
        compute = min(1.0, cpu / working) if cpu is not None and working > 0 else 0.0
        waiting = cpu is not None and compute < WAITING_SHARE and not loop_bound
        # The loop's GIL delay as evidence (see WAITING_SHARE).
        judged = 0.0 if waiting else delay
        worth_a_process = work is not None and work >= MIN_SAMPLE_WORK_S
        self._worth_probing = worth_a_process
        if not worth_a_process:
            timed_enough = seen_for >= MIN_WINDOW_S and seen_samples >= DECIDE_AFTER_SAMPLES
            if work is not None and (seen_for >= DECIDE_AFTER_S or timed_enough):
                self._decide(
                    False,
                    f"auto: samples take {work * 1e6:.0f} us{' ' + what if what else ''}, "
                    "too little for a worker process's round trip to pay",
                )
            return None
        # A loop's steps show it sets the pace, before MIN_WINDOW_S and
        # whatever the queue held (a thread beside it loads slower too), where
        # they took longer on average than its wait for the workers' first
        # batch (their start-up and a batch's loading: more than they need
        # for a batch after) and it waited for data under LOOP_BOUND_WAITED
        # of its time since.
        steps = self._paced_batches - window.paced_batches
        step = (paced_for - (self._waited - window.waited)) / steps if steps else 0.0
        # (Not beside more threads at work than cores: see PACE_MAX_PARALLEL.)
        crowded = busy > PACE_MAX_PARALLEL * _cores() * elapsed
        shows_pace = (
            can_trial
            and waited_share < LOOP_BOUND_WAITED
            and samples >= MIN_SAMPLES
            and step >= self._first_wait > 0
            and not crowded
        )
        if self._threads_inherited:
            return self._judge_loop(
                elapsed,
                samples,
                seen_for,
                loop_bound,
                judged,
                can_trial,
                shows_pace,
                crowded,
                window,
            )
        if elapsed >= CLEAR_WINDOW_S and samples >= MIN_SAMPLES:
            if share >= CLEAR_GIL_SHARE:
                return self._decide(
                    True,
                    f"auto: worker threads waited for the GIL {share:.0%} of their fetch time",
                )
            serial = self._serialised(
                busy / elapsed,
                cpu / elapsed if cpu is not None else None,
                share,
                lambda: _waiting_for_a_core(window, elapsed),
            )
            if serial is not None:
                return self._decide(True, serial)
        if shows_pace:
            return self._try_for_the_loop(
                f"the training loop sets the pace (its steps took {step * 1e3:.0f} ms, "
                f"longer than its wait for the first batch, {self._first_wait * 1e3:.0f} ms, "
                f"and it waited for data {waited_share:.0%} of its time since), "
                "and worker threads may slow it"
            )
        if elapsed < MIN_WINDOW_S or samples < MIN_SAMPLES:
            leaning = share >= GIL_BOUND_SHARE / 2 or (
                self._probes >= 2 and judged >= LOOP_DELAY_TRIAL_S
            )
            return "warm" if leaning or loop_bound else None
        # The workers' own GIL wait needs no probes (one per batch at most:
        # slow to gather where batches are slow, which is where it matters).
        if share >= GIL_BOUND_SHARE:
            return self._decide(
                True,
                f"auto: worker threads waited for the GIL {share:.0%} of their fetch time",
            )
        cores_busy = window.cores_used(elapsed) / _cores()
        if not loop_bound and cores_busy >= CORES_BUSY:
            return self._decide(
                False,
                f"auto: the process keeps {cores_busy:.0%} of the cores busy on threads "
                "while the training loop waits for data: processes would not load faster",
            )
        if not loop_bound and share < GIL_BOUND_SHARE and now >= self._next_core_check:
            self._next_core_check = now + CORE_CHECK_INTERVAL_S
            queued = _waiting_for_a_core(window, elapsed)
            if queued is not None and queued >= NO_SPARE_CORE_RUNNABLE:
                return self._decide(
                    False,
                    f"auto: the process's threads waited for a core ({queued:.1f} of them "
                    "on average) while the training loop waits for data: no core is spare "
                    "for processes to load faster on",
                )
        if loop_bound:
            return self._try_for_the_loop(
                f"the training loop sets the pace (it waited for data {waited_share:.0%} "
                "of its time), and worker threads may slow it",
                crowded,
            )
        # A few probes suffice when the delay is far past the bound.
        clear = self._probes >= 2 and judged >= CLEAR_DELAY_FACTOR * LOOP_DELAY_BOUND_S
        if self._probes < MIN_PROBES and not clear:
            leaning = self._probes >= 2 and judged >= LOOP_DELAY_TRIAL_S
            return "warm" if leaning or loop_bound else None
        if judged >= LOOP_DELAY_BOUND_S:
            why = (
                f"auto: the training loop waited {delay * 1e3:.1f} ms on average to take "
                "the GIL back from worker threads"
            )
            parallel = cpu is not None and cpu / elapsed > SERIAL_CORES[1]
            if not loop_bound and can_trial and parallel:
                # A loop that waits for data loses to the delay only time it
                # would have waited: where the workers compute together on
                # more than a core (the GIL does not run them one at a time),
                # whether processes load faster decides, as for workers that
                # compute. Workers on a core or less may be what the GIL
                # serialises: they move at once.
                return self._try_loading(why, window, elapsed)
            return self._decide(True, why)
        # Computing workers: a trial on processes, kept only where the loop
        # (data-bound: the loader) runs faster on them. After the GIL's clear
        # signs, which move sooner (their trial measures threads for less).
        if compute >= COMPUTE_SHARE and can_trial:
            return self._try_loading(
                f"auto: the workers compute ({compute:.0%} of their fetch time on a CPU, "
                f"{work * 1e3:.1f} ms a sample), and processes may run them faster",
                window,
                elapsed,
            )
        borderline = can_trial and judged >= LOOP_DELAY_TRIAL_S
        if seen_for < DECIDE_AFTER_S:
            return "warm" if borderline else None
        if borderline:
            self._gain_wanted = True
            return self._decide(
                True,
                f"auto: the training loop waited {delay * 1e3:.2f} ms on average to take "
                "the GIL back, and worker threads may slow it",
            )
        self._decide(
            False,
            f"auto: the work releases the GIL (workers' GIL wait {share:.0%}, "
            f"loop's GIL delay {delay * 1e3:.2f} ms"
            + (f", workers on a CPU {compute:.0%} of their time" if waiting else "")
            + ")",
        )
        return None

    @staticmethod
    def _serialised(
        parallel: float,
        cores: float | None,
        gil_share: float,
        waiting_for_a_core: Callable[[], float | None],
    ) -> str | None:
        """Why the workers run one at a time (see SERIAL_CORES), or None.
        `waiting_for_a_core` gives the mean count of the process's threads
        runnable without a core over the window (read only when needed)."""
        if cores is None or parallel < SERIAL_PARALLEL:
            return None
        many = parallel >= SERIAL_MANY
        if many and gil_share < min(SERIAL_GIL_SHARE_CAP, SERIAL_GIL_SHARE_PER_THREAD * parallel):
            return None
        low, high = SERIAL_CORES
        spare = min(parallel, _cores())
        if not low <= cores <= high or spare < SERIAL_SPARE * cores:
            return None
        runnable = waiting_for_a_core()
        if runnable is not None and runnable >= SERIAL_RUNNABLE_SHARE * (parallel - cores):
            return None
        return (
            f"auto: {parallel:.1f} worker threads at work at once used {cores:.2f} cores "
            "together"
            + (
                f" and waited for the GIL {gil_share:.0%} of their fetch time to enter a task"
                if many
                else ""
            )
            + ": the dataset's Python holds the GIL and runs them one at a time"
        )

    def _judge_loop(
        self,
        elapsed: float,
        samples: int,
        seen_for: float,
        loop_bound: bool,
        judged: float,
        can_trial: bool,
        shows_pace: bool,
        crowded: bool,
        window: _Window,
    ) -> str | None:
        """With threads decided for an earlier loader: only this loop's own
        signs count, and a trial must show processes faster."""
        kept = "where an earlier loader of this dataset kept threads"
        if shows_pace:
            return self._try_for_the_loop(f"the training loop sets the pace, {kept}")
        if elapsed < MIN_WINDOW_S or samples < MIN_SAMPLES:
            return "warm" if loop_bound else None
        delayed = self._probes >= MIN_PROBES and judged >= LOOP_DELAY_TRIAL_S
        if loop_bound:
            return self._try_for_the_loop(f"the training loop sets the pace, {kept}", crowded)
        if can_trial and delayed:
            # A loop that waits for data (one that sets the pace is tried
            # above): as for this loader's own first decision.
            return self._try_loading(
                f"auto: the training loop waited {judged * 1e3:.2f} ms on average to take "
                f"the GIL back, {kept}",
                window,
                elapsed,
            )
        if seen_for >= DECIDE_AFTER_S:
            # Threads as the earlier loader chose, from the start.
            reason, soon = self.reason, self.decided_after
            self._decide(False, self._inherited_why)
            self.reason, self.decided_after = reason, soon
        return None

    def _try_loading(self, why: str, window: _Window, elapsed: float) -> str | None:
        """A trial asking only whether processes load faster (the loop waits
        for data), unless what the threads did shows they cannot by the gain
        it wants (LOADING_TRIAL_GAIN): then threads stay without one, sparing
        the move's memory and start-up."""
        short = _processes_gain_short(window, elapsed)
        if short is not None:
            return self._decide(False, f"auto: {short} while the training loop waits for data")
        self._gain_wanted = self._loading_trial = self._threads_from_decision = True
        return self._decide(True, why)

    def _try_for_the_loop(self, why: str, crowded: bool = False) -> str | None:
        """A trial on processes for a training loop that sets the pace, kept
        only if the loop gains on them. Its steps on threads with every batch
        so far are the threads' side: a second more of them, slowed by the
        threads wherever they slow it, would be all of a short epoch. Not
        where more worker threads were at work than cores (`crowded`): those
        steps ran beside the threads' start-up, and threads are timed from
        the decision on (see LOADING_TRIAL_SKIP)."""
        self._gain_wanted = True
        if crowded:
            self._threads_from_decision = True
        else:
            self._short_threads_side = True
        return self._decide(True, f"auto: {why}")

    def _decide(self, processes: bool, reason: str) -> str | None:
        self.decided = True
        seen_for, seen_samples = self._seen
        if processes and seen_for > 0 and seen_samples > 0:
            self._threads_loaded = seen_samples / seen_for
        if processes and self._threads_from_decision:
            self._on_threads = _Arm(skip=LOADING_TRIAL_SKIP)
        self._threads_inherited = False
        self.wants_processes = processes
        self.reason = reason
        if processes:
            self._heuristic = reason.removeprefix("auto: ")
            self.reason = f"auto: trying worker processes, as {self._heuristic}"
        self._announce("trying worker processes" if processes else "keeping worker threads")
        if not processes:
            self._remember()
        return "move" if processes else None

    def _announce(self, what: str) -> None:
        """Auto chose now (`what`, for the reason set): keeps how soon for
        stats(), and logs both."""
        started = self._first_started
        seconds = 0.0 if started is None else time.perf_counter() - started
        self.decided_after = (seconds, self._batches_received)
        logger.info(
            "minato: %s (%s), %.2f s after the workers started, at batch %d",
            what,
            self.reason,
            seconds,
            self._batches_received,
        )

    def activate(self, batches_in_flight: int = 0, trial: bool = True) -> None:
        """Workers hand their next tasks to processes. With `trial` (auto),
        the loop's rate on them is measured from the batch after the
        `batches_in_flight` that threads had loaded (those arrive at once)."""
        self.processes = True
        if self.requested == "auto" and trial and not self._inherited:
            self._on_processes = _Arm(skip=batches_in_flight + 1)

    def cannot_use_processes(self, why: str) -> None:
        """Processes cannot run this loader (auto only): threads for good."""
        self.decided = True
        self.processes = self.wants_processes = False
        self.reason = f"auto: threads, as {why}"
        self._announce("keeping worker threads")

    @property
    def loop_gil_delay(self) -> float | None:
        return self.probe_total / self.probes if self.probes else None
