"""Adaptive worker count against a sweep of fixed counts, three workloads.

- io: every sample sleeps 5 ms (I/O-like: scales with threads, not cores);
- cpu: numpy sorts that release the GIL (scales up to the core count);
- gil: pure-Python arithmetic that holds the GIL (does not scale at all);
- io-short: every sample sleeps 3 ms, an epoch of 3000 samples only (the
  ramp from 2 workers is a large share of it).

Each workload runs 5000 samples (io-short: 3000) (batch_size 32, shuffle=True: the default
training set-up) through minato.DataLoader with adaptive=False at each fixed
count, then once with adaptive=True starting from num_workers=2. Throughput
is samples/s over the epoch; "reached" is the share of the epoch's samples
delivered (and the seconds into it) before the adaptive loader first ran
within 10% of the best fixed count's throughput (measured over a sliding
window of batches), beside when the pool reached its peak size. A PNG per
run shows the adaptive loader's worker count and throughput over time.

    python benchmarks/adaptive.py [--only io] [--samples 5000] [--plot benchmarks/adaptive.png]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.utils.data as tud

import minato

BATCH = 32


class IoLike(tud.Dataset):
    sleep_s = 0.005

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return torch.tensor([i])


class IoShort(IoLike):
    sleep_s = 0.003


class CpuNumpy(tud.Dataset):
    """About 1.5 ms of numpy sorting per sample, GIL released."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.data = np.random.default_rng(0).random(40_000)

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> torch.Tensor:
        np.sort(self.data, kind="stable")
        return torch.tensor([i])


class GilPython(tud.Dataset):
    """About 1 ms of pure-Python arithmetic per sample, GIL held."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> torch.Tensor:
        total = 0
        for k in range(12_000):
            total += k * k % 7
        return torch.tensor([i + total * 0])


WORKLOADS = {
    "io": (IoLike, [2, 4, 8, 16, 32, 64]),
    "cpu": (CpuNumpy, [1, 2, 3, 4, 8]),
    "gil": (GilPython, [1, 2, 4, 8]),
    "io-short": (IoShort, [2, 4, 8, 16, 32, 64]),
}
# Workloads whose epoch length is part of the case.
SAMPLES = {"io-short": 3000}


def run(dataset, num_workers: int, adaptive: bool):
    # Threads: the controller resizes a thread pool (on processes the pool
    # keeps num_workers, and auto would move the gil workload there).
    loader = minato.DataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=True,
        num_workers=num_workers,
        adaptive=adaptive,
        worker_method="thread",
    )
    times, counts = [], []
    start = time.perf_counter()
    delivered = 0
    for batch in loader:
        delivered += len(batch)
        times.append(time.perf_counter() - start)
        counts.append(delivered)
    elapsed = time.perf_counter() - start
    return delivered / elapsed, times, counts, loader.stats()


def reached_at(times, counts, target_rate: float, window: int = 8) -> tuple[float, float] | None:
    """(Share of the epoch delivered, seconds into it) before the
    sliding-window rate first reached target."""
    for i in range(window, len(times)):
        rate = (counts[i] - counts[i - window]) / max(times[i] - times[i - window], 1e-9)
        if rate >= target_rate:
            return counts[i - window] / counts[-1], times[i - window]
    return None


def plot(results, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(8, 3 * len(results)), squeeze=False)
    for ax, (name, (times, counts, stats, best_rate)) in zip(
        axes[:, 0], results.items(), strict=True
    ):
        rates_t, rates = [], []
        for i in range(8, len(times)):
            rates_t.append(times[i])
            rates.append((counts[i] - counts[i - 8]) / max(times[i] - times[i - 8], 1e-9))
        ax.plot(rates_t, rates, color="tab:blue", label="adaptive samples/s")
        ax.axhline(best_rate, color="tab:blue", linestyle=":", label="best fixed samples/s")
        ax.set_ylabel("samples/s")
        ax.set_title(name)
        ax2 = ax.twinx()
        history = list(stats.worker_history)
        xs = [at for at, _ in history] + [times[-1]]
        ys = [n for _, n in history] + [history[-1][1]]
        ax2.step(xs, ys, where="post", color="tab:red", label="workers")
        ax2.set_ylabel("workers")
        ax.set_xlabel("seconds")
        ax.legend(loc="lower right", fontsize=8)
        ax2.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(WORKLOADS), action="append")
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--plot", default="benchmarks/adaptive.png")
    parser.add_argument(
        "--resizes", action="store_true", help="print the adaptive run's resizes, with why"
    )
    args = parser.parse_args()
    plotted = {}
    print(f"torch {torch.__version__}, {args.samples} samples, batch_size {BATCH}, shuffle=True")
    for name in args.only or list(WORKLOADS):
        make, sweep = WORKLOADS[name]
        dataset = make(SAMPLES.get(name, args.samples))
        print(f"\n== {name}")
        fixed = {}
        for workers in sweep:
            rate, *_ = run(dataset, workers, adaptive=False)
            fixed[workers] = rate
            print(f"  fixed {workers:>3} workers: {rate:8.0f} samples/s")
        best_workers = max(fixed, key=fixed.__getitem__)
        best = fixed[best_workers]
        rate, times, counts, stats = run(dataset, 2, adaptive=True)
        reached = reached_at(times, counts, 0.9 * best)
        final = stats.worker_history[-1][1]
        peak = max(n for _, n in stats.worker_history)
        peak_at = next(at for at, n in stats.worker_history if n == peak)
        print(
            f"  adaptive from 2:     {rate:8.0f} samples/s = {rate / best:.2f}x best fixed "
            f"({best_workers} workers); final {final}, peak {peak} workers at {peak_at:.2f} s; "
            f"0.9x best first reached after "
            + (
                "never"
                if reached is None
                else f"{reached[0]:.1%} of the epoch ({reached[1]:.2f} s)"
            )
        )
        print(
            f"  gil wait {stats.gil_share and stats.gil_share:.0%} of fetch time"
            if stats.gil_share is not None
            else ""
        )
        if args.resizes:
            for resize in stats.resizes:
                print(f"    {resize}")
        plotted[name] = (times, counts, stats, best)
    if args.plot and plotted:
        try:
            plot(plotted, args.plot)
        except ImportError:  # the figures above stand without it
            print("\nno plot: matplotlib is not installed")
        else:
            print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
