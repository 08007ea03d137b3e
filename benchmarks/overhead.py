"""Per-batch overhead and start-up: minato's threads beside torch's worker processes.

A trivial dataset (``__getitem__`` returns its index) leaves nothing but the
loader's own cost. Every system runs in this one process, one after another,
and the figures that matter are the ratios.

    python benchmarks/overhead.py [--samples 200000] [--repeats 3] [--shuffle]

``--shuffle`` measures shuffled epochs: minato's sample-level batches
(assembled and collated on its collate thread) instead of whole batches.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import time
import warnings

import torch
import torch.utils.data as tud

import minato

BATCH_SIZE = 64


class IndexDataset(tud.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def throughput(cls: type, num_workers: int, samples: int, shuffle: bool = False) -> float:
    """Samples per second over one full epoch."""
    loader = cls(
        IndexDataset(samples), batch_size=BATCH_SIZE, num_workers=num_workers, shuffle=shuffle
    )
    start = time.perf_counter()
    seen = 0
    for batch in loader:
        seen += len(batch)
    elapsed = time.perf_counter() - start
    assert seen == samples
    return samples / elapsed


def first_batch_seconds(cls: type, num_workers: int, shuffle: bool = False) -> float:
    """From iter() to the first batch in hand, workers' start included."""
    loader = cls(
        IndexDataset(100_000), batch_size=BATCH_SIZE, num_workers=num_workers, shuffle=shuffle
    )
    start = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    elapsed = time.perf_counter() - start
    del iterator
    gc.collect()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3, help="median of this many runs")
    parser.add_argument("--shuffle", action="store_true", help="shuffled epochs")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    print(
        f"# overhead: {args.samples} samples, batch_size {BATCH_SIZE}, median of "
        f"{args.repeats}; torch {torch.__version__}, Python {platform.python_version()}, "
        f"{torch.multiprocessing.get_start_method()} start" + (", shuffled" if args.shuffle else "")
    )
    systems = [
        ("torch  num_workers=0", tud.DataLoader, 0),
        ("torch  num_workers=2", tud.DataLoader, 2),
        ("minato num_workers=2", minato.DataLoader, 2),
        ("minato num_workers=8", minato.DataLoader, 8),
    ]
    rates = {}
    print("\nthroughput (samples/s)")
    for name, cls, workers in systems:
        rates[name] = statistics.median(
            throughput(cls, workers, args.samples, args.shuffle) for _ in range(args.repeats)
        )
        print(f"  {name}: {rates[name]:>12,.0f}")
    ratio = rates["minato num_workers=2"] / rates["torch  num_workers=2"]
    print(f"  minato 2 threads / torch 2 processes: {ratio:.1f}x  (target >= 5x)")

    print("\ntime to first batch (ms)")
    for workers in (2, 8, 16):
        torch_s = statistics.median(
            first_batch_seconds(tud.DataLoader, workers, args.shuffle) for _ in range(args.repeats)
        )
        minato_s = statistics.median(
            first_batch_seconds(minato.DataLoader, workers, args.shuffle)
            for _ in range(args.repeats)
        )
        print(
            f"  {workers:>2} workers: torch {torch_s * 1e3:7.1f}   minato {minato_s * 1e3:6.1f}"
            f"   ({torch_s / minato_s:.0f}x sooner; target minato <= 20 ms at 16)"
        )


if __name__ == "__main__":
    main()
