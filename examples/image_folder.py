"""Image-folder classification on minato.io and minato's DataLoader.

A dataset laid out as torchvision's ImageFolder expects (root/<class>/<image>)
is decoded and resized in Rust with the GIL released, so minato's worker
threads decode in parallel. Without a folder, a small one is generated.

    python examples/image_folder.py [ROOT] [--epochs 2] [--size 64]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.utils.data as tud
from torch import nn

import minato.io
from minato import DataLoader

EXTENSIONS = {".jpg", ".jpeg", ".png", ".webp"}


class ImageFolder(tud.Dataset):
    """(image, class index) pairs from root/<class>/<file>, classes sorted by name."""

    def __init__(self, root: str | Path, size: tuple[int, int]) -> None:
        root = Path(root)
        self.classes = sorted(entry.name for entry in root.iterdir() if entry.is_dir())
        self.samples = [
            (path, label)
            for label, name in enumerate(self.classes)
            for path in sorted((root / name).iterdir())
            if path.suffix.lower() in EXTENSIONS
        ]
        self.size = size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        # Read, decoded and resized in Rust, GIL released; (H, W, 3) uint8.
        pixels = torch.from_numpy(minato.io.decode_image(path, size=self.size))
        image = pixels.permute(2, 0, 1).float().div_(255)
        return image, label


def generate_folder(root: Path, per_class: int = 96) -> None:
    """Two classes told apart by colour: reddish and bluish noisy pictures."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, name in enumerate(["red", "blue"]):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            height, width = rng.integers(120, 320, size=2)
            pixels = rng.normal(110, 40, (height, width, 3))
            pixels[..., 0 if label == 0 else 2] += 60
            image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
            image.save(root / name / f"{i:04d}.jpg", quality=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", help="an ImageFolder-style directory")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.root) if args.root else Path(scratch) / "images"
        if not args.root:
            generate_folder(root)
        dataset = ImageFolder(root, (args.size, args.size))
        loader = DataLoader(
            dataset, batch_size=32, shuffle=True, num_workers=args.workers, persistent_workers=True
        )
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, len(dataset.classes)),
        )
        optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
        print(f"{len(dataset)} images, classes {dataset.classes}, {args.workers} workers")
        for epoch in range(args.epochs):
            start, correct = time.perf_counter(), 0
            for images, labels in loader:
                logits = model(images)
                loss = nn.functional.cross_entropy(logits, labels)
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                correct += int((logits.argmax(1) == labels).sum())
            elapsed = time.perf_counter() - start
            print(
                f"epoch {epoch}: {elapsed:.2f} s, accuracy {correct / len(dataset):.3f}, "
                f"{len(dataset) / elapsed:.0f} images/s"
            )
        print(loader.stats())


if __name__ == "__main__":
    main()
