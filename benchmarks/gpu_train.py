"""ResNet-50 training steps fed three ways, side by side in one run (needs a GPU).

(a) headspace: one fixed synthetic batch already on the GPU — the most the
    model can consume (SPDL's headspace analysis);
(b) torch's DataLoader: PIL decode + torchvision Resize, num_workers = CPU
    cores, pin_memory=True, batches moved with .to(device, non_blocking=True);
(c) minato: minato.io decode + resize, device="cuda" (pinned collate, copies
    on a side stream).

All on generated JPEGs (300-900 px, resized to 224x224), bf16 autocast,
channels_last, SGD. Prints images/s and mean GPU utilisation (NVML through
torch.cuda.utilization, else nvidia-smi) for each.

    python benchmarks/gpu_train.py [--images 2048] [--steps 60] [--batch 128]
    python benchmarks/gpu_train.py --device cpu --model resnet18 --images 64 --steps 3 --batch 8
        (a smoke run of the script itself on a machine without a GPU)
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator

import torch
import torch.utils.data as tud
import torchvision
from jpegs import generate_jpegs
from PIL import Image
from torchvision import transforms

import minato
import minato.io

SIZE = (224, 224)


class PilImages(tud.Dataset):
    def __init__(self, images: list[bytes]) -> None:
        self.images = images
        self.resize = transforms.Resize(SIZE, antialias=True)
        self.to_tensor = transforms.PILToTensor()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = Image.open(io.BytesIO(self.images[i])).convert("RGB")
        return self.to_tensor(self.resize(image)), i % 1000


class MinatoImages(tud.Dataset):
    def __init__(self, images: list[bytes]) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        pixels = minato.io.decode_image(self.images[i], size=SIZE)  # HWC uint8
        return torch.from_numpy(pixels).permute(2, 0, 1), i % 1000


class Utilisation:
    """Samples GPU utilisation (%) every 100 ms while running."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> float | None:
        try:
            return float(torch.cuda.utilization(self.device))
        except Exception:
            pass
        try:
            index = self.device.index or 0
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.split()
            return float(out[index])
        except Exception:
            return None

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            value = self._read()
            if value is not None:
                self.samples.append(value)

    def __enter__(self) -> Utilisation:
        if self.device.type == "cuda":
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


def batches_forever(loader: Iterable) -> Iterator:
    while True:
        yield from loader


def train(
    model: torch.nn.Module,
    batches: Iterator,
    steps: int,
    warmup: int,
    batch: int,
    device: torch.device,
) -> tuple[float, float | None]:
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def step() -> None:
        images, labels = next(batches)
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        images = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with Utilisation(device) as utilisation:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
    return steps * batch / elapsed, utilisation.mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    images = generate_jpegs(args.images)
    print(
        f"# gpu_train: {args.model}, bf16, channels_last, batch {args.batch}, "
        f"{args.steps} steps after {args.warmup}; {len(images)} JPEGs -> {SIZE}; "
        f"{args.workers} CPU workers; torch {torch.__version__}, torchvision "
        f"{torchvision.__version__}; "
        + (torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU")
    )

    def fresh_model() -> torch.nn.Module:
        torch.manual_seed(0)
        model = getattr(torchvision.models, args.model)(num_classes=1000)
        return model.to(device, memory_format=torch.channels_last).train()

    fixed = (
        torch.randint(0, 256, (args.batch, 3, *SIZE), dtype=torch.uint8, device=device),
        torch.randint(0, 1000, (args.batch,), device=device),
    )

    def repeat_fixed() -> Iterator:
        while True:
            yield fixed

    common = dict(batch=args.batch, device=device, steps=args.steps, warmup=args.warmup)
    results: dict[str, tuple[float, float | None]] = {}
    results["(a) fixed batch on the GPU"] = train(fresh_model(), repeat_fixed(), **common)
    torch_loader = tud.DataLoader(
        PilImages(images),
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=True,
        drop_last=True,
    )
    results["(b) torch DataLoader + PIL"] = train(
        fresh_model(), batches_forever(torch_loader), **common
    )
    minato_loader = minato.DataLoader(
        MinatoImages(images),
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=True,
        drop_last=True,
        device=device if device.type == "cuda" else None,
    )
    results["(c) minato + minato.io, device=cuda"] = train(
        fresh_model(), batches_forever(minato_loader), **common
    )
    best = results["(a) fixed batch on the GPU"][0]
    for name, (rate, utilisation) in results.items():
        gpu = "n/a" if utilisation is None else f"{utilisation:5.1f}%"
        print(f"  {name:<40} {rate:8.1f} images/s  {rate / best:6.1%} of (a)  GPU util {gpu}")
    print(minato_loader.stats())


if __name__ == "__main__":
    main()
