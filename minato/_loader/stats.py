"""Where a loader's time goes: LoaderStats, and the recorder behind it."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from minato._util.fork import ForkSafeLock
from minato._util.log import logger

if TYPE_CHECKING:
    from minato._task.failures import SampleFailure

# The hint that the dataset holds the GIL is given when workers spent more
# than this share of their fetch time waiting for it...
GIL_BOUND_SHARE = 0.5
# ...and either waited at least this long in all (a share of microseconds
# is no sign)...
GIL_HINT_MIN_WAIT_S = 1.0
# ...or the training loop waited for data at least this share of its time...
GIL_HINT_MIN_STARVED_SHARE = 0.1
# ...and only once enough was loaded to judge.
GIL_HINT_MIN_SAMPLES = 100
# Skipped samples' records kept for stats(): the most recent ones (the count is exact).
MAX_FAILURES_KEPT = 10_000
# Engine figures that add up over the engines a loader has run.
_SUMMED = ("gil_wait", "busy", "cpu", "slow_samples", "moved_samples")


class PoolResize(NamedTuple):
    """One change the adaptive controller made to the worker count, and the
    window of measurements that decided it."""

    at: float
    """Seconds since the loader's first iterator started."""
    workers: int
    """The count it changed to."""
    reason: str
    """Why, in words: a growth step while the loop starved, a step taken
    back that did not pay, one worker fewer while the ready queue stayed
    full, ..."""
    samples_per_s: float
    """Samples the workers finished per second over the window."""
    queue_occupancy: float | None
    """The ready queue's mean occupancy when the loop asked (0: it waited)."""
    on_cpu: float | None
    """The share of the workers' task time they spent on a CPU."""
    process_cpu: float | None
    """The process's CPU use, as a share of its cores."""
    loop_step: float | None
    """The training loop's mean step between batches, in seconds."""

    def __str__(self) -> str:
        return (
            f"{self.workers}@{self.at:.2f}s: {self.reason} "
            f"({self.samples_per_s:.0f} samples/s, queue {_share(self.queue_occupancy)}, "
            f"workers on a CPU {_share(self.on_cpu)}, process CPU {_share(self.process_cpu)})"
        )


@dataclass(frozen=True)
class LoaderStats:
    """A loader's figures since it was created, over all its epochs.

    ``print(loader.stats())`` shows them as a table. Times are in seconds.
    """

    samples: int = 0
    """Samples delivered to the training loop (the sum of the batch sizes)."""
    batches: int = 0
    """Batches delivered to the training loop."""
    slow_samples: int = 0
    """Samples that ran past the per-sample timeout and were flagged slow."""
    moved_samples: int = 0
    """Samples that left their batch for a later one, late (where batches
    keep the sampler's order: ``in_order=None``): an epoch in which one
    moved is not the one a run with the same seed computes otherwise."""
    skipped_samples: int = 0
    """Samples left out because loading them raised (``on_error="skip"``)."""
    failures: tuple[SampleFailure, ...] = ()
    """The skipped samples (index, worker, exception type and message), in
    the order reported; the most recent 10,000."""
    sample_timeout: float | None = None
    """The per-sample timeout now; None while warming up, when off, or for
    batch-level loading."""
    workers: int = 0
    """Worker threads running now (replacements for slow samples included);
    0 when loading in the calling thread. ``loader.num_workers`` keeps the
    value the loader was created with."""
    worker_history: tuple[tuple[float, int], ...] = ()
    """(seconds since the loader's first iterator started, worker count) at
    each start of workers and each change the adaptive controller made."""
    resizes: tuple[PoolResize, ...] = ()
    """The adaptive controller's changes of the worker count, each with why
    and the measurements that decided it (the most recent 4,096 per
    engine)."""
    fetch_p50: float | None = None
    """Median time a worker spent on one sample (recent samples), not counting
    its wait to take the GIL (``gil_wait``)."""
    fetch_p90: float | None = None
    fetch_p99: float | None = None
    gil_wait: float = 0.0
    """Total time worker threads waited to take the GIL before running the
    dataset's code (measured in Rust)."""
    fetch_time: float = 0.0
    """Total time worker threads spent loading (GIL waits included)."""
    worker_cpu: float = 0.0
    """Total CPU time worker threads used while loading, by their own clocks
    (a thread that hands its sample to a worker process only waits)."""
    starved: float = 0.0
    """Total time the training loop waited inside ``__next__`` for a batch."""
    queue_occupancy: float | None = None
    """Mean share of the prefetch bound that was loaded and waiting when the
    training loop asked for a batch: near 0, the loop waits for data; near 1,
    data is ahead of the loop."""
    elapsed: float = 0.0
    """Seconds since the loader's first iterator started."""
    worker_method: str | None = None
    """How workers run now: ``"thread"`` or ``"multiprocessing"`` (torch's
    ``WorkerInfo.worker_method`` values); None without workers."""
    worker_method_reason: str | None = None
    """Why: the option given, or what the automatic choice measured."""
    worker_method_decided_after: float | None = None
    """How soon ``worker_method="auto"`` chose: seconds from its first
    workers' start to its choice (its first decision, then, where it tried
    processes, the trial's verdict); 0.0 where it was decided before any
    worker started (for an earlier loader over a dataset of the same type).
    None while auto has not chosen, and for a method given."""
    worker_method_decided_at_batch: int | None = None
    """The batches the training loop had received when auto chose (see
    ``worker_method_decided_after``)."""
    loop_step: float | None = None
    """Mean time the training loop spent between receiving a batch and asking
    for the next (its own work: the step); worker threads that share its GIL
    lengthen it, and the adaptive pool takes back a worker that slows it
    by more than 10% (and 0.5 ms) unless the loop's waits for data shrank
    by more. None before a second batch."""
    loop_gil_delay: float | None = None
    """Mean time the training loop's thread waited to take the GIL back
    after releasing it, as probed by ``worker_method="auto"`` while deciding;
    None when not probed."""
    whole_batches_reason: str | None = None
    """Why a reordering loader's epochs load whole batches (an epoch of single
    samples moved none), or went back to single samples (a batch, or an
    epoch of them, kept the loop waiting longer); None while it has not
    chosen."""

    @property
    def rate(self) -> float:
        """Samples delivered per second since the first iterator started."""
        return self.samples / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def gil_share(self) -> float | None:
        """The share of fetch time spent waiting for the GIL."""
        return self.gil_wait / self.fetch_time if self.fetch_time > 0 else None

    @property
    def compute_share(self) -> float | None:
        """The share of fetch time, GIL waits left out, that worker threads
        spent on a CPU: near 1 for work that computes, near 0 for work that
        waits (I/O)."""
        working = self.fetch_time - self.gil_wait
        return self.worker_cpu / working if working > 0 else None

    def summary(self) -> str:
        """One line, as ``log_interval`` logs it."""
        return (
            f"minato: {self.batches} batches, {self.samples} samples ({self.rate:.0f}/s), "
            f"{self.workers} workers, starved {self.starved:.2f}s, "
            f"fetch p50 {_ms(self.fetch_p50)}, gil wait {self.gil_wait:.2f}s, "
            f"slow {self.slow_samples}, moved {self.moved_samples}, "
            f"skipped {self.skipped_samples}, "
            f"ready queue {_share(self.queue_occupancy)}"
        )

    def __str__(self) -> str:
        changes = ", ".join(f"{count}@{at:.2f}s" for at, count in self.worker_history[-8:])
        fetch = (self.fetch_p50, self.fetch_p90, self.fetch_p99)
        rows = [
            ("samples", f"{self.samples} ({self.rate:.1f}/s over {self.elapsed:.2f}s)"),
            ("batches", str(self.batches)),
            ("workers", str(self.workers)),
            ("worker history", changes or "-"),
            ("last resize", str(self.resizes[-1]) if self.resizes else "-"),
            ("fetch p50 / p90 / p99", " / ".join(map(_ms, fetch))),
            ("fetch time (all workers)", f"{self.fetch_time:.3f}s"),
            ("GIL wait", f"{self.gil_wait:.3f}s ({_share(self.gil_share)} of fetch time)"),
            (
                "CPU (all workers)",
                f"{self.worker_cpu:.3f}s ({_share(self.compute_share)} of the rest)",
            ),
            ("starved (loop waited)", f"{self.starved:.3f}s"),
            ("ready-queue occupancy", _share(self.queue_occupancy)),
            ("slow samples", str(self.slow_samples)),
            ("moved to a later batch", str(self.moved_samples)),
            ("whole batches", self.whole_batches_reason or "-"),
            ("sample timeout", _ms(self.sample_timeout)),
            ("skipped samples", str(self.skipped_samples)),
            ("worker method", f"{self.worker_method or '-'} ({self.worker_method_reason or '-'})"),
            ("worker method chosen", _chosen(self)),
            ("loop's step (between batches)", _ms(self.loop_step)),
            ("loop's GIL delay", _ms(self.loop_gil_delay)),
        ]
        width = max(len(name) for name, _ in rows)
        lines = ["minato LoaderStats"] + [f"  {name:<{width}}  {value}" for name, value in rows]
        return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _chosen(stats: LoaderStats) -> str:
    if stats.worker_method_decided_after is None:
        return "-"
    return (
        f"{stats.worker_method_decided_after:.2f}s after the workers started, "
        f"at batch {stats.worker_method_decided_at_batch}"
    )


def _share(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


def _add(
    totals: dict[str, Any],
    history: list[tuple[float, int]],
    resizes: list[PoolResize],
    figures: dict[str, Any],
    offset: float,
) -> None:
    """Adds one engine's figures to the running totals, worker history and
    resizes; its times are shifted by `offset`, when it started."""
    for key in _SUMMED:
        totals[key] += figures[key]
    history.extend((offset + at, count) for at, count in figures["worker_history"])
    resizes.extend(PoolResize(offset + at, *rest) for at, *rest in figures.get("resizes", ()))


class StatsRecorder:
    """A loader's running totals; iterators report to it.

    Counters of engines that have stopped are folded in when they stop;
    the live engine's are read when stats are asked for.
    """

    def __init__(self) -> None:
        self._lock = ForkSafeLock()
        self.started: float | None = None
        self.samples = 0
        self.batches = 0
        self.starved = 0.0
        # Totals of engines that have stopped.
        self._closed: dict[str, Any] = dict.fromkeys(_SUMMED, 0)
        self._history: list[tuple[float, int]] = []
        self._resizes: list[PoolResize] = []
        self._last: dict[str, Any] = {}
        self._live: Any = None
        self._live_offset = 0.0
        self.gil_hint_given = False
        # The loader's WorkerMethod (None without workers).
        self.method: Any = None
        self.skipped_samples = 0
        self._failures: deque[SampleFailure] = deque(maxlen=MAX_FAILURES_KEPT)
        # The worker count the adaptive controller last settled on: the next
        # iterator (a new epoch without persistent workers) starts there.
        self.learned_workers: int | None = None

    def engine_started(self, engine: Any) -> None:
        now = time.perf_counter()
        with self._lock:
            if self.started is None:
                self.started = now
            self._live = engine
            self._live_offset = now - self.started

    def engine_stopped(self, engine: Any) -> None:
        figures = engine.stats()
        with self._lock:
            if self._live is engine:
                self._live = None
            _add(self._closed, self._history, self._resizes, figures, self._live_offset)
            # Where the controller settled: not a growth step it had yet to
            # judge, which a fresh controller would keep unjudged.
            settled = figures["settled_workers"]
            if settled:
                self.learned_workers = settled
            elif figures["worker_history"]:
                self.learned_workers = figures["worker_history"][-1][1]
            self._last = figures

    def engine_lost(self, engine: Any) -> None:
        """In a fork child: ``engine``'s threads stayed in the parent, and its
        figures since it started cannot be read here (they are left out)."""
        with self._lock:
            if self._live is engine:
                self._live = None

    def delivered(self, samples: int, waited: float) -> None:
        """The training loop got a batch of `samples` after waiting `waited` seconds."""
        self.samples += samples
        self.batches += 1
        self.starved += waited

    def skipped(self, failure: SampleFailure) -> None:
        """A sample was skipped by the failure policy."""
        with self._lock:
            self.skipped_samples += 1
            self._failures.append(failure)

    def snapshot(self) -> LoaderStats:
        with self._lock:
            live = self._live
            offset = self._live_offset
            closed = dict(self._closed)
            history = list(self._history)
            resizes = list(self._resizes)
            last = self._last
            started = self.started
            skipped_samples = self.skipped_samples
            failures = tuple(self._failures)
        if live is not None:
            figures = live.stats()
            _add(closed, history, resizes, figures, offset)
            workers = figures["workers"]
        else:
            figures = last
            workers = 0
        decided = None if self.method is None else self.method.decided_after
        return LoaderStats(
            samples=self.samples,
            batches=self.batches,
            slow_samples=closed["slow_samples"],
            moved_samples=closed["moved_samples"],
            skipped_samples=skipped_samples,
            failures=failures,
            sample_timeout=figures.get("sample_timeout"),
            workers=workers,
            worker_history=tuple(history),
            resizes=tuple(resizes),
            fetch_p50=figures.get("fetch_p50"),
            fetch_p90=figures.get("fetch_p90"),
            fetch_p99=figures.get("fetch_p99"),
            gil_wait=closed["gil_wait"],
            fetch_time=closed["busy"],
            worker_cpu=closed["cpu"],
            starved=self.starved,
            queue_occupancy=figures.get("queue_occupancy"),
            elapsed=0.0 if started is None else time.perf_counter() - started,
            worker_method=None if self.method is None else self.method.name,
            worker_method_reason=None if self.method is None else self.method.reason,
            worker_method_decided_after=None if decided is None else decided[0],
            worker_method_decided_at_batch=None if decided is None else decided[1],
            loop_step=figures.get("loop_step"),
            loop_gil_delay=None if self.method is None else self.method.loop_gil_delay,
        )

    def check_gil(self) -> None:
        """Logs, once, that the dataset's Python code serialises the workers
        when they spend most of their fetch time waiting for the GIL, and
        either that wait is long in all or the training loop waits for data."""
        if self.gil_hint_given:
            return
        stats = self.snapshot()
        share = stats.gil_share
        if stats.samples < GIL_HINT_MIN_SAMPLES or share is None or share < GIL_BOUND_SHARE:
            return
        starved = stats.starved >= GIL_HINT_MIN_STARVED_SHARE * stats.elapsed
        if stats.gil_wait < GIL_HINT_MIN_WAIT_S and not starved:
            return
        self.gil_hint_given = True
        logger.warning(
            "minato: worker threads spent %.0f%% of their fetch time waiting for the GIL: "
            "the dataset's Python code holds it and serialises the workers, so more "
            "workers will not help. Move the heavy work to code that releases the GIL "
            "(numpy, torch ops, minato.io decoders) or keep num_workers small.",
            share * 100,
        )
