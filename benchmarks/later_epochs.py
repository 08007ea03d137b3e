"""A loader's later epochs, workers anew each epoch (torch's default): the
process tree's peak memory over its base (sampled every 0.05 s; PSS, and
with every shared-memory page counted, as tree_memory.py reads them: a
quiet machine) and samples/s over epochs 2-4, after a first epoch in
which minato's defaults decide. defaults.py's GIL-bound dataset, returning
a 3x64x64 tensor; 2 workers, batch 16, shuffled, 768 samples an epoch.
One system per run.

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
from tree_memory import measure

import minato


class GilBound(tud.Dataset):
    def __len__(self) -> int:
        return 768

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        total = 0
        for k in range(20000):
            total += k * index % 7
        return torch.full((3, 64, 64), float(total % 255)), index


class PeakSampler:
    """The process tree's peak memory (tree_memory.measure: its PSS, and its
    anonymous and file PSS plus the machine's shared memory), read every
    0.05 s on a thread."""

    def __init__(self) -> None:
        self.peak = (0.0, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            pss, with_shared = measure(os.getpid())
            self.peak = (max(self.peak[0], pss), max(self.peak[1], with_shared))
            time.sleep(0.05)

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join()
        return self.peak


def main() -> None:
    warnings.filterwarnings("ignore")
    system = sys.argv[1]
    base = measure(os.getpid())
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
        f"{system:8s} peak PSS over base {peak[0] - base[0]:6.1f} MiB, "
        f"with all shared memory {peak[1] - base[1]:6.1f} MiB  "
        f"epochs 2-4 {3 * len(loader.dataset) / elapsed:6.0f} samples/s  {method}"
    )


if __name__ == "__main__":
    main()
