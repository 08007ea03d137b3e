"""One Lightning DDP run (2 CPU processes, gloo) on minato.DataLoader; each rank
writes what it saw to ``<outdir>/rank<r>.json`` for tests/test_lightning.py.

    MASTER_PORT=<free port> python tests/ddp/lightning_ddp_script.py <outdir>

Lightning's "ddp" strategy starts rank 1 by running this same command again
(with LOCAL_RANK set), which is why it is a script and not a test function.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.utils.data as tud
from lightning.pytorch.strategies import DDPStrategy

import minato

N = 40
BATCH = 4
EPOCHS = 2
MINATO_OPTIONS: dict[str, Any] = {"sample_timeout": 0.5, "max_workers": 7, "adaptive": False}
# This run is about sharding: auto's choice is pinned. Its samples' CPU
# cost on the first loader of a quiet process (one-off costs in the mean)
# read a hair under the line where a loop that sets the pace (a DDP step
# waiting on the other rank) gets a trial on processes; two ranks on a
# loaded CI machine crossed it once (benchmarks/RESULTS.md, session 32).
WORKER_METHOD = "thread"


class IndexDataset(tud.Dataset):
    """Item i carries its index and where it was loaded (worker id, process)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = tud.get_worker_info()
        return {
            "index": i,
            "x": torch.full((4,), i / N),
            "pid": os.getpid(),
            "thread_worker": info is not None and info.worker_method == "thread",
        }


def loader_facts(loader: Any) -> dict[str, Any]:
    sampler = loader.sampler
    return {
        "type": f"{type(loader).__module__}.{type(loader).__qualname__}",
        "options": {name: getattr(loader, name, None) for name in MINATO_OPTIONS},
        "worker_method": getattr(loader, "worker_method", None),
        "num_workers": loader.num_workers,
        "reorders": loader.reorders(),
        "sampler": type(sampler).__name__,
        "num_replicas": getattr(sampler, "num_replicas", None),
        "sampler_rank": getattr(sampler, "rank", None),
        "shuffle": getattr(sampler, "shuffle", None),
        "seed": getattr(sampler, "seed", None),
    }


class Recorder(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.train_seen: dict[int, list[int]] = defaultdict(list)
        self.val_seen: dict[int, list[int]] = defaultdict(list)
        self.batches: dict[int, int] = defaultdict(int)
        self.sampler_epochs: dict[int, int] = {}
        self.pids: set[int] = set()
        self.all_thread_workers = True

    def train_dataloader(self) -> minato.DataLoader:
        # shuffle=True: Lightning injects DistributedSampler(shuffle=True).
        return minato.DataLoader(
            IndexDataset(),
            batch_size=BATCH,
            shuffle=True,
            num_workers=2,
            worker_method=WORKER_METHOD,
            **MINATO_OPTIONS,
        )

    def val_dataloader(self) -> minato.DataLoader:
        return minato.DataLoader(
            IndexDataset(),
            batch_size=BATCH,
            num_workers=2,
            worker_method=WORKER_METHOD,
            **MINATO_OPTIONS,
        )

    def on_train_epoch_start(self) -> None:
        self.sampler_epochs[self.current_epoch] = self.trainer.train_dataloader.sampler.epoch

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.train_seen[self.current_epoch].extend(batch["index"].tolist())
        self.batches[self.current_epoch] += 1
        self.pids.update(batch["pid"].tolist())
        self.all_thread_workers &= bool(batch["thread_worker"].all())
        return self.layer(batch["x"]).pow(2).mean()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.val_seen[self.current_epoch].extend(batch["index"].tolist())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(outdir: Path) -> None:
    model = Recorder()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=EPOCHS,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        default_root_dir=outdir,
    )
    trainer.fit(model)
    record = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "pid": os.getpid(),
        "train": model.train_seen,
        "val": model.val_seen,
        "batches": model.batches,
        "sampler_epochs": model.sampler_epochs,
        "batch_pids": sorted(model.pids),
        "all_thread_workers": model.all_thread_workers,
        "train_loader": loader_facts(trainer.train_dataloader),
        "val_loader": loader_facts(trainer.val_dataloaders),
    }
    path = outdir / f"rank{trainer.global_rank}.json"
    path.write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
