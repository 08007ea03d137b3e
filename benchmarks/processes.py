"""Worker processes (issue 16): a GIL-bound dataset, start-up and memory, beside torch.

Every system runs in this one process, one after another, repeated in turn;
the figures that matter are the ratios.

- throughput: a dataset whose ``__getitem__`` is pure Python (about 2 ms a
  sample here), 2 workers, shuffled, several epochs without persistent
  workers; samples/s from the loader's construction to the last epoch's
  end, so every start-up (torch's forks, minato's automatic move, fork
  server included) is paid. torch's DataLoader; minato's defaults
  (``worker_method="auto"``); minato forced to processes; minato on threads.
- first batch: from ``iter()`` to the first batch, with worker processes:
  torch (fork) and minato (``worker_method="multiprocessing"``: a fork
  server of the iterator's own, forked from this process at ``iter()``), in
  this process, which ran loaders before; and minato's from construction in
  a fresh interpreter.
- memory: the peak proportional set size (PSS: shared pages counted once in
  all) of the whole process tree during an epoch over a dataset holding a
  256 MB array, at 2 and 8 workers.

    python benchmarks/processes.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import torch
import torch.utils.data as tud

import minato

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tree_memory import process_tree, pss_mib  # noqa: E402

BATCH_SIZE = 16


class PurePython(tud.Dataset):
    """Parsing, tokenising, Python-level augmentation: the GIL held throughout."""

    def __init__(self, n: int, work: int) -> None:
        self.n, self.work = n, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        total = 0
        for k in range(self.work):
            total += k * index % 7
        return torch.tensor([index, total])


class Holds(tud.Dataset):
    """A dataset that keeps its data in memory (a 256 MB array)."""

    def __init__(self) -> None:
        self.data = np.ones((256, 1024 * 1024 // 8), dtype=np.float64)

    def __len__(self) -> int:
        return 2048

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.001)
        return torch.from_numpy(self.data[index % 256, :1024].copy())


def calibrate(target_s: float) -> int:
    """The loop length that makes one sample take about `target_s`."""
    work = 20_000
    dataset = PurePython(1, work)
    start = time.perf_counter()
    for _ in range(20):
        dataset[0]
    per = (time.perf_counter() - start) / 20
    return max(1, int(work * target_s / per))


def make(system: str, dataset: tud.Dataset, workers: int, **extra) -> tud.DataLoader:
    if system == "torch":
        return tud.DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=workers, **extra)
    method = {"minato default": "auto", "minato processes": "multiprocessing"}.get(system)
    options = {} if method is None or method == "auto" else {"worker_method": method}
    if system == "minato threads":
        options = {"worker_method": "thread"}
    return minato.DataLoader(
        dataset, batch_size=BATCH_SIZE, num_workers=workers, **options, **extra
    )


def throughput(system: str, samples: int, work: int, epochs: int) -> tuple[float, str]:
    start = time.perf_counter()
    loader = make(system, PurePython(samples, work), 2, shuffle=True)
    seen = 0
    for _ in range(epochs):
        for batch in loader:
            seen += len(batch)
    elapsed = time.perf_counter() - start
    assert seen == samples * epochs
    method = loader.stats().worker_method if isinstance(loader, minato.DataLoader) else ""
    del loader
    gc.collect()
    return seen / elapsed, method or ""


def first_batch_seconds(system: str, workers: int) -> float:
    loader = make(system, PurePython(10_000, 10), workers)
    start = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    elapsed = time.perf_counter() - start
    del iterator, loader
    gc.collect()
    return elapsed


_COLD = """
import time, minato, torch.utils.data as tud
class D(tud.Dataset):
    def __len__(self): return 1000
    def __getitem__(self, i): return i
start = time.perf_counter()
loader = minato.DataLoader(
    D(), batch_size=16, num_workers={workers}, worker_method="multiprocessing"
)
next(iter(loader))
print(time.perf_counter() - start)
"""


def cold_first_batch_seconds(workers: int) -> float:
    """In a fresh interpreter, from the loader's construction."""
    out = subprocess.run(
        [sys.executable, "-c", _COLD.format(workers=workers)],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",  # not the checkout, whose minato/ lacks the built extension
    )
    return float(out.stdout.strip().splitlines()[-1])


def peak_tree_pss_mb(system: str, workers: int) -> tuple[float, float]:
    """Peak PSS of this process and its descendants while an epoch runs,
    and the epoch's seconds (its workers' start included)."""
    dataset = Holds()
    loader = make(system, dataset, workers)
    peak = 0.0
    running = True

    def sample() -> None:
        nonlocal peak
        while running:
            pids = process_tree(os.getpid())
            zygote = getattr(minato._process.workers, "_the_zygote", None)
            if zygote is not None:
                pids = sorted(set(pids) | set(process_tree(zygote.process.pid)))
            peak = max(peak, pss_mib(pids)[0])
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.perf_counter()
    for _ in loader:
        pass
    seconds = time.perf_counter() - started
    running = False
    sampler.join()
    del loader, dataset
    gc.collect()
    return peak, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="median of this many runs")
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--only", choices=["throughput", "first-batch", "memory"], action="append")
    parser.add_argument("--memory-of", nargs=2, help=argparse.SUPPRESS)
    # Worker processes get the dataset's arrays copied, not inherited (A/B).
    parser.add_argument("--copy-arrays", action="store_true")
    args = parser.parse_args()
    if args.memory_of:
        if args.copy_arrays:
            minato._process.inherit.MIN_BYTES = 1 << 62
        system, workers = args.memory_of
        print(*peak_tree_pss_mb(system, int(workers)))
        return
    only = set(args.only or ["throughput", "first-batch", "memory"])
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    work = calibrate(0.002)
    print(
        f"# processes: torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores, torch's start method "
        f"{torch.multiprocessing.get_start_method()}; "
        f"median of {args.repeats}"
    )

    systems = ["torch", "minato default", "minato processes", "minato threads"]
    if "throughput" in only:
        throughput_section(args, systems, work)
    if "first-batch" in only:
        first_batch_section(args)
    if "memory" in only:
        memory_section(args.copy_arrays)


def throughput_section(args: argparse.Namespace, systems: list[str], work: int) -> None:
    print(
        f"\nGIL-bound dataset (~2 ms of pure Python a sample), 2 workers, batch {BATCH_SIZE}, "
        f"shuffled, {args.epochs} epochs of {args.samples}, construction included (samples/s)"
    )
    minato.DataLoader(PurePython(1, 1), num_workers=1, worker_method="multiprocessing")
    rates: dict[str, list[float]] = {system: [] for system in systems}
    methods: dict[str, str] = {}
    for _ in range(args.repeats):
        for system in systems:  # in turn, so drift hits every system alike
            rate, method = throughput(system, args.samples, work, args.epochs)
            rates[system].append(rate)
            methods[system] = method
    torch_rate = statistics.median(rates["torch"])
    for system in systems:
        rate = statistics.median(rates[system])
        spread = f"{min(rates[system]):,.0f}-{max(rates[system]):,.0f}"
        method = f"  ended on {methods[system]}" if methods[system] else ""
        print(f"  {system:<17} {rate:>8,.0f}  ({spread})  {rate / torch_rate:.2f}x torch{method}")


def first_batch_section(args: argparse.Namespace) -> None:
    print("\ntime to first batch with worker processes (ms)")
    for workers in (2, 8, 16):
        first = {
            system: statistics.median(
                first_batch_seconds(system, workers) for _ in range(args.repeats)
            )
            for system in ("torch", "minato processes")
        }
        cold = cold_first_batch_seconds(workers)
        print(
            f"  {workers:>2} workers: torch {first['torch'] * 1e3:7.1f}   minato "
            f"{first['minato processes'] * 1e3:6.1f} (this process)   "
            f"{cold * 1e3:7.1f} (fresh interpreter, from construction)"
        )


def memory_section(copy_arrays: bool = False) -> None:
    # Each system in a fresh interpreter: in one process, a later system's
    # peak would count what earlier ones left (the fork server, freed memory
    # the allocator kept).
    print(
        "\npeak PSS of the process tree, dataset holding 256 MB (MB), and the epoch's seconds, "
        "each in a fresh process" + (" (arrays copied to worker processes)" if copy_arrays else "")
    )
    for workers in (2, 8):
        rows = {}
        for system in ("torch", "minato default", "minato processes", "minato threads"):
            command = [sys.executable, __file__, "--memory-of", system, str(workers)]
            output = subprocess.run(
                command + (["--copy-arrays"] if copy_arrays else []),
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            ).stdout.split()
            rows[system] = (float(output[-2]), float(output[-1]))
        print(
            f"  {workers} workers: "
            + "   ".join(
                f"{system} {peak:,.0f} ({seconds:.2f} s)"
                for system, (peak, seconds) in rows.items()
            )
        )


if __name__ == "__main__":
    main()
