"""A loader prepared by Hugging Face Accelerate, torch's against minato's,
side by side in one run: samples/s through accelerate's DataLoaderShard,
the training process's CPU per batch (RUSAGE_SELF), and what the shard's
per-batch ``state_dict()`` call costs a minato loader (accelerate takes one
before every batch of a loader that has one).

The dataset sleeps 1 ms a sample (GIL-free, as file reads) and returns a
3x64x64 float tensor; batch 32, 4 workers, 3 epochs after a warm-up one.

    python benchmarks/accelerate_loop.py [--samples 4096] [--workers 4]
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
import torch.utils.data as tud
from accelerate import Accelerator

import minato


class Sleepy(tud.Dataset):
    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.001)
        return torch.full((3, 64, 64), float(index))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(cls: type, samples: int, workers: int, epochs: int) -> tuple[float, float]:
    accelerator = Accelerator(cpu=True)
    loader = cls(Sleepy(samples), batch_size=32, shuffle=True, num_workers=workers)
    prepared = accelerator.prepare(loader)
    for _ in prepared:  # warm-up epoch: workers started
        pass
    started, cpu = time.perf_counter(), cpu_seconds()
    batches = 0
    for _ in range(epochs):
        for _ in prepared:
            batches += 1
    elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    return batches * 32 / elapsed, cpu / batches


def state_dict_cost(samples: int, workers: int) -> float:
    loader = minato.DataLoader(Sleepy(samples), batch_size=32, shuffle=True, num_workers=workers)
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    calls = 500
    started = time.perf_counter()
    for _ in range(calls):
        loader.state_dict()
    return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    print(f"# accelerate_loop: {args.samples} samples, batch 32, {args.workers} workers, CPU")
    rows = {}
    for name, cls in (("torch", tud.DataLoader), ("minato", minato.DataLoader)):
        rows[name] = run(cls, args.samples, args.workers, args.epochs)
        rate, cpu = rows[name]
        print(f"{name:7s} {rate:9,.0f} samples/s   {cpu * 1e3:6.2f} ms CPU per batch")
    print(f"minato / torch: {rows['minato'][0] / rows['torch'][0]:.2f}x samples/s")
    cost = state_dict_cost(args.samples, args.workers)
    print(f"minato state_dict() mid-epoch: {cost * 1e6:.1f} us a call")


if __name__ == "__main__":
    main()
