"""A loader's later epochs, workers anew each epoch (torch's default): the
process tree's peak PSS over its base (sampled every 0.05 s) and samples/s
over epochs 2-4, after a first epoch in which minato's defaults decide.
defaults.py's GIL-bound dataset, returning a 3x64x64 tensor; 2 workers,
batch 16, shuffled, 768 samples an epoch. One system per run.

    python benchmarks/later_epochs.py {torch|auto|forced}
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings

import torch
import torch.utils.data as tud
from tree_memory import process_tree

import minato


def pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def tree_pss() -> int:
    return sum(pss(p) for p in process_tree(os.getpid()))


class GilBound(tud.Dataset):
    def __len__(self) -> int:
        return 768

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        total = 0
        for k in range(20000):
            total += k * index % 7
        return torch.full((3, 64, 64), float(total % 255)), index


class PeakSampler:
    """The process tree's peak PSS, read every 0.05 s on a thread."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_pss())
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def main() -> None:
    warnings.filterwarnings("ignore")
    system = sys.argv[1]
    base = tree_pss()
    if system == "torch":
        loader = tud.DataLoader(GilBound(), batch_size=16, shuffle=True, num_workers=2)
    else:
        method = {"forced": "multiprocessing", "auto": "auto"}[system]
        loader = minato.DataLoader(
            GilBound(), batch_size=16, shuffle=True, num_workers=2, worker_method=method
        )
    for _batch in loader:  # the first epoch: minato's defaults decide
        pass
    sampler = PeakSampler()
    start = time.perf_counter()
    for _epoch in range(3):
        for _batch in loader:
            pass
    elapsed = time.perf_counter() - start
    peak = sampler.stop()
    method = loader.stats().worker_method if system != "torch" else "processes"
    print(
        f"{system:8s} peak PSS over base {(peak - base) / 2**20:6.1f} MiB  "
        f"epochs 2-4 {3 * len(loader.dataset) / elapsed:6.0f} samples/s  {method}"
    )


if __name__ == "__main__":
    main()
