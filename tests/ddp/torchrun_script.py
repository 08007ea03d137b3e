"""One rank of a torchrun job (CPU, gloo) training a tiny DDP model on
minato.DataLoader with a DistributedSampler; writes what it saw to
``<outdir>/rank<r>.json`` for tests/test_torchrun.py.

    python -m torch.distributed.run --nproc_per_node 2 --master_port <port> \\
        tests/ddp/torchrun_script.py <outdir>
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.data as tud
from torch.nn.parallel import DistributedDataParallel

import minato

N = 40
BATCH = 4
EPOCHS = 2


class IndexDataset(tud.Dataset):
    """Item i carries its index and which worker thread of which process loaded it."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = tud.get_worker_info()
        return {
            "index": i,
            "x": torch.full((4,), i / N),
            "worker": -1 if info is None else info.id,
            "pid": os.getpid(),
            "main_thread": threading.current_thread() is threading.main_thread(),
        }


def train(outdir: Path) -> None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = IndexDataset()
    sampler = tud.DistributedSampler(dataset, shuffle=True, seed=0)
    loader = minato.DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=2)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    seen: dict[int, list[int]] = defaultdict(list)
    batches: dict[int, int] = defaultdict(int)
    workers: set[int] = set()
    pids: set[int] = set()
    on_main_thread = False
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            # DDP all-reduces the gradients: every rank must take as many steps.
            model(batch["x"]).pow(2).mean().backward()
            optimizer.step()
            seen[epoch].extend(batch["index"].tolist())
            batches[epoch] += 1
            workers.update(batch["worker"].tolist())
            pids.update(batch["pid"].tolist())
            on_main_thread |= bool(batch["main_thread"].any())
    # The ranks' models stayed in step (all-reduced gradients, same start).
    weights = model.module.weight.detach().clone()
    gathered = [torch.empty_like(weights) for _ in range(world_size)]
    dist.all_gather(gathered, weights)
    record = {
        "rank": rank,
        "world_size": world_size,
        "pid": os.getpid(),
        "seen": seen,
        "batches": batches,
        "len_loader": len(loader),
        "workers": sorted(workers),
        "batch_pids": sorted(pids),
        "loaded_on_main_thread": on_main_thread,
        "reorders": loader.reorders(),
        "models_in_sync": all(torch.equal(weights, other) for other in gathered),
    }
    (outdir / f"rank{rank}.json").write_text(json.dumps(record))


def main(outdir: Path) -> None:
    dist.init_process_group("gloo")
    train(outdir)
    # The DDP model holds the process group and sits in reference cycles:
    # collect it before destroying the group, or gloo may abort the process
    # at exit ("terminate called without an active exception", torch 2.15).
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
