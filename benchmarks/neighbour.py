"""The noisy neighbour: what the loader's workers do to a GPU-like training loop.

A GPU training step is, on the CPU, Python and op dispatch (the GIL held),
then a wait for the device (the GIL released). The loop here does the same
without a GPU: each step runs thousands of tiny torch ops, then sleeps for
three times as long as they take alone (the GPU's share of the step: fixed,
as the device's time does not grow when the CPU side is slowed). The loader
is the standard torchvision ImageNet pipeline (PIL decode,
RandomResizedCrop(224), flip, ToDtype, Normalize) over generated JPEGs,
batch 16, shuffled.

For each case, every system side by side in one run:
- data: the epoch iterated alone (loader start included);
- steps: the same number of steps alone, on one fixed batch;
- total: the epoch with a step per batch;
- ratio = total / max(data, steps): 1.0 is perfect overlap;
- step x: the mean step inside the loop against the step alone.

With ``--device cuda`` the step is real GPU work: the tiny ops run on the
GPU (each a kernel launch), the batch is copied there, and matmuls sized to
the same share run before a synchronize (which waits with the GIL
released).

Cases: compute-bound (a step is 1.5x the data time of a batch, measured on
torch with the same worker count) and data-bound (0.3x), 1 and 2 workers.

``--repeats N`` runs each case's systems N times, alternated (torch,
minato, torch, minato...), and prints each system's medians with the
spread of its totals: a run of 10 batches lasts about a second, and one
run's ratio moves by more than the differences between systems.

    python benchmarks/neighbour.py [--batches 40] [--only compute] [--workers 1 2] [--repeats 1]
    python benchmarks/neighbour.py --device cuda --workers 2 8
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

import torch
import torch.utils.data as tud
from jpegs import generate_jpegs
from PIL import Image
from torchvision.transforms import v2

import minato

BATCH = 16
GPU_SHARE = 3.0  # the sleep after the ops, as a multiple of their CPU time


class ImageNetLike(tud.Dataset):
    def __init__(self, images: list[bytes], length: int) -> None:
        self.images = images
        self.length = length
        self.transform = v2.Compose(
            [
                v2.RandomResizedCrop(224, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.PILToTensor(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
            ]
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = Image.open(io.BytesIO(self.images[i % len(self.images)])).convert("RGB")
        return self.transform(image), i % 1000


class Step:
    """`ops` tiny torch ops (dispatch, the GIL held), then the device's share,
    GPU_SHARE times their duration alone, the GIL released: a sleep on the
    CPU; on a GPU (``--device cuda``) the ops and the batch's copy run
    there, then matmuls sized to that share and a synchronize."""

    def __init__(self, ops: int, device: torch.device) -> None:
        self.ops = ops
        self.device = device
        self.weight = torch.ones(8, device=device)
        self.matmuls = 0
        self.device_s = 0.0
        dispatch = min(self._dispatch() for _ in range(5))
        self.device_s = GPU_SHARE * dispatch
        if device.type == "cuda":
            self.square = torch.randn(2048, 2048, device=device)
            self.matmuls = max(1, round(self.device_s / self._one_matmul()))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _ops(self) -> None:
        x = self.weight
        for _ in range(self.ops):
            x = x.mul(1.0001).add(0.0001)

    def _dispatch(self) -> float:
        self._sync()
        began = time.perf_counter()
        self._ops()
        self._sync()
        return time.perf_counter() - began

    def _one_matmul(self) -> float:
        runs = []
        for _ in range(5):
            self._sync()
            began = time.perf_counter()
            self.square @ self.square
            self._sync()
            runs.append(time.perf_counter() - began)
        return min(runs)

    def __call__(self, batch: object) -> float:
        began = time.perf_counter()
        if self.device.type == "cuda":
            if batch is not None:
                images, labels = batch
                images.to(self.device, non_blocking=True)
                labels.to(self.device, non_blocking=True)
            self._ops()
            for _ in range(self.matmuls):
                self.square @ self.square
            self._sync()  # waits with the GIL released, as a training step does
        else:
            self._dispatch()
            time.sleep(self.device_s)
        return time.perf_counter() - began


def ops_for(seconds: float, device: torch.device) -> int:
    """Ops whose step (ops plus the device's share) takes `seconds` alone."""
    probe = Step(2000, device)
    took = min(probe(None) for _ in range(3))
    return max(100, int(2000 * seconds / took))


def make(system: str, dataset: tud.Dataset, workers: int) -> tud.DataLoader:
    cls = tud.DataLoader if system == "torch" else minato.DataLoader
    extra = {}
    if system.startswith("minato "):
        extra["worker_method"] = system.split()[1]
    return cls(dataset, batch_size=BATCH, shuffle=True, num_workers=workers, **extra)


def data_alone(system: str, dataset: tud.Dataset, workers: int) -> float:
    began = time.perf_counter()
    loader = make(system, dataset, workers)
    for _ in loader:
        pass
    took = time.perf_counter() - began
    del loader
    return took


def steps_alone(step: Step, batches: int) -> tuple[float, float]:
    # A batch of the loader's shape, for the copy a GPU step makes.
    batch = (torch.zeros(BATCH, 3, 224, 224), torch.zeros(BATCH, dtype=torch.long))
    began = time.perf_counter()
    times = [step(batch) for _ in range(batches)]
    return time.perf_counter() - began, statistics.mean(times)


def total(system: str, dataset: tud.Dataset, workers: int, step: Step) -> tuple[float, float, str]:
    began = time.perf_counter()
    loader = make(system, dataset, workers)
    times = [step(batch) for batch in loader]
    took = time.perf_counter() - began
    how = ""
    if system != "torch":
        stats = loader.stats()
        peak = max((n for _, n in stats.worker_history), default=0)
        reason = (stats.worker_method_reason or "")[:90]
        how = f"{stats.worker_method}, peak {peak} workers ({reason})"
    del loader
    return took, statistics.mean(times), how


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--only", choices=["compute", "data"])
    parser.add_argument("--systems", nargs="+", default=["torch", "minato"])
    parser.add_argument("--device", default="cpu", help="cuda: the steps run on a real GPU")
    parser.add_argument("--repeats", type=int, default=1, help="alternated runs per system")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)
    print(
        f"minato {minato.__version__}, torch {torch.__version__}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.2f}"
        + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "")
    )
    images = generate_jpegs(64)
    dataset = ImageNetLike(images, args.batches * BATCH)
    cases = [c for c in ("compute", "data") if args.only in (None, c)]
    for workers in args.workers:
        # The data time of a batch, on torch's DataLoader, sets the step.
        per_batch = data_alone("torch", dataset, workers) / args.batches
        for case in cases:
            share = 1.5 if case == "compute" else 0.3
            step = Step(ops_for(share * per_batch, device), device)
            steps, step_alone = steps_alone(step, args.batches)
            print(
                f"\n{case}-bound, {workers} worker(s): {args.batches} batches, "
                f"step {1000 * step_alone:.0f} ms alone ({step.ops} ops), "
                f"torch data {1000 * per_batch:.0f} ms/batch"
            )
            print(
                f"  {'system':16s} {'data s':>7s} {'steps s':>7s} {'total s':>7s} "
                f"{'ratio':>6s} {'step x':>6s}  how"
            )
            runs: dict[str, list[tuple[float, float, float, str]]] = {s: [] for s in args.systems}
            for _ in range(args.repeats):
                for system in args.systems:
                    data = data_alone(system, dataset, workers)
                    took, step_in_loop, how = total(system, dataset, workers, step)
                    runs[system].append((data, took, step_in_loop, how))
            for system, measured in runs.items():
                data = statistics.median(run[0] for run in measured)
                took = statistics.median(run[1] for run in measured)
                ratio = statistics.median(run[1] / max(run[0], steps) for run in measured)
                step_x = statistics.median(run[2] for run in measured) / step_alone
                spread = ""
                if len(measured) > 1:
                    totals = sorted(run[1] for run in measured)
                    spread = f" (totals {totals[0]:.2f}-{totals[-1]:.2f})"
                print(
                    f"  {system:16s} {data:7.2f} {steps:7.2f} {took:7.2f} "
                    f"{ratio:6.2f} {step_x:6.2f}  {measured[-1][3]}{spread}"
                )


if __name__ == "__main__":
    main()
