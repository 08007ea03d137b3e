"""PyTorch Lightning with minato's DataLoader, and a mid-epoch checkpoint that
resumes the loader exactly where it was.

    python examples/lightning_example.py

(CPU, one process, under 30 s.) The only change from a Lightning script with
torch's loaders is the import::

    from minato import DataLoader  # was: from torch.utils.data import DataLoader

Lightning re-creates a loader when it injects a sampler (DDP's
DistributedSampler, prediction's index tracking); minato keeps its own options
as attributes, so the re-created loader is minato's, configured the same.

minato.DataLoader has ``state_dict``/``load_state_dict``, so Lightning saves
the loader's position in its checkpoints and restores it with
``Trainer.fit(ckpt_path=...)``. The script trains until a step in the middle
of the first epoch (as if the job were killed there), then resumes from the
checkpoint saved at that step, and checks that over the interrupted epoch
every sample was trained on exactly once: the ones before the interruption
are not repeated, the rest are not skipped, although minato reorders batches.
Under DDP the same works per rank (each rank checkpoints its own loader).
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import lightning as L
import torch
import torch.utils.data as tud
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from minato import DataLoader  # was: from torch.utils.data import DataLoader


class Blobs(tud.Dataset):
    """Noisy points around one centre per class. Item i is (features, label, i):
    the index is there only to check which samples were trained on."""

    def __init__(self, n: int, features: int = 32, classes: int = 8, seed: int = 0) -> None:
        # The same centres for every split; its own points for each.
        centres = torch.randn(classes, features, generator=torch.Generator().manual_seed(0)) * 2
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(classes, (n,), generator=generator)
        self.features = centres[self.labels] + torch.randn(n, features, generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.features[i], self.labels[i], i


class BlobsData(L.LightningDataModule):
    def __init__(self, batch_size: int = 32, workers: int = 2) -> None:
        super().__init__()
        self.batch_size, self.workers = batch_size, workers
        self.train_set, self.val_set = Blobs(1024), Blobs(256, seed=1)

    def train_dataloader(self) -> DataLoader:
        # A generator of the loader's own: its state goes into the checkpoint,
        # so the epochs after a resume are shuffled as without the interruption.
        return DataLoader(
            self.train_set,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.workers,
            generator=torch.Generator().manual_seed(0),
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=128, num_workers=self.workers)


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
        # Sample indices trained on, per epoch (to check the resume; not needed to train).
        self.trained: dict[int, list[int]] = {}

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        features, labels, indices = batch
        self.trained.setdefault(self.current_epoch, []).extend(indices.tolist())
        loss = nn.functional.cross_entropy(self.net(features), labels)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        features, labels, _ = batch
        accuracy = (self.net(features).argmax(1) == labels).float().mean()
        self.log("val_accuracy", accuracy, prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(root: Path, **kwargs: object) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        # Keep a checkpoint every 10 steps, mid-epoch ones included.
        callbacks=[ModelCheckpoint(dirpath=root, every_n_train_steps=10, save_top_k=-1)],
        **kwargs,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    L.seed_everything(0)
    data = BlobsData(workers=args.workers)
    epoch_batches = len(data.train_dataloader())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # 1. Train, "interrupted" at step 20 of the first epoch's 32.
        first = Classifier()
        trainer(root, max_steps=20).fit(first, datamodule=data)
        checkpoint = root / "epoch=0-step=20.ckpt"
        saved = torch.load(checkpoint, weights_only=False)
        loader_state = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
        print(
            f"checkpoint {checkpoint.name}: step 20 of {epoch_batches} in epoch 0, "
            f"with the loader's state ({loader_state['format']}: its sampler position and "
            f"{len(loader_state['epoch']['undelivered'])} samples taken, not yet delivered)"
        )

        # 2. Resume: a new process would do just this.
        resumed = Classifier()
        resumed_trainer = trainer(root / "resumed")
        resumed_trainer.fit(resumed, datamodule=data, ckpt_path=checkpoint)

    # Over the interrupted epoch, before and after the resume: each sample once.
    epoch0 = Counter(first.trained[0] + resumed.trained[0])
    assert set(epoch0) == set(range(len(data.train_set))), "a sample was skipped"
    assert set(epoch0.values()) == {1}, "a sample was trained on twice"
    assert sorted(resumed.trained[1]) == list(range(len(data.train_set)))
    print(
        f"epoch 0: {len(first.trained[0])} samples before the interruption + "
        f"{len(resumed.trained[0])} after the resume = each sample exactly once"
    )
    accuracy = resumed_trainer.callback_metrics["val_accuracy"]
    print(f"epoch 1: all {len(resumed.trained[1])} samples; val accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
