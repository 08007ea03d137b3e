"""Data-parallel training under torchrun, with minato's DataLoader.

    torchrun --nproc_per_node 2 examples/torchrun_ddp.py [--epochs 3] [--workers 2]

(``python -m torch.distributed.run ...`` is the same command.) It runs on CPU
with the gloo backend; run as ``python examples/torchrun_ddp.py`` it trains as
a group of one process.

The only change from a plain torch script is the import::

    from minato import DataLoader  # was: from torch.utils.data import DataLoader

The rest is the usual recipe: a DistributedSampler gives each rank its shard
of the dataset, ``set_epoch`` reshuffles it each epoch, DDP all-reduces the
gradients. Each rank's loader workers are threads of that rank's process, so
nothing is forked or pickled. Since the sampler shuffles, minato may hand the
shard's samples over in a different order (fast ones first); each rank still
gets its whole shard, once, and as many batches as the other ranks.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch
import torch.distributed as dist
import torch.utils.data as tud
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from minato import DataLoader  # was: from torch.utils.data import DataLoader


class Blobs(tud.Dataset):
    """Noisy points around one centre per class. Item i is (features, label, i):
    the index is there only to check that every sample is seen once."""

    def __init__(self, n: int = 2048, features: int = 32, classes: int = 8) -> None:
        generator = torch.Generator().manual_seed(0)
        centres = torch.randn(classes, features, generator=generator) * 2
        self.labels = torch.randint(classes, (n,), generator=generator)
        self.features = centres[self.labels] + torch.randn(n, features, generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.features[i], self.labels[i], i


def init_process_group() -> None:
    """torchrun's environment when there is one, else a group of one process."""
    try:
        dist.init_process_group("gloo")
    except ValueError:
        # No RANK/WORLD_SIZE/MASTER_ADDR: started without torchrun.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def train(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank

    dataset = Blobs()
    sampler = tud.DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers
    )
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle, the same on every rank
        started = time.perf_counter()
        # Summed over the ranks below: [loss sum, correct, samples], and each index's count.
        totals = torch.zeros(3)
        seen = torch.zeros(len(dataset), dtype=torch.int64)
        for features, labels, indices in loader:
            optimizer.zero_grad()
            logits = model(features)
            loss = nn.functional.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            totals += torch.tensor(
                [loss.item() * len(labels), (logits.argmax(1) == labels).sum().item(), len(labels)]
            )
            seen[indices] += 1
        dist.all_reduce(totals)
        dist.all_reduce(seen)
        # DistributedSampler pads the shards to equal sizes; here they divide evenly.
        assert bool((seen == 1).all()), "a sample was missed or seen twice"
        if rank == 0:
            loss_mean, accuracy = totals[0] / totals[2], totals[1] / totals[2]
            ranks = f"{world} rank{'s' if world > 1 else ''}"
            print(
                f"epoch {epoch}: loss {loss_mean:.3f}, accuracy {accuracy:.3f}, "
                f"{time.perf_counter() - started:.2f} s, "
                f"each sample once per epoch across {ranks}",
                flush=True,
            )
    if rank == 0:
        # Where the time went (print(loader.stats()) shows a table).
        print(loader.stats().summary(), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    init_process_group()
    train(args)
    # The DDP model holds the process group and sits in reference cycles:
    # collect it before destroying the group. A group still held at exit can
    # abort the process ("terminate called without an active exception",
    # gloo, torch 2.15), with or without minato.
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
