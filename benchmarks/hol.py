"""Head-of-line blocking: epoch time against the ideal bound, every system side by side.

Workloads scaled down from the MinatoLoader paper's Speech-3s and Speech-10s
(every sample sleeps a LightStep of 10 ms, every 5th an extra HeavyStep of
60 ms or 200 ms; 960 samples, batch_size 24, 12 workers, shuffle=True), and a
CPU-bound variant whose per-sample work releases the GIL (numpy sorts, every
5th sample ten times longer) on 2 workers. The ideal bound is the total
sample cost divided by the workers. Each workload runs once with a consumer
that only takes batches, and once with one that spends a training step per
batch (a GIL-free sleep, as a GPU step is) as long as the data time, whose
bound is max(data bound, compute bound).

    python benchmarks/hol.py [--only speech-10s] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import numpy as np
import torch
import torch.utils.data as tud

import minato

SAMPLES, BATCH = 960, 24


class SpeechLike(tud.Dataset):
    def __init__(self, heavy_s: float) -> None:
        self.heavy_s = heavy_s

    def __len__(self) -> int:
        return SAMPLES

    def cost(self, i: int) -> float:
        return 0.010 + (self.heavy_s if i % 5 == 0 else 0.0)

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.cost(i))
        return torch.tensor([i])


class CpuSkewed(tud.Dataset):
    """numpy sorts (GIL released); every 5th sample does ten times the work."""

    def __init__(self, samples: int = 240, size: int = 60_000) -> None:
        self.samples, self.size = samples, size
        self.data = np.random.default_rng(0).random(size * 10)

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> torch.Tensor:
        n = self.size * (10 if i % 5 == 0 else 1)
        np.sort(self.data[:n], kind="stable")
        return torch.tensor([i])


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def consume(batches, step_s: float) -> tuple[float, int, int]:
    """Epoch time, samples seen and peak extra OS threads."""
    base = thread_count()
    peak = 0
    start = time.perf_counter()
    seen = 0
    for batch in batches:
        seen += len(batch)
        peak = max(peak, thread_count() - base)
        if step_s:
            time.sleep(step_s)
    return time.perf_counter() - start, seen, peak


def run_minato(ds, workers, step_s, **options):
    loader = minato.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers, **options)
    elapsed, seen, peak = consume(loader, step_s)
    # Samples that left their batch, late (in_order=None); absent before that build.
    moved = getattr(loader.stats(), "moved_samples", None)
    return elapsed, seen, peak, moved


def run_torch(ds, workers, step_s, in_order=True):
    loader = tud.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, in_order=in_order
    )
    return consume(loader, step_s)


def run_torchdata(ds, workers, step_s):
    import torchdata.nodes as tn

    node = tn.SamplerWrapper(tud.RandomSampler(ds))
    node = tn.ParallelMapper(
        node, ds.__getitem__, num_workers=workers, method="thread", in_order=False
    )
    node = tn.Batcher(node, batch_size=BATCH, drop_last=False)
    node = tn.Mapper(node, tud.default_collate)
    return consume(tn.Loader(node), step_s)


def run_spdl(ds, workers, step_s):
    from spdl.pipeline import PipelineBuilder

    order = torch.randperm(len(ds)).tolist()
    pipeline = (
        PipelineBuilder()
        .add_source(order)
        .pipe(ds.__getitem__, concurrency=workers, output_order="completion")
        .aggregate(BATCH)
        .pipe(tud.default_collate)
        .add_sink(3)
        .build(num_threads=workers)
    )
    with pipeline.auto_stop():
        return consume(pipeline, step_s)


SYSTEMS = {
    "minato": run_minato,
    # Reordering alone, exactly `workers` threads, as the peers get: no
    # replacement for a worker stuck on a slow sample, no adaptive pool.
    "minato no replacements": lambda ds, w, s: run_minato(
        ds, w, s, max_slow_samples=0, adaptive=False
    ),
    "torch in_order=True": run_torch,
    "torch in_order=False": lambda ds, w, s: run_torch(ds, w, s, in_order=False),
    "torchdata.nodes": run_torchdata,
    "spdl": run_spdl,
}


def sequential_cost(ds) -> float:
    if isinstance(ds, SpeechLike):
        return sum(ds.cost(i) for i in range(len(ds)))
    start = time.perf_counter()
    for i in range(len(ds)):
        ds[i]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["speech-3s", "speech-10s", "cpu"], action="append")
    parser.add_argument("--repeats", type=int, default=1, help="median of this many epochs")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    workloads = {
        "speech-3s": (lambda: SpeechLike(0.060), 12),
        "speech-10s": (lambda: SpeechLike(0.200), 12),
        "cpu": (CpuSkewed, 2),
    }
    print(f"# hol: torch {torch.__version__}, {os.cpu_count()} cores, median of {args.repeats}")
    for name, (make, workers) in workloads.items():
        if args.only and name not in args.only:
            continue
        ds = make()
        bound = sequential_cost(ds) / workers
        batches = -(-len(ds) // BATCH)
        for step_s in (0.0, bound / batches):
            consumer = "data only" if not step_s else f"with a {step_s * 1e3:.0f} ms step per batch"
            print(
                f"\n{name}: {len(ds)} samples, {workers} workers, {consumer}; ideal {bound:.2f} s"
            )
            for system, run in SYSTEMS.items():
                runs = [run(ds, workers, step_s) for _ in range(args.repeats)]
                elapsed = statistics.median(r[0] for r in runs)
                assert all(r[1] == len(ds) for r in runs), system
                peak = max(r[2] for r in runs)
                moved = [r[3] for r in runs if len(r) > 3 and r[3] is not None]
                print(
                    f"  {system:<22} {elapsed:6.2f} s  {elapsed / bound:5.2f}x bound"
                    f"   peak threads +{peak}" + (f"   moved {moved}" if moved else "")
                )


if __name__ == "__main__":
    main()
