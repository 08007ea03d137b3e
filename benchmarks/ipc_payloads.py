"""Payloads that travel outside the worker processes' slot ring (a dataset's
arrays in a worker's spec, results too large for a slot): one round trip,
``ipc.dumps`` + ``ipc.loads`` + a first read, of this checkout's
minato._process.ipc against another version of that file, alternated, in
one process. Sizes: a 1 MB tensor, a 16 MB array, a 256 MB array.

    git show REV:minato/_process/ipc.py > /tmp/ipc_old/ipc_old.py
    python benchmarks/ipc_payloads.py --old /tmp/ipc_old/ipc_old.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minato._process import ipc as new


def trip(module: Any, obj: Any) -> float:
    started = time.perf_counter()
    payload = module.dumps(obj)
    received = module.loads(payload.data, [os.dup(fd) for fd in payload.fds])
    del payload
    received[-1].item() if isinstance(received, torch.Tensor) else int(received[-1])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    # Importable by name: its reductions pickle by reference, as the real module's.
    sys.path.insert(0, str(args.old.parent))
    old = importlib.import_module(args.old.stem)
    cases = {
        "1 MB tensor": torch.rand(256 * 1024),
        "16 MB array": np.random.rand(2 * 1024 * 1024),
        "256 MB array": np.ones(32 * 1024 * 1024),
    }
    for name, obj in cases.items():
        times: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.repeats):
            times["old"].append(trip(old, obj))
            times["new"].append(trip(new, obj))
        before, after = statistics.median(times["old"]), statistics.median(times["new"])
        print(
            f"{name:13s} old {before * 1e3:8.2f} ms  new {after * 1e3:8.2f} ms  "
            f"new/old {after / before:.2f}"
        )


if __name__ == "__main__":
    main()
