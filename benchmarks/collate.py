"""The collate fast path against torch's default_collate, on the CPU.

Batches of 64 samples: uint8 images (3, 224, 224), float32 images, numpy
float32 arrays, and (image, label) tuples; batches/s of each collate, median
of --repeats runs of --batches batches. Without a GPU nothing is pinned: this
measures the stacking itself (one allocation, GIL-free parallel copies
against torch.stack). The pinned, GPU-bound case is in gpu_train.py.

    python benchmarks/collate.py [--batches 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from minato._loader.collate import fast_default_collate

BATCH = 64


def workloads() -> dict[str, list[Any]]:
    generator = torch.Generator().manual_seed(0)
    uint8 = [torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8) for _ in range(BATCH)]
    float32 = [torch.rand(3, 224, 224, generator=generator) for _ in range(BATCH)]
    arrays = [np.random.default_rng(i).random((3, 224, 224), np.float32) for i in range(BATCH)]
    pairs = [(image, i) for i, image in enumerate(uint8)]
    return {
        "uint8 tensors (3, 224, 224)": uint8,
        "float32 tensors (3, 224, 224)": float32,
        "numpy float32 (3, 224, 224)": arrays,
        "(uint8 tensor, int) tuples": pairs,
    }


def rate(collate: Callable[[list[Any]], Any], batch: list[Any], batches: int, repeats: int):
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(batches):
            collate(batch)
        runs.append(batches / (time.perf_counter() - start))
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    fast = fast_default_collate(pin=False)
    print(
        f"# collate: batches of {BATCH}, median of {args.repeats} x {args.batches} batches; "
        f"torch {torch.__version__}, {torch.get_num_threads()} torch threads"
    )
    for name, batch in workloads().items():
        torchs = rate(default_collate, batch, args.batches, args.repeats)
        ours = rate(fast, batch, args.batches, args.repeats)
        print(
            f"  {name:<32} default_collate {torchs:7.1f}/s   minato {ours:7.1f}/s   "
            f"{ours / torchs:5.2f}x"
        )


if __name__ == "__main__":
    main()
