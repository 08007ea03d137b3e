"""minato under Hugging Face Accelerate and Trainer, on the CPU in seconds.

1. Accelerate: a minato loader goes through ``Accelerator.prepare()`` with
   its class and options, and ``save_state``/``load_state`` resume its epoch.
2. Trainer: ``minato.install()`` makes the loaders Trainer builds minato's;
   a run stopped mid-epoch resumes from its checkpoint with exactly the
   samples it had not trained.

    python examples/accelerate_trainer.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.utils.data as tud
from accelerate import Accelerator
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import minato


class Reviews(tud.Dataset[dict[str, torch.Tensor]]):
    """Synthetic token ids and labels; each sample also says its index."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = (torch.arange(12) * (index + 5) + torch.randint(0, 3, (12,))) % 100
        return {"input_ids": ids, "labels": torch.tensor(index % 2), "index": torch.tensor(index)}


def tiny_bert() -> torch.nn.Module:
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
    )
    torch.manual_seed(0)
    return BertForSequenceClassification(config)


def with_accelerate(workdir: Path) -> None:
    accelerator = Accelerator(cpu=True)
    model = tiny_bert()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = minato.DataLoader(
        Reviews(), batch_size=8, shuffle=True, num_workers=2, on_error="skip"
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    assert isinstance(loader, minato.DataLoader) and loader.on_error == "skip"

    trained: list[int] = []
    for step, batch in enumerate(loader):
        trained += batch.pop("index").tolist()
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step == 3:
            accelerator.save_state(str(workdir / "accelerate"))  # the loader's position too
            break

    # A restart: built the same way, then the checkpoint loaded.
    restarted = Accelerator(cpu=True)
    loader = minato.DataLoader(
        Reviews(), batch_size=8, shuffle=True, num_workers=2, on_error="skip"
    )
    model, optimizer, loader = restarted.prepare(model, optimizer, loader)
    restarted.load_state(str(workdir / "accelerate"))
    rest = [i for batch in loader for i in batch["index"].tolist()]
    assert sorted(trained + rest) == list(range(64))
    print(
        f"accelerate: {len(trained)} samples before the checkpoint, {len(rest)} after; none twice"
    )


class StopAt(TrainerCallback):  # type: ignore[misc]
    """Ends the run abruptly after a step, as a crash would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise KeyboardInterrupt


def with_trainer(workdir: Path) -> None:
    # Any time before Trainer builds its loaders (transformers may already
    # be imported): Trainer's calls to torch's DataLoader build minato's.
    minato.install()

    def train(**extra: Any) -> None:
        args = TrainingArguments(
            output_dir=str(workdir / "trainer"),
            per_device_train_batch_size=8,
            num_train_epochs=2,
            save_steps=5,
            dataloader_num_workers=2,
            use_cpu=True,
            report_to=[],
            disable_tqdm=True,
            logging_steps=4,
            remove_unused_columns=False,
        )
        model = tiny_bert()
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=Reviews(),
            data_collator=lambda samples: {
                key: torch.stack([s[key] for s in samples]) for key in ("input_ids", "labels")
            },
            callbacks=extra.pop("callbacks", []),
        )
        assert isinstance(trainer.get_train_dataloader(), minato.DataLoader)
        try:
            trainer.train(**extra)
        except KeyboardInterrupt:
            print("trainer: stopped after step 7 (last checkpoint: step 5)")

    train(callbacks=[StopAt(7)])
    train(resume_from_checkpoint=str(workdir / "trainer" / "checkpoint-5"))
    print("trainer: resumed from checkpoint-5 and finished both epochs")
    minato.uninstall()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with_accelerate(Path(tmp))
        with_trainer(Path(tmp))


if __name__ == "__main__":
    main()
