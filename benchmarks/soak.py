"""Soak: minato loaders through a long mix of epochs, breaks, exceptions,
resumes and persistent workers, with RSS, threads, memory maps and child
processes flat after a warm-up.

A seeded RNG draws one scenario after another, each with 2-4 workers and
random options (shuffle, in_order, a batch_sampler, persistent_workers,
adaptive, a sample_timeout of a few ms so that the 20-50 ms slow samples
start replacement threads, batch size, prefetch_factor):

- full epochs, every index delivered exactly once;
- a break after a few batches, then a whole epoch on the same loader;
- a dataset raising on some indices: each exception reaches the loop, which
  goes on with the same iterator (as torch allows);
- resume: state_dict() in mid-epoch, a new loader, load_state_dict(), the rest
  of the epoch: every index exactly once over both;
- an IterableDataset sharded with get_worker_info() (whole epochs, breaks and
  resumes);
- on_error="skip" (where minato.DataLoader has it) over failing indices:
  every other index exactly once, a resume in between or not.

One persistent, adaptive loader over a small shuffled dataset lives through
the whole run, as a training job's loader does, and runs one to three
epochs (some cut short by a break) after each scenario: an earlier leak
(fixed in eb119d8) grew the memory maps with each epoch of such a loader
and was freed only when the loader went; against the commit before the fix,
--minutes 0.5 fails with the maps 67 above their minimum.

Every --report-every seconds, between scenarios (so with only that loader
alive, garbage collected and threads settled), a row records VmRSS, the OS
threads, /proc/self/maps entries and child processes. It fails (exit 1) when
the last row exceeds the minimum after the warm-up by more than the
tolerances, or when, with every loader deleted, threads and children are not
back where they were before the first loader. An assertion failing in a
scenario, or a scenario running past --watchdog seconds (all threads'
stacks are dumped), also fails it.

    python benchmarks/soak.py [--minutes 30] [--report-every 30] [--seed 0] [--json soak.json]
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import inspect
import io
import json
import logging
import os
import platform
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.utils.data as tud

import minato

# on_error="skip" and max_failures came later than the rest.
ON_ERROR_SUPPORTED = "max_failures" in inspect.signature(minato.DataLoader).parameters


# Datasets: cheap, or sleeping, so that two cores are not saturated.


def is_slow(i: int, salt: int, every: int) -> bool:
    """About one index in `every` is slow, a different set for each salt."""
    return every > 0 and (i * 2654435761 + salt * 40503) % 1000003 % every == 0


def slow_sleep(i: int, salt: int) -> None:
    time.sleep(0.020 + (i * 7 + salt) % 31 / 1000)


def item(i: int) -> tuple[int, torch.Tensor]:
    return i, torch.full((16,), float(i))


class SoakDataset(tud.Dataset):
    """Item i is (i, a small tensor); some indices sleep 20-50 ms, some raise."""

    def __init__(
        self, n: int, salt: int, slow_every: int, failing: frozenset[int] = frozenset()
    ) -> None:
        self.n, self.salt, self.slow_every, self.failing = n, salt, slow_every, failing

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        if is_slow(i, self.salt, self.slow_every):
            slow_sleep(i, self.salt)
        if i in self.failing:
            raise ValueError(f"soak: index {i} fails on purpose")
        return item(i)


class ShardedStream(tud.IterableDataset):
    """range(n), each worker its interleaved shard (torch's recipe); some items sleep."""

    def __init__(self, n: int, salt: int, slow_every: int) -> None:
        self.n, self.salt, self.slow_every = n, salt, slow_every

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            if is_slow(i, self.salt, self.slow_every):
                slow_sleep(i, self.salt)
            yield item(i)


# Process figures.


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def thread_count() -> int:
    """OS threads (the Rust engine's included)."""
    return len(os.listdir("/proc/self/task"))


def map_count() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


def child_count() -> int:
    """Child processes, minato's worker processes included (they are children
    of its fork server); the fork server itself, one per process started the
    first time worker processes are wanted, is not counted."""
    zygote = getattr(minato._process.workers, "_the_zygote", None)
    server = zygote.process.pid if zygote is not None and zygote.pid == os.getpid() else None
    parents = {os.getpid(), server}
    children = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == server:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # The command name may hold spaces and parentheses: PPid follows the last ")".
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        children += int(fields[1]) in parents and fields[0] not in "ZX"
    return children


def settle_threads(max_s: float = 5.0) -> int:
    """Collects garbage until the thread count holds still for 0.3 s: loaders
    deleted a moment ago let their threads go over up to a slow sample."""
    deadline = time.monotonic() + max_s
    count, since = thread_count(), time.monotonic()
    while time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
        now = thread_count()
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= 0.3:
            break
    return count


@dataclass
class Row:
    t_s: float
    phase: str
    scenarios: int
    epochs: int
    rss_mib: float
    threads: int
    maps: int
    children: int
    peak_threads: int


class Monitor:
    """Counts epochs and the peak thread count between rows, polled from the loops."""

    def __init__(self) -> None:
        self.epochs = 0
        self.peak_threads = 0
        self.running = ""
        self.last_poll = 0.0

    def poll(self) -> None:
        now = time.monotonic()
        if now - self.last_poll >= 0.05:
            self.last_poll = now
            self.peak_threads = max(self.peak_threads, thread_count())

    def row(self, t_s: float, phase: str, scenarios: int) -> Row:
        threads = settle_threads()
        row = Row(
            t_s=round(t_s, 1),
            phase=phase,
            scenarios=scenarios,
            epochs=self.epochs,
            rss_mib=round(rss_mib(), 1),
            threads=threads,
            maps=map_count(),
            children=child_count(),
            peak_threads=max(self.peak_threads, threads),
        )
        self.peak_threads = 0
        return row


# Loaders.


class Training:
    """What the loop does with each batch: a training step as long as
    `step_s` (a sleep, which releases the GIL as a GPU step does)."""

    def __init__(self, monitor: Monitor, step_s: float) -> None:
        self.monitor, self.step_s = monitor, step_s

    def indices(self, batch: Any) -> list[int]:
        self.monitor.poll()
        if self.step_s:
            time.sleep(self.step_s)
        return [int(i) for i in batch[0]]

    def epoch(self, iterator: Iterator[Any]) -> list[int]:
        """The indices of the rest of an epoch."""
        delivered = [i for batch in iterator for i in self.indices(batch)]
        self.monitor.epochs += 1
        return delivered

    def first(self, iterator: Iterator[Any], batches: int) -> list[int]:
        """The indices of the next `batches` batches (fewer if the epoch ends)."""
        delivered: list[int] = []
        for _, batch in zip(range(batches), iterator, strict=False):
            delivered += self.indices(batch)
        return delivered


def loader_options(rng: random.Random, iterable: bool = False) -> dict[str, Any]:
    """Random loader options, plain values only, so that a resume builds the same loader."""
    options: dict[str, Any] = {
        "num_workers": rng.randint(2, 4),
        "batch_size": rng.choice([1, 3, 8, 16]),
        "persistent_workers": rng.random() < 0.5,
        "adaptive": rng.random() < 0.6,
        "prefetch_factor": rng.choice([1, 2, 4]),
        "sample_timeout": rng.choice([0.002, 0.005, 0.01, "auto"]),
        # The default (64) lets a sleep-bound pool grow to dozens of threads.
        "max_workers": rng.choice([4, 8, 16]),
    }
    if not iterable:
        options["order"] = rng.choice(["shuffle", "sequential", "unordered", "batch_sampler"])
        options["seed"] = rng.randrange(2**31) if rng.random() < 0.7 else None
    return options


def build(dataset: tud.Dataset, options: dict[str, Any]) -> minato.DataLoader:
    kwargs = dict(options)
    order = kwargs.pop("order", None)
    seed = kwargs.pop("seed", None)
    # None: the sampler draws from torch's global generator, which a resume restores.
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    if order == "shuffle":
        kwargs.update(shuffle=True, generator=generator)
    elif order == "unordered":
        kwargs["in_order"] = False
    elif order == "batch_sampler":
        sampler = tud.RandomSampler(dataset, generator=generator)  # type: ignore[arg-type]
        kwargs["batch_sampler"] = tud.BatchSampler(sampler, kwargs.pop("batch_size"), False)
        kwargs["in_order"] = False
    return minato.DataLoader(dataset, **kwargs)


def map_dataset(rng: random.Random, failing: int = 0) -> SoakDataset:
    n = rng.randint(100, 500)
    bad = frozenset(rng.sample(range(n), failing))
    return SoakDataset(
        n, salt=rng.randrange(1000), slow_every=rng.choice([20, 40, 100]), failing=bad
    )


def stream(rng: random.Random) -> ShardedStream:
    return ShardedStream(rng.randint(100, 400), salt=rng.randrange(1000), slow_every=40)


def step_s(rng: random.Random) -> float:
    return rng.choice([0.0, 0.0, 0.001, 0.003])


def expect_once(delivered: list[int], expected: range | list[int], what: str) -> None:
    if sorted(delivered) != sorted(expected):
        counts = Counter(delivered)
        twice = sorted(i for i, c in counts.items() if c > 1)[:10]
        missing = sorted(set(expected) - set(counts))[:10]
        extra = sorted(set(counts) - set(expected))[:10]
        raise AssertionError(
            f"{what}: {len(delivered)} delivered, {len(expected)} expected; "
            f"twice {twice}, missing {missing}, unexpected {extra}"
        )


def describe(dataset: SoakDataset | ShardedStream, options: dict[str, Any]) -> str:
    failing = sorted(getattr(dataset, "failing", ()))
    name = type(dataset).__name__
    return f"{name}(n={dataset.n}, salt={dataset.salt}, failing={failing}), {options}"


def checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """Through torch.save and a weights-only torch.load, as a checkpoint goes."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# Scenarios. Each builds its loaders, checks what they deliver and drops
# them; what it runs is in monitor.running, printed if it fails.


def map_loader(rng: random.Random, monitor: Monitor) -> tuple[SoakDataset, Any, Training]:
    """A map-style dataset, a loader over it with drawn options, and the loop's steps."""
    dataset, options = map_dataset(rng), loader_options(rng)
    monitor.running = describe(dataset, options)
    return dataset, build(dataset, options), Training(monitor, step_s(rng))


def full_epochs(rng: random.Random, monitor: Monitor) -> None:
    dataset, loader, train = map_loader(rng, monitor)
    for epoch in range(rng.randint(1, 3)):
        expect_once(train.epoch(iter(loader)), range(len(dataset)), f"epoch {epoch}")


def break_then_epoch(rng: random.Random, monitor: Monitor) -> None:
    dataset, loader, train = map_loader(rng, monitor)
    for _ in range(rng.randint(1, 3)):
        train.first(iter(loader), rng.randint(1, 4))
    expect_once(train.epoch(iter(loader)), range(len(dataset)), "the epoch after breaks")


def exceptions(rng: random.Random, monitor: Monitor) -> None:
    dataset, options = map_dataset(rng, failing=rng.randint(1, 3)), loader_options(rng)
    monitor.running = describe(dataset, options)
    loader = build(dataset, options)
    train = Training(monitor, step_s(rng))
    batch_size = options["batch_size"]
    for epoch in range(rng.randint(1, 2)):
        delivered: list[int] = []
        raised = 0
        iterator = iter(loader)
        while True:
            try:
                batch = next(iterator)
            except ValueError as error:
                assert "fails on purpose" in str(error), error
                raised += 1
                continue
            except StopIteration:
                break
            delivered += train.indices(batch)
        monitor.epochs += 1
        # A failed batch is lost whole, which samples it held depends on the order.
        what = f"epoch {epoch}"
        assert len(set(delivered)) == len(delivered), f"{what}: an index came twice"
        assert not dataset.failing & set(delivered), f"{what}: a failing index was delivered"
        assert 1 <= raised <= len(dataset.failing), f"{what}: {raised} exceptions"
        assert len(delivered) >= len(dataset) - raised * batch_size, f"{what}: indices lost"


def resume(rng: random.Random, monitor: Monitor) -> None:
    dataset, options = map_dataset(rng), loader_options(rng)
    monitor.running = describe(dataset, options)
    train = Training(monitor, step_s(rng))
    first = build(dataset, options)
    iterator = iter(first)
    before = train.first(iterator, rng.randint(0, len(first)))
    state = checkpoint(first.state_dict())
    del iterator, first
    resumed = build(dataset, options)
    resumed.load_state_dict(state)
    expect_once(before + train.epoch(iter(resumed)), range(len(dataset)), "resumed epoch")
    if rng.random() < 0.5:
        expect_once(train.epoch(iter(resumed)), range(len(dataset)), "the epoch after")


def iterable(rng: random.Random, monitor: Monitor) -> None:
    dataset, options = stream(rng), loader_options(rng, iterable=True)
    monitor.running = describe(dataset, options)
    train = Training(monitor, step_s(rng))
    loader = minato.DataLoader(dataset, **options)
    if rng.random() < 0.5:
        train.first(iter(loader), rng.randint(1, 4))
    if rng.random() < 0.5:
        iterator = iter(loader)
        before = train.first(iterator, rng.randint(0, 6))
        state = checkpoint(loader.state_dict())
        del iterator, loader
        loader = minato.DataLoader(dataset, **options)
        loader.load_state_dict(state)
        expect_once(before + train.epoch(iter(loader)), range(dataset.n), "resumed stream")
    for epoch in range(rng.randint(1, 2)):
        expect_once(train.epoch(iter(loader)), range(dataset.n), f"stream epoch {epoch}")


def skip_errors(rng: random.Random, monitor: Monitor) -> None:
    dataset, options = map_dataset(rng, failing=rng.randint(1, 3)), loader_options(rng)
    options["on_error"] = "skip"
    if rng.random() < 0.5:
        # Skipping more than this per epoch raises; these epochs skip exactly this many.
        options["max_failures"] = len(dataset.failing)
    monitor.running = describe(dataset, options)
    train = Training(monitor, step_s(rng))
    good = [i for i in range(len(dataset)) if i not in dataset.failing]
    loader = build(dataset, options)
    if rng.random() < 0.5:
        iterator = iter(loader)
        before = train.first(iterator, rng.randint(0, len(loader) // 2))
        state = checkpoint(loader.state_dict())
        del iterator, loader
        loader = build(dataset, options)
        loader.load_state_dict(state)
        expect_once(before + train.epoch(iter(loader)), good, "on_error='skip', resumed")
    for epoch in range(rng.randint(1, 2)):
        expect_once(train.epoch(iter(loader)), good, f"on_error='skip', epoch {epoch}")


SCENARIOS: dict[str, Callable[[random.Random, Monitor], None]] = {
    "full_epochs": full_epochs,
    "break_then_epoch": break_then_epoch,
    "exceptions": exceptions,
    "resume": resume,
    "iterable": iterable,
}
if ON_ERROR_SUPPORTED:
    SCENARIOS["skip_errors"] = skip_errors


class LongLivedLoader:
    """A persistent, adaptive loader over a small shuffled dataset, used for
    the whole run: a few epochs, or breaks after a few batches, each time.
    About one sample in 20 is slow, for a few replacement threads an epoch."""

    def __init__(self, monitor: Monitor) -> None:
        self.dataset = SoakDataset(96, salt=7, slow_every=20)
        self.loader = minato.DataLoader(
            self.dataset,
            batch_size=8,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
            max_workers=4,
            sample_timeout=0.005,
        )
        self.train = Training(monitor, 0.0)

    def run(self, rng: random.Random) -> None:
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.2:
                self.train.first(iter(self.loader), rng.randint(1, 5))
            else:
                expect_once(self.train.epoch(iter(self.loader)), range(96), "long-lived loader")


# The run.

FIELDS = ("rss_mib", "threads", "maps", "children")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the run")
    parser.add_argument(
        "--warmup-minutes",
        type=float,
        help="not measured; default a tenth of the run, at least one minute, at most half",
    )
    parser.add_argument("--report-every", type=float, default=30.0, help="seconds between rows")
    parser.add_argument("--seed", type=int, default=0, help="draws the scenarios and options")
    parser.add_argument("--json", metavar="OUT", help="write the rows and checks here")
    parser.add_argument(
        "--rss-growth-mib", type=float, default=50.0, help="allowed RSS growth in MiB..."
    )
    parser.add_argument(
        "--rss-growth-pct", type=float, default=10.0, help="...or percent, whichever is larger"
    )
    # The long-lived loader alive at every row runs 2 to 6 threads (its
    # adaptive pool up to max_workers=4, plus up to 2 replacements for slow
    # samples): a row may catch it 4 above its lowest. A leak grows without
    # bound, and with every loader deleted the count must be back to idle.
    parser.add_argument("--thread-growth", type=int, default=4, help="allowed extra OS threads")
    parser.add_argument("--map-growth", type=int, default=16, help="allowed extra memory maps")
    parser.add_argument(
        "--watchdog",
        type=float,
        default=120.0,
        help="seconds a scenario may run before every thread's stack is dumped and the run exits",
    )
    args = parser.parse_args(argv)
    if args.warmup_minutes is None:
        args.warmup_minutes = min(max(args.minutes / 10, 1.0), args.minutes / 2)
    return args


def print_row(row: Row) -> None:
    print(
        f"{row.t_s:8.1f} {row.phase:>8} {row.scenarios:9d} {row.epochs:7d} {row.rss_mib:9.1f}"
        f" {row.threads:7d} {row.peak_threads:5d} {row.maps:6d} {row.children:8d}",
        flush=True,
    )


@dataclass
class Soak:
    idle: Row
    rows: list[Row]  # the last one at the end, the long-lived loader still alive
    gone: Row  # every loader deleted
    ran: Counter[str]
    epochs: int

    @property
    def window(self) -> list[Row]:
        return [row for row in self.rows if row.phase != "warm-up"]


def soak(args: argparse.Namespace) -> Soak:
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    # torch starts its intra-op threads at its first parallel op: before the idle figures.
    torch.randn(1 << 20).sum()
    # One warning per skipped sample: the soak's own failures would bury the table.
    logging.getLogger("minato").addFilter(
        lambda record: not str(record.msg).startswith("minato: skipped")
    )
    monitor = Monitor()
    idle = monitor.row(0.0, "idle", 0)
    print(
        f"# soak: minato on torch {torch.__version__}, Python {platform.python_version()},"
        f" {os.cpu_count()} cores; {args.minutes:g} min (warm-up {args.warmup_minutes:g}),"
        f" seed {args.seed}; scenarios: {', '.join(SCENARIOS)}"
    )
    print(
        f"{'t (s)':>8} {'phase':>8} {'scenarios':>9} {'epochs':>7} {'RSS MiB':>9}"
        f" {'threads':>7} {'peak':>5} {'maps':>6} {'children':>8}"
    )
    print_row(idle)

    long_lived = LongLivedLoader(monitor)
    start = last_row = time.monotonic()
    end, warmup_end = start + args.minutes * 60, start + args.warmup_minutes * 60
    rows: list[Row] = []
    ran: Counter[str] = Counter()
    while time.monotonic() < end:
        name = rng.choice(list(SCENARIOS))
        faulthandler.dump_traceback_later(args.watchdog, exit=True)
        try:
            SCENARIOS[name](rng, monitor)
            monitor.running = "the long-lived loader"
            long_lived.run(rng)
        except BaseException:
            print(
                f"# scenario {name} #{ran.total()} failed (seed {args.seed}): {monitor.running}",
                flush=True,
            )
            raise
        finally:
            faulthandler.cancel_dump_traceback_later()
        ran[name] += 1
        now = time.monotonic()
        if now - last_row >= args.report_every:
            phase = "warm-up" if now < warmup_end else "soak"
            rows.append(monitor.row(now - start, phase, ran.total()))
            print_row(rows[-1])
            last_row = time.monotonic()

    rows.append(monitor.row(time.monotonic() - start, "end", ran.total()))
    print_row(rows[-1])
    del long_lived
    gone = monitor.row(time.monotonic() - start, "deleted", ran.total())
    print_row(gone)
    return Soak(idle, rows, gone, ran, monitor.epochs)


@dataclass
class Check:
    name: str
    start: float
    end: float
    allowed: float

    @property
    def ok(self) -> bool:
        return self.end - self.start <= self.allowed


def checks(args: argparse.Namespace, run: Soak) -> list[Check]:
    """The adaptive pool legitimately varies while a loader lives, so each
    end figure is held against the lowest since the warm-up."""
    lowest = {field: min(getattr(row, field) for row in run.window) for field in FIELDS}
    allowed = {
        "rss_mib": max(args.rss_growth_mib, lowest["rss_mib"] * args.rss_growth_pct / 100),
        "threads": args.thread_growth,
        "maps": args.map_growth,
        "children": 0,
    }
    end, gone = run.rows[-1], run.gone
    found = [
        Check(
            f"{field}, end vs post-warm-up minimum",
            lowest[field],
            getattr(end, field),
            allowed[field],
        )
        for field in FIELDS
    ]
    found += [
        Check(
            f"{field}, deleted vs post-warm-up minimum",
            lowest[field],
            getattr(gone, field),
            allowed[field],
        )
        for field in ("rss_mib", "maps")
    ]
    # Every loader gone, none of their threads nor any child process may remain.
    found += [
        Check(f"{field}, deleted vs idle", getattr(run.idle, field), getattr(gone, field), 0)
        for field in ("threads", "children")
    ]
    return found


def slope_per_minute(rows: list[Row], field: str) -> float:
    """Least-squares slope of a row field against time."""
    ts = [row.t_s / 60 for row in rows]
    ys = [float(getattr(row, field)) for row in rows]
    t_mean, y_mean = sum(ts) / len(ts), sum(ys) / len(ys)
    variance = sum((t - t_mean) ** 2 for t in ts)
    if not variance:
        return 0.0
    return sum((t - t_mean) * (y - y_mean) for t, y in zip(ts, ys, strict=True)) / variance


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = soak(args)
    window = run.window
    counts = ", ".join(f"{name} {count}" for name, count in sorted(run.ran.items()))
    print(f"\n# {run.ran.total()} scenarios ({counts}), {run.epochs} epochs")
    if len(window) < 3:
        print(f"# only {len(window)} rows after the warm-up: lower --report-every")
    slopes = {field: slope_per_minute(window, field) for field in FIELDS}
    print(f"{'':10} {'soak start':>10} {'minimum':>9} {'end':>9} {'deleted':>9} {'per min':>9}")
    for field in FIELDS:
        figures = [getattr(window[0], field), min(getattr(row, field) for row in window)]
        figures += [getattr(run.rows[-1], field), getattr(run.gone, field)]
        print(f"{field:10}" + "".join(f" {x:9g}" for x in figures) + f" {slopes[field]:+9.2f}")
    print()
    found = checks(args, run)
    for check in found:
        print(
            f"{check.name:40} {check.start:9g} -> {check.end:9g}"
            f" ({check.end - check.start:+.4g}, allowed +{check.allowed:.4g})"
            f" {'ok' if check.ok else 'FAIL'}"
        )
    passed = all(check.ok for check in found)
    if args.json:
        report = {
            "args": vars(args),
            "rows": [asdict(row) for row in [run.idle, *run.rows, run.gone]],
            "scenarios": dict(run.ran),
            "epochs": run.epochs,
            "slopes_per_minute": slopes,
            "checks": [asdict(check) | {"ok": check.ok} for check in found],
            "passed": passed,
        }
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    print("passed" if passed else "FAILED")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
