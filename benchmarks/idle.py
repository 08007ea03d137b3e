"""What a loader costs at rest, and what a hung sample does to the pool.

1. At rest: a persistent loader (num_workers=4, persistent_workers=True)
   runs one epoch, then sits unused for --rest seconds. The figure is the
   CPU time the loader's process, and its worker processes where it has
   them, used during the rest (utime + stime from /proc), for torch's
   DataLoader and minato's, side by side.
2. A hung sample: one sample of a small epoch sleeps --hang seconds while
   the loop waits for its batch; the figure is the most workers minato's
   adaptive pool asked for meanwhile (torch's pool is fixed at num_workers).

    python benchmarks/idle.py [--rest 10] [--hang 3]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.utils.data as tud

import minato

WORKERS = 4
TICKS = os.sysconf("SC_CLK_TCK")


class Small(tud.Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


class OneHung(tud.Dataset):
    """Eight samples; the last sleeps `hang` seconds."""

    def __init__(self, hang: float) -> None:
        self.hang = hang

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 7:
            time.sleep(self.hang)
        return torch.tensor([i])


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes, every thread counted."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def children() -> list[int]:
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
            return [int(pid) for pid in f.read().split()]
    except FileNotFoundError:
        return []


def at_rest(make: type, rest: float) -> float:
    loader = make(Small(), batch_size=16, num_workers=WORKERS, persistent_workers=True)
    for _ in loader:
        pass
    time.sleep(0.5)  # let the epoch's end settle (threads retire, queues drain)
    pids = [os.getpid(), *children()]
    before = cpu_seconds(pids)
    time.sleep(rest)
    used = cpu_seconds(pids) - before
    del loader
    return used


def hung(hang: float) -> tuple[int, list[int]]:
    loader = minato.DataLoader(OneHung(hang), batch_size=8, num_workers=2)
    for _ in loader:
        pass
    counts = [n for _, n in loader.stats().worker_history]
    return max(counts), counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rest", type=float, default=10.0)
    parser.add_argument("--hang", type=float, default=3.0)
    args = parser.parse_args()
    print(f"minato {minato.__version__}, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}")
    print(f"at rest for {args.rest:g} s, {WORKERS} persistent workers: CPU-seconds used")
    for name, make in (("torch", tud.DataLoader), ("minato", minato.DataLoader)):
        print(f"  {name:7s} {at_rest(make, args.rest):.3f}")
    most, counts = hung(args.hang)
    print(f"one sample hung {args.hang:g} s, num_workers=2: most workers {most} (history {counts})")


if __name__ == "__main__":
    main()
