"""What per-worker isolation costs: dataset copies, the per-thread torch
generator, and the training loop's calls to the process-wide generators.

1. Memory. A dataset holding a 240,000-entry path list (and the labels as a
   numpy array), 8 workers, one epoch: the peak RSS of a fresh process with
   per-worker copies (minato's default) and with the copies turned off
   (every worker shares the caller's object, as before). Each runs in its
   own subprocess so that peaks do not mix.
2. Worker throughput. torchvision's v2 ImageNet training transforms
   (RandomResizedCrop, RandomHorizontalFlip, ToDtype, Normalize), whose
   random draws go through the worker's own torch generator, on a uint8
   tensor (transforms alone, the worst case) and on JPEGs decoded by PIL
   (the standard pipeline): samples/s with the per-thread generator mode on
   and off, and torch's 2 worker processes beside them; runs interleaved,
   medians.
3. The training loop's side. ``random.random()`` and ``numpy.random.rand()``
   in the main thread now go through a small dispatching function: ns per
   call against the original bound method.

    python benchmarks/isolation.py [--paths 240000] [--workers 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

import numpy as np
import torch
import torch.utils.data as tud

import minato


class PathDataset(tud.Dataset):
    """A file list as ImageFolder-style datasets hold it."""

    def __init__(self, paths: int) -> None:
        self.paths = [
            f"/data/imagenet/train/n{i // 1300:08d}/img_{i:08d}.JPEG" for i in range(paths)
        ]
        self.labels = np.arange(paths, dtype=np.int64) // 1300
        self.handle = None  # opened lazily per worker in real datasets

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, int]:
        return len(self.paths[i]), int(self.labels[i])


def memory_child(paths: int, workers: int, copies: bool) -> None:
    """Runs in a subprocess: one epoch, then prints the peak RSS in MiB."""
    if not copies:
        import minato._task.runner as worker

        worker.worker_dataset = lambda dataset: dataset
    dataset = PathDataset(paths)
    loader = minato.DataLoader(dataset, batch_size=256, num_workers=workers, adaptive=False)
    delivered = sum(len(labels) for _, labels in loader)
    assert delivered == paths
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mib": peak_kib / 1024}))


def peak_mib(paths: int, workers: int, copies: bool) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", str(paths), str(workers), str(int(copies))],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mib"]


class Augmented(tud.Dataset):
    """torchvision's v2 ImageNet training transforms on a uint8 tensor
    (`decode=False`: transforms only, the worst case for a per-call cost),
    or on a JPEG decoded by PIL (`decode=True`: the standard pipeline)."""

    def __init__(self, n: int, decode: bool) -> None:
        from torchvision.transforms import v2

        self.n = n
        self.decode = decode
        if decode:
            sys.path.insert(0, str(Path(__file__).parent))
            from jpegs import generate_jpegs

            self.jpegs = generate_jpegs(16)
        self.image = torch.randint(0, 256, (3, 256, 256), dtype=torch.uint8)
        self.transform = v2.Compose(
            [
                v2.RandomResizedCrop(224, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.PILToTensor(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
            ]
        )

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if not self.decode:
            return self.transform(self.image)
        from PIL import Image

        with Image.open(io.BytesIO(self.jpegs[i % len(self.jpegs)])) as image:
            return self.transform(image.convert("RGB"))


class _NoMode:
    """Stands in for the per-thread generator mode when it is turned off."""

    def __init__(self, generator: object) -> None:
        pass

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def augment_rate(samples: int, decode: bool, system: str) -> float:
    """samples/s over one epoch; system: "on" or "off" (minato with the
    per-thread generator mode or without it), or "torch" (2 processes)."""
    import minato._task.runner as worker
    from minato._thread.generators import ThreadGenerator

    worker.ThreadGenerator = _NoMode if system == "off" else ThreadGenerator  # type: ignore[misc]
    dataset = Augmented(samples, decode)
    if system == "torch":
        loader = tud.DataLoader(dataset, batch_size=16, num_workers=2)
    else:
        loader = minato.DataLoader(dataset, batch_size=16, num_workers=2, adaptive=False)
    start = time.perf_counter()
    seen = sum(len(batch) for batch in loader)
    elapsed = time.perf_counter() - start
    worker.ThreadGenerator = ThreadGenerator  # type: ignore[misc]
    assert seen == samples
    return samples / elapsed


def ns_per_call(function: object, number: int = 200_000) -> float:
    return min(timeit.repeat(function, number=number, repeat=5)) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--paths", type=int, default=240_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--samples", type=int, default=800)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-child", nargs=3, type=int, metavar=("PATHS", "WORKERS", "COPIES"))
    args = parser.parse_args()
    if args.memory_child:
        paths, workers, copies = args.memory_child
        memory_child(paths, workers, bool(copies))
        return

    print(
        f"# isolation: torch {torch.__version__}, Python {platform.python_version()}, "
        f"{args.repeats} repeats"
    )
    print(f"\n1. peak RSS, {args.paths:,} paths, {args.workers} workers, one epoch (MiB)")
    shared = [peak_mib(args.paths, args.workers, copies=False) for _ in range(args.repeats)]
    copied = [peak_mib(args.paths, args.workers, copies=True) for _ in range(args.repeats)]
    print(f"  shared dataset (before): median {statistics.median(shared):7.1f}  runs {shared}")
    print(f"  per-worker copies (now): median {statistics.median(copied):7.1f}  runs {copied}")
    print(f"  difference: {statistics.median(copied) - statistics.median(shared):+.1f} MiB")

    print(f"\n2. torchvision v2 augmentations, {args.samples} samples, 2 workers (samples/s)")
    for decode in (False, True):
        augment_rate(200, decode, "on")  # warm-up: imports, first allocations
        rates: dict[str, list[float]] = {"off": [], "on": [], "torch": []}
        for _ in range(args.repeats):
            for system in rates:
                rates[system].append(augment_rate(args.samples, decode, system))
        median = {system: statistics.median(values) for system, values in rates.items()}
        print(f"  {'PIL decode + transforms' if decode else 'transforms on a tensor'}:")
        print(f"    minato, shared torch generator: median {median['off']:7.1f}")
        print(f"    minato, per-thread generator:   median {median['on']:7.1f}")
        print(f"    torch, 2 processes:             median {median['torch']:7.1f}")
        print(
            f"    per-thread / shared: {median['on'] / median['off']:.3f}x   "
            f"minato per-thread / torch: {median['on'] / median['torch']:.3f}x"
        )

    import random

    print("\n3. the training loop's calls (ns per call, best of 5)")
    for name, patched, original in (
        ("random.random()", random.random, random.random.__wrapped__),
        ("numpy.random.rand()", np.random.rand, np.random.rand.__wrapped__),
    ):
        before, after = ns_per_call(original), ns_per_call(patched)
        print(
            f"  {name:22s} original {before:6.1f}   dispatching {after:6.1f}"
            f"   +{after - before:.1f}"
        )


if __name__ == "__main__":
    main()
