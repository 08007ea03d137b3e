"""manycore.py's emulation with a collate_fn of the user's (torch's
default_collate under another name, which minato cannot recognise), and
one that draws a random number per batch (MixUp-like): torch's DataLoader
beside minato's defaults, its sample-level threads on a fixed pool and its
sample-level worker processes at nice 0, with both cores kept busy, 16
workers x 3 ms and 32 x 1 ms. Figures as in manycore.py: fraction of the
ideal, the training process's CPU per sample, minato's GIL takes per batch,
and where minato ran the collate (the names of the threads that did).

    python benchmarks/user_collate.py [--batch 64] [--only torch defaults threads processes]
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import resource
import sys
import threading
import time
import warnings

import torch
import torch.utils.data as tud

import minato
from minato._minato import _gil_takes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from manycore import Sleeping, _spin  # noqa: E402

# Where the collates ran: counted by the kind of thread (its OS name
# without the number), read the first time each thread collates.
collated_on: collections.Counter[str] = collections.Counter()
_thread_kind: dict[int, str] = {}


def user_collate(samples):  # a collate_fn of the user's: default_collate by another name
    tid = threading.get_native_id()
    kind = _thread_kind.get(tid)
    if kind is None:
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                kind = comm.read().strip().rstrip("0123456789-")
        except OSError:
            kind = "?"
        _thread_kind[tid] = kind
    collated_on[kind] += 1
    return tud.default_collate(samples)


def mixup_collate(samples):  # one that draws, as MixUp does
    images, labels = user_collate(samples)
    return images, labels, torch.rand(())


SYSTEMS = {
    "torch": None,
    "defaults": {},
    "threads": {"worker_method": "thread", "adaptive": False},
    "processes": {"worker_method": "multiprocessing", "worker_nice": 0},
}


def run(workers: int, sleep_ms: float, batch: int, system: str, collate_fn) -> None:
    dataset = Sleeping(int(workers / (sleep_ms / 1000) * 1.5) + 8 * batch, sleep_ms / 1000)
    options = dict(batch_size=batch, shuffle=True, num_workers=workers, collate_fn=collate_fn)
    extra = SYSTEMS[system]
    loader = (
        tud.DataLoader(dataset, **options)
        if extra is None
        else minato.DataLoader(dataset, **options, **extra)
    )
    it = iter(loader)
    for _ in range(8):
        next(it)
    collated_on.clear()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    n = nb = 0
    g = _gil_takes()
    for images, *_ in it:
        n += len(images)
        nb += 1
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    _thread_kind.clear()  # thread ids are reused
    cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / n * 1e6
    ideal = workers / (sleep_ms / 1000)
    line = (
        f"  {system:10s} {collate_fn.__name__:14s} {n / dt / ideal:5.2f} of ideal "
        f"{cpu:6.1f} us CPU/sample"
    )
    if extra is not None:
        where = ", ".join(f"{name} {count}" for name, count in collated_on.most_common(3))
        line += f" {(_gil_takes() - g) / nb:5.1f} GIL takes/batch  collated on: {where}"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--only", nargs="+", choices=list(SYSTEMS))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    spinners = [
        multiprocessing.get_context("fork").Process(target=_spin, daemon=True)
        for _ in range(os.cpu_count() or 1)
    ]
    for spinner in spinners:
        spinner.start()
    try:
        for workers, sleep_ms in [(16, 3.0), (32, 1.0)]:
            print(
                f"## {workers} workers x {sleep_ms} ms, batch {args.batch}, cores kept busy; "
                f"minato from {os.path.dirname(minato.__file__)}",
                flush=True,
            )
            for system in SYSTEMS:
                if args.only and system not in args.only:
                    continue
                for collate_fn in (user_collate, mixup_collate):
                    run(workers, sleep_ms, args.batch, system, collate_fn)
    finally:
        for spinner in spinners:
            spinner.kill()


if __name__ == "__main__":
    main()
