"""Train a small model for a few epochs, once with torch's DataLoader and once
with minato's, on a generated dataset whose per-sample cost varies.

    python examples/demo.py [--epochs 3] [--samples 1536] [--workers 4]

The only difference between the two runs is the import.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
import torch.utils.data as tud
from torch import nn

import minato


class VariableCostDataset(tud.Dataset):
    """Feature vectors whose loading cost varies, as real samples' does: every
    sample waits 1 ms (storage) and does a little numpy work; every 8th also
    waits 15 ms more (a large file, a slow decode)."""

    def __init__(self, n: int, features: int = 64, classes: int = 10) -> None:
        self.n, self.features, self.classes = n, features, classes
        rng = np.random.default_rng(0)
        self.centres = rng.normal(size=(classes, features)).astype(np.float32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.016 if i % 8 == 0 else 0.001)
        label = i % self.classes
        noise = np.random.default_rng(i).normal(size=self.features).astype(np.float32)
        return torch.from_numpy(self.centres[label] + noise), label


def train(
    loader_cls: type, dataset: tud.Dataset, epochs: int, workers: int, device: torch.device
) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = loader_cls(
        dataset, batch_size=32, shuffle=True, num_workers=workers, pin_memory=device.type == "cuda"
    )
    times = []
    for epoch in range(epochs):
        start = time.perf_counter()
        correct = seen = 0
        for features, labels in loader:
            features = features.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            logits = model(features)
            loss = nn.functional.cross_entropy(logits, labels)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            correct += (logits.argmax(1) == labels).sum().item()
            seen += len(labels)
        times.append(time.perf_counter() - start)
        name = f"{loader_cls.__module__.split('.')[0]}.DataLoader"
        print(f"  {name:<22} epoch {epoch}: {times[-1]:6.2f} s   accuracy {correct / seen:.3f}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = VariableCostDataset(args.samples)
    print(
        f"Training on {device}: {args.samples} samples, batch 32, {args.workers} workers, "
        f"shuffle=True, {args.epochs} epochs"
    )
    results = {}
    for loader_cls in (tud.DataLoader, minato.DataLoader):
        results[loader_cls] = train(loader_cls, dataset, args.epochs, args.workers, device)
    torch_total, minato_total = sum(results[tud.DataLoader]), sum(results[minato.DataLoader])
    print(
        f"\ntotal: torch {torch_total:.2f} s, minato {minato_total:.2f} s "
        f"({torch_total / minato_total:.2f}x)"
    )


if __name__ == "__main__":
    main()
