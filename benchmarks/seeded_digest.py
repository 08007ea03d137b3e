"""Does a seeded program read the same batches every run? One run per call.

gpu_train's (b)/(d) program with pytorch/examples imagenet's random training
transforms (RandomResizedCrop, RandomHorizontalFlip: drawn from torch's RNG
in each worker), seeded at the top as a user's program is, shuffled, pinned,
two epochs of a persistent loader. Prints a digest of every batch's pixels
and labels per epoch (not of losses: cuDNN is not deterministic). Run it
twice for each loader, each a fresh process: a faithful drop-in prints the
same digests both times, as torch does.

    python benchmarks/seeded_digest.py --loader torch
    python benchmarks/seeded_digest.py --loader minato [--option worker_method=multiprocessing]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import random

import numpy as np
import torch
import torch.utils.data as tud
from gpu_train import generate_in_parallel
from PIL import Image
from torchvision import transforms

import minato


class AugmentedPil(tud.Dataset):
    def __init__(self, images: list[bytes]) -> None:
        self.images = images
        self.transform = transforms.Compose(
            [
                transforms.RandomResizedCrop(224, antialias=True),
                transforms.RandomHorizontalFlip(),
                transforms.PILToTensor(),
            ]
        )

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = Image.open(io.BytesIO(self.images[i])).convert("RGB")
        return self.transform(image), i % 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loader", choices=["torch", "minato"], required=True)
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--option", action="append", default=[], help="NAME=VALUE for minato")
    args = parser.parse_args()
    images = generate_in_parallel(args.images, os.cpu_count() or 1)

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    options = {}
    for option in args.option:
        name, value = option.split("=", 1)
        options[name] = value
    loader_class = tud.DataLoader if args.loader == "torch" else minato.DataLoader
    loader = loader_class(
        AugmentedPil(images),
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=True,
        **options,
    )
    for epoch in range(args.epochs):
        digest = hashlib.sha256()
        for pixels, labels in loader:
            digest.update(pixels.numpy().tobytes())
            digest.update(labels.numpy().tobytes())
        print(f"{args.loader} {options or ''} epoch {epoch}: {digest.hexdigest()[:16]}", flush=True)
    if isinstance(loader, minato.DataLoader):
        stats = loader.stats()
        print(f"  worker method at the end: {stats.worker_method} ({stats.worker_method_reason})")


if __name__ == "__main__":
    main()
