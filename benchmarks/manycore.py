"""Many cores on two: the loader's own cost when N workers could deliver N/d samples/s.

Each sample's work is a GIL-free ``time.sleep(d)`` (as minato.io's decoders
and file reads release the GIL) returning a (224, 224, 3) uint8 tensor and
its index, so N workers can deliver N/d samples/s whatever the core count:
what falls short of that is the loader's own cost. On a machine whose cores
are busy decoding, the loader's threads must win a core for every GIL
hand-over: ``--busy`` stands for that with one spinning process per core.
Those cores would be busy with the loader's own workers, at their priority:
``--busy-at-workers-nice`` runs the spinners at each row's worker
priority (0 for torch's processes and minato's threads, ``worker_nice``
for minato's worker processes; renicing back to 0 needs root), where
``--busy`` alone runs them at 0 for every row.

Every system runs in this one process, one after another, on the same
workload; the figures are samples/s as a fraction of the ideal N/d, in the
steady state (after the first batches), the training process's own CPU
time per sample (``RUSAGE_SELF``: its threads, not its worker processes),
and, for minato, the GIL takes its bindings count per batch
(rust/bindings/gil_takes.rs: a task entering Python, a collate, each
return from a GIL-free wait; Python's own hand-overs are not seen), and
how it ran: the worker method and the pool's size at the end (from
``stats()``; the defaults choose both, and say why on the line below), and
whether it loaded whole batches. "minato defaults, second epoch" times the
same loader's second epoch: after an epoch on single samples that moved
none, the defaults load whole batches (minato._loader.whole_batches).
The steady state is timed after the first 8 batches; ``--after-prefetch``
also times it after the prefetched ones (2 per worker), in the same run: a
pool of whole batches delivers its first round together after a batch's
loading time (the 8 first batches leave the rest of that round ready), and
a sample-level epoch that hands over waits that long once, at the
hand-over.

    python benchmarks/manycore.py [--workers 16 --sleep-ms 3] [--batch 64]
        [--busy [--busy-at-workers-nice]] [--after-prefetch]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import time
import warnings

import torch
import torch.utils.data as tud

import minato
from minato._minato import _gil_takes
from minato._util.priority import worker_nice_value
from minato.dataloader import DEFAULT_WORKER_NICE

IMAGE = (224, 224, 3)
WARM_BATCHES = 8


class Sleeping(tud.Dataset):
    def __init__(self, samples: int, sleep_s: float) -> None:
        self.samples, self.sleep_s = samples, sleep_s
        self.image = torch.zeros(IMAGE, dtype=torch.uint8)

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int):
        time.sleep(self.sleep_s)
        return self.image.clone(), index


def _spin() -> None:
    while True:
        pass


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


#: How the last minato loader `measure` ran: (worker method, final pool, why,
#: whether its timed epoch loaded whole batches or single samples).
last_run: tuple[str, int, str, str] | None = None


#: With ``--after-prefetch``: the last run's samples/s after its prefetched
#: batches (see `measure`).
after_prefetch: float | None = None


def measure(
    make_loader, after_epochs: int = 0, prefetched: int | None = None
) -> tuple[float, float, float]:
    """(samples/s, CPU seconds per sample, minato's GIL takes per batch)
    after the first batches (of the epoch after `after_epochs` whole ones);
    also, given `prefetched`, samples/s after that many batches
    (`after_prefetch`)."""
    global last_run, after_prefetch
    loader = make_loader()
    for _ in range(after_epochs):
        for _ in loader:
            pass
    iterator = iter(loader)
    for _ in range(WARM_BATCHES):
        next(iterator)
    samples = batches = 0
    handed_over_at = None
    began, cpu, takes = time.perf_counter(), _self_cpu(), _gil_takes()
    later = None  # (time, samples) once the prefetched batches are in
    for images, _ in iterator:
        samples += len(images)
        batches += 1
        if handed_over_at is None and getattr(iterator, "_handed_over", False):
            handed_over_at = WARM_BATCHES + batches
        if prefetched is not None and WARM_BATCHES + batches == prefetched:
            later = (time.perf_counter(), samples)
    ended = time.perf_counter()
    after_prefetch = None if later is None else (samples - later[1]) / (ended - later[0])
    elapsed, cpu = ended - began, _self_cpu() - cpu
    takes = _gil_takes() - takes
    stats = loader.stats() if isinstance(loader, minato.DataLoader) else None
    last_run = None
    if stats is not None:
        # The pool is shut down after the epoch: its last size is history.
        history = stats.worker_history or [(0.0, stats.workers)]
        single = type(iterator).__name__ == "_SampleDataLoaderIter"
        path = "single samples" if single else "whole batches"
        if handed_over_at is not None:
            path = f"single samples, then whole batches (handed over at batch {handed_over_at})"
        loading = f"{path}, {stats.moved_samples} moved"
        last_run = (
            stats.worker_method,
            history[-1][1],
            stats.worker_method_reason or "",
            loading,
            stats.whole_batches_reason,
        )
    del iterator, loader
    return samples / elapsed, cpu / max(samples, 1), takes / max(batches, 1)


def systems(workers: int) -> dict[str, dict]:
    return {
        "torch's DataLoader (processes)": {"torch": True},
        "minato defaults": {},
        # The same loader's second epoch: an epoch on single samples that
        # moved none is followed by whole batches (minato._loader.whole_batches).
        "minato defaults, second epoch": {"after_epochs": 1},
        "minato sample-level threads, fixed pool": {"worker_method": "thread", "adaptive": False},
        "minato sample-level threads, adaptive pool": {"worker_method": "thread"},
        "minato whole batches, threads": {
            "worker_method": "thread",
            "adaptive": False,
            "in_order": True,
            "sample_timeout": None,
        },
        "minato worker processes, sample-level": {"worker_method": "multiprocessing"},
        "minato worker processes, whole batches": {
            "worker_method": "multiprocessing",
            "in_order": True,
            "sample_timeout": None,
        },
        # minato's worker processes run niced (worker_nice=10), so beside the
        # spinners of --busy they get a fraction of a core where torch's get
        # a share: these rows run them at torch's priority.
        "minato worker processes, sample-level, worker_nice=0": {
            "worker_method": "multiprocessing",
            "worker_nice": 0,
        },
        "minato worker processes, whole batches, worker_nice=0": {
            "worker_method": "multiprocessing",
            "in_order": True,
            "sample_timeout": None,
            "worker_nice": 0,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--sleep-ms", type=float, default=3.0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=2.0, help="of ideal work per system")
    parser.add_argument("--busy", action="store_true", help="one spinning process per core")
    parser.add_argument(
        "--busy-at-workers-nice",
        action="store_true",
        help="the spinners at each row's worker priority (needs root)",
    )
    parser.add_argument("--only", action="append", help="systems whose name contains this")
    parser.add_argument(
        "--after-prefetch",
        action="store_true",
        help="also samples/s after the prefetched batches (prefetch_factor 2 x workers)",
    )
    args = parser.parse_args()
    prefetched = 2 * args.workers if args.after_prefetch else None
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    sleep_s = args.sleep_ms / 1000
    ideal = args.workers / sleep_s
    samples = int(ideal * args.seconds) + WARM_BATCHES * args.batch
    spinners = []
    if args.busy:
        context = multiprocessing.get_context("fork")
        spinners = [context.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)]
        for spinner in spinners:
            spinner.start()
    print(
        f"# manycore: {args.workers} workers x {args.sleep_ms} ms, batch {args.batch}, "
        f"{samples} samples, ideal {ideal:,.0f}/s, "
        f"{'cores kept busy' if args.busy else 'idle cores'}"
        f"{' at each row workers priority' if args.busy_at_workers_nice else ''}; minato from "
        f"{os.path.dirname(minato.__file__)}"
    )
    try:
        for name, options in systems(args.workers).items():
            if args.only and not any(part in name for part in args.only):
                continue
            options = dict(options)
            use_torch = options.pop("torch", False)
            after_epochs = options.pop("after_epochs", 0)
            loader_type = tud.DataLoader if use_torch else minato.DataLoader

            def make(loader_type=loader_type, options=options):
                return loader_type(
                    Sleeping(samples, sleep_s),
                    batch_size=args.batch,
                    shuffle=True,
                    num_workers=args.workers,
                    **options,
                )

            if args.busy_at_workers_nice:
                nice = 0
                if options.get("worker_method") == "multiprocessing":
                    nice = worker_nice_value(options.get("worker_nice", DEFAULT_WORKER_NICE)) or 0
                for spinner in spinners:
                    os.setpriority(os.PRIO_PROCESS, spinner.pid, nice)
            rate, cpu, takes = measure(make, after_epochs, prefetched)
            gil = "" if use_torch else f"  {takes:6.1f} GIL takes/batch"
            if after_prefetch is not None:
                gil = f"  ({after_prefetch / ideal:4.2f} after the prefetched)" + gil
            if last_run is not None:
                gil += f"  {last_run[0]}, {last_run[1]} at the end, {last_run[3]}"
                if last_run[2].startswith("auto"):
                    gil += f"\n      ({last_run[2]})"
                if last_run[4]:
                    gil += f"\n      (whole batches: {last_run[4]})"
            print(
                f"  {name:44s} {rate:9,.0f}/s  {rate / ideal:5.2f} of ideal  "
                f"{cpu * 1e6:6.1f} us CPU/sample{gil}"
            )
    finally:
        for spinner in spinners:
            spinner.kill()


if __name__ == "__main__":
    main()
