"""What minato's defaults choose, and how fast, beside torch and minato's forced modes.

Four datasets, 2 workers, batch 16, shuffled; for each system a persistent
loader read for four epochs, then a second loader over the same dataset
type read for one (an evaluation loader, or one re-created each epoch);
``--not-persistent``: the first loader's workers anew each epoch, torch's
default:

- gil-bound: pure Python, about 1.5 ms a sample (parsing, tokenising);
- i/o: a GIL-free 2 ms sleep returning a 64x64x3 tensor (file or network reads);
- compute: hashlib over 4 MB, the GIL released (as a C decoder releases it);
- pil: gpu_train's torchvision pipeline (PIL decode + Resize to 224 +
  PILToTensor of generated 300-900 px JPEGs).

Systems: torch's DataLoader (processes), minato's defaults, minato forced to
threads, minato forced to worker processes. samples/s per epoch and the
method minato's defaults ended on. Every system runs in this one process, in
turn; the fork server is started (and waited for) first, so every row pays
the same; minato's remembered decisions are forgotten before each defaults
row (a fresh process would have none).

    python benchmarks/defaults.py [--only gil-bound pil] [--samples 768] [--not-persistent]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
import warnings

import torch
import torch.utils.data as tud
from gpu_train import PilImages, generate_in_parallel

import minato
from minato._process import method as _method
from minato._process.workers import fork_server_ready, warm_up


class GilBound(tud.Dataset):
    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        total = 0
        for k in range(20000):
            total += k * index % 7
        return torch.tensor([total]), index


class Io(tud.Dataset):
    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.002)
        return torch.zeros(64, 64, 3, dtype=torch.uint8), index


class Compute(tud.Dataset):
    data = bytes(4_000_000)

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        digest = hashlib.sha256(self.data).digest()
        return torch.tensor(list(digest[:4])), index


def epoch_rate(loader: tud.DataLoader) -> float:
    started = time.perf_counter()
    samples = 0
    for _, indices in loader:
        samples += len(indices)
    return samples / (time.perf_counter() - started)


SYSTEMS = {
    "torch's DataLoader": (tud.DataLoader, {}),
    "minato defaults": (minato.DataLoader, {}),
    "minato threads": (minato.DataLoader, {"worker_method": "thread"}),
    "minato processes": (minato.DataLoader, {"worker_method": "multiprocessing"}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=768)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=["gil-bound", "i/o", "compute", "pil"])
    parser.add_argument(
        "--not-persistent",
        action="store_true",
        help="the first loader without persistent_workers (torch's default)",
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    warm_up([__name__, "gpu_train"])
    while not fork_server_ready([__name__, "gpu_train"]):
        time.sleep(0.05)
    images: list[bytes] = []
    datasets = {
        "gil-bound": lambda: GilBound(args.samples),
        "i/o": lambda: Io(args.samples),
        "compute": lambda: Compute(args.samples),
        "pil": lambda: PilImages(images),
    }
    print(
        f"# defaults: {args.workers} workers, batch 16, {args.samples} samples an epoch, "
        f"{args.epochs} epochs then a second loader's one; torch {torch.__version__}, "
        f"{os.cpu_count()} cores; samples/s per epoch"
    )
    for name, make in datasets.items():
        if args.only and name not in args.only:
            continue
        if name == "pil" and not images:
            images.extend(generate_in_parallel(args.samples, os.cpu_count() or 1))
        print(f"{name}:")
        for system, (loader_class, options) in SYSTEMS.items():
            getattr(_method, "_decided_for", {}).clear()

            def fresh(
                persistent: bool, loader_class=loader_class, make=make, options=options
            ) -> tud.DataLoader:
                return loader_class(
                    make(),
                    batch_size=16,
                    shuffle=True,
                    num_workers=args.workers,
                    persistent_workers=persistent,
                    **options,
                )

            loader = fresh(not args.not_persistent)
            rates = [epoch_rate(loader) for _ in range(args.epochs)]
            how = ""
            if isinstance(loader, minato.DataLoader):
                stats = loader.stats()
                how = f"  {stats.worker_method}: {stats.worker_method_reason}"
            del loader
            later = fresh(False)
            later_rate = epoch_rate(later)
            if isinstance(later, minato.DataLoader) and system == "minato defaults":
                how += f"\n{'':28s}later loader: {later.stats().worker_method}"
            del later
            epochs = " ".join(f"{rate:7,.0f}" for rate in rates)
            print(f"  {system:24s} {epochs} | later {later_rate:7,.0f}{how}", flush=True)


if __name__ == "__main__":
    main()
