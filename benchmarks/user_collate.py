"""manycore.py's emulation with a collate_fn of the user's (torch's
default_collate under another name, which minato cannot recognise): torch's
DataLoader beside minato's sample-level worker processes at nice 0, with
both cores kept busy, 16 workers x 3 ms and 32 x 1 ms, batch 64. Figures as
in manycore.py: fraction of the ideal, the training process's CPU per
sample, minato's GIL takes per batch.

    python benchmarks/user_collate.py
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import sys
import time
import warnings

import torch.utils.data as tud

import minato
from minato._minato import _gil_takes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from manycore import Sleeping, _spin  # noqa: E402


def user_collate(samples):  # a collate_fn of the user's: default_collate by another name
    return tud.default_collate(samples)


def run(workers, sleep_ms, torch_loader):
    ds = Sleeping(int(workers / (sleep_ms / 1000) * 1.5) + 8 * 64, sleep_ms / 1000)
    kw = dict(batch_size=64, shuffle=True, num_workers=workers, collate_fn=user_collate)
    dl = (
        tud.DataLoader(ds, **kw)
        if torch_loader
        else minato.DataLoader(ds, worker_method="multiprocessing", worker_nice=0, **kw)
    )
    it = iter(dl)
    for _ in range(8):
        next(it)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    n = nb = 0
    g = _gil_takes()
    for images, _ in it:
        n += len(images)
        nb += 1
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / n * 1e6
    ideal = workers / (sleep_ms / 1000)
    name = "torch" if torch_loader else "minato processes, sample-level, nice 0"
    print(
        f"  {name:40s} {n / dt / ideal:5.2f} of ideal {cpu:6.1f} us CPU/sample"
        + ("" if torch_loader else f" {(_gil_takes() - g) / nb:5.1f} GIL takes/batch")
    )


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    spinners = [
        multiprocessing.get_context("fork").Process(target=_spin, daemon=True)
        for _ in range(os.cpu_count())
    ]
    for s in spinners:
        s.start()
    try:
        for cfg in [(16, 3.0), (32, 1.0)]:
            print("##", cfg, os.environ.get("PYTHONPATH", "new"))
            run(*cfg, True)
            run(*cfg, False)
    finally:
        for s in spinners:
            s.kill()
