"""minato.io against PIL + torchvision and numpy.load, side by side in one run.

- Images: 600 generated JPEGs of 300-900 px a side, decoded and resized to
  224x224 (RGB): PIL + torchvision's Resize, and minato.io.decode_image, on 1
  and 2 threads; minato.io.decode_images (one call per batch of 32); then
  through a full DataLoader (batch 32, 2 workers): torch's with PIL,
  minato's with PIL, minato's with minato.io.
- Arrays: 600 NPY files of float32 (3, 224, 224) held as bytes: numpy.load on
  an io.BytesIO against minato.io.load_npy, on 2 threads.

    python benchmarks/io.py [--images 600] [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.utils.data as tud
from jpegs import generate_jpegs
from PIL import Image
from torchvision import transforms

import minato
import minato.io

SIZE = (224, 224)
BATCH = 32


RESIZE = transforms.Resize(SIZE, antialias=True)
TO_TENSOR = transforms.PILToTensor()


def pil_decode(data: bytes) -> torch.Tensor:
    return TO_TENSOR(RESIZE(Image.open(io.BytesIO(data)).convert("RGB")))


def minato_decode(data: bytes) -> torch.Tensor:
    return torch.from_numpy(minato.io.decode_image(data, size=SIZE))


def per_second(run: Callable[[], int], repeats: int) -> float:
    """Median items/s over `repeats` runs of `run` (which returns its item count)."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        count = run()
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)


def on_threads(function: Callable[[bytes], object], items: Sequence[bytes], threads: int):
    """Runs `function` over `items` on `threads` threads, each looping over its
    own share (no executor between calls: its per-call overhead would be
    measured too)."""

    def loop(share: Sequence[bytes]) -> None:
        for item in share:
            function(item)

    def run() -> int:
        workers = [threading.Thread(target=loop, args=(items[i::threads],)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return len(items)

    return run


class JpegDataset(tud.Dataset):
    def __init__(self, images: list[bytes], decode: Callable[[bytes], torch.Tensor]) -> None:
        self.images = images
        self.decode = decode

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.decode(self.images[i])


def through_loader(loader_class: type, dataset: tud.Dataset, **options: object):
    def run() -> int:
        loader = loader_class(dataset, batch_size=BATCH, num_workers=2, **options)
        count = 0
        for batch in loader:
            count += len(batch)
        return count

    return run


def generate_npys(count: int) -> list[bytes]:
    rng = np.random.default_rng(1)
    arrays = []
    for _ in range(count):
        buffer = io.BytesIO()
        np.save(buffer, rng.random((3, *SIZE), dtype=np.float32))
        arrays.append(buffer.getvalue())
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    repeats = args.repeats
    images = generate_jpegs(args.images)
    mean_kb = sum(map(len, images)) / len(images) / 1024
    print(
        f"# io: {len(images)} JPEGs of 300-900 px (mean {mean_kb:.0f} KiB) -> {SIZE}, "
        f"median of {repeats}; torch {torch.__version__}, {os.cpu_count()} cores"
    )

    rates: dict[str, float] = {}

    def report(name: str, rate: float) -> None:
        rates[name] = rate
        print(f"  {name:<40} {rate:8.0f} images/s", flush=True)

    print("\nimages/s, decode + resize to 224x224")
    report("PIL + torchvision, 1 thread", per_second(on_threads(pil_decode, images, 1), repeats))
    report("PIL + torchvision, 2 threads", per_second(on_threads(pil_decode, images, 2), repeats))
    report("minato.io, 1 thread", per_second(on_threads(minato_decode, images, 1), repeats))
    report("minato.io, 2 threads", per_second(on_threads(minato_decode, images, 2), repeats))

    def batched() -> int:
        for start in range(0, len(images), BATCH):
            minato.io.decode_images(images[start : start + BATCH], size=SIZE)
        return len(images)

    report("minato.io.decode_images, batches of 32", per_second(batched, repeats))

    print("\nthrough a DataLoader (batch 32, 2 workers)")
    pil_set, minato_set = JpegDataset(images, pil_decode), JpegDataset(images, minato_decode)
    report("torch DataLoader + PIL", per_second(through_loader(tud.DataLoader, pil_set), repeats))
    report(
        "minato DataLoader + PIL",
        per_second(through_loader(minato.DataLoader, pil_set), repeats),
    )
    report(
        "minato DataLoader + minato.io",
        per_second(through_loader(minato.DataLoader, minato_set), repeats),
    )

    print("\nratios (targets in brackets)")
    pil1, pil2 = rates["PIL + torchvision, 1 thread"], rates["PIL + torchvision, 2 threads"]
    ours1, ours2 = rates["minato.io, 1 thread"], rates["minato.io, 2 threads"]
    print(f"  minato.io / PIL, 1 thread:        {ours1 / pil1:5.2f}x  [>= 1.5x]")
    print(f"  minato.io / PIL, 2 threads:       {ours2 / pil2:5.2f}x")
    print(f"  minato.io 2 threads / 1 thread:   {ours2 / ours1:5.2f}x  [>= 1.85x]")
    print(f"  PIL 2 threads / 1 thread:         {pil2 / pil1:5.2f}x")
    loader_torch = rates["torch DataLoader + PIL"]
    print(
        f"  minato DataLoader + minato.io / torch DataLoader + PIL: "
        f"{rates['minato DataLoader + minato.io'] / loader_torch:5.2f}x"
    )

    arrays = generate_npys(args.images)
    print(f"\narrays/s, {len(arrays)} NPY float32 {(3, *SIZE)} from bytes, 2 threads")

    def numpy_load(data: bytes) -> np.ndarray:
        return np.load(io.BytesIO(data))

    numpy_rate = per_second(on_threads(numpy_load, arrays, 2), repeats)
    ours_rate = per_second(on_threads(minato.io.load_npy, arrays, 2), repeats)
    print(f"  {'numpy.load(BytesIO)':<40} {numpy_rate:8.0f} arrays/s")
    print(f"  {'minato.io.load_npy':<40} {ours_rate:8.0f} arrays/s")
    print(f"  load_npy / numpy.load:            {ours_rate / numpy_rate:5.1f}x  [>= 5x]")


if __name__ == "__main__":
    main()
