"""transformers' Trainer with ``minato.install()`` (issue 32): Trainer's own
loaders become minato's, train on torch's batches with torch's losses, and a
run stopped mid-epoch and resumed from its checkpoint trains exactly the
samples not yet trained, each with the random draws it would have had."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.data as tud

import minato

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _uninstalled_after() -> Iterator[None]:
    yield
    minato.uninstall()
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


class Noisy(tud.Dataset[dict[str, torch.Tensor]]):
    """Each sample draws from torch's generator: what it draws depends on its
    seed, so a resumed sample must get the seed it had."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": torch.rand(3), "index": torch.tensor(index)}


class Recorder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)
        self.seen: list[tuple[list[int], list[list[float]]]] = []

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.append((index.tolist(), x.tolist()))
        return {"loss": self.linear(x).pow(2).mean()}


class StopAt(transformers.TrainerCallback):  # type: ignore[misc]
    """Ends the run abruptly after a step, as a crash would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise KeyboardInterrupt


def _train(
    out: Path, *, resume: Path | None = None, stop: int | None = None, workers: int = 2
) -> tuple[list[Any], Any]:
    torch.manual_seed(0)
    model = Recorder()
    args = transformers.TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=4,
        num_train_epochs=2,
        save_strategy="steps",
        save_steps=5,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=workers,
        seed=0,
        logging_steps=1000,
        disable_tqdm=True,
    )
    callbacks = [StopAt(stop)] if stop is not None else []
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Noisy(), callbacks=callbacks
    )
    try:
        trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    except KeyboardInterrupt:
        pass
    return model.seen, trainer


def test_trainer_builds_minato_loaders_after_install(tmp_path: Path) -> None:
    minato.install(on_error="skip")
    _, trainer = _train(tmp_path / "run")
    loader = trainer.get_train_dataloader()
    assert isinstance(loader, minato.DataLoader)
    assert loader.base_dataloader.on_error == "skip"
    callbacks = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert "MinatoResumeCallback" in callbacks
    minato.uninstall()
    _, again = _train(tmp_path / "again")
    assert type(again.get_train_dataloader().base_dataloader) is tud.DataLoader
    assert "MinatoResumeCallback" not in [
        type(cb).__name__ for cb in again.callback_handler.callbacks
    ]


def test_trainer_batches_are_torchs(tmp_path: Path) -> None:
    # Worker threads and processes seed differently: compare the indices.
    torch_seen, _ = _train(tmp_path / "torch")
    minato.install()
    minato_seen, _ = _train(tmp_path / "minato")
    assert [index for index, _ in minato_seen] == [index for index, _ in torch_seen]
    assert len(minato_seen) == 20


# Mid-epoch, at the end of the first epoch, and mid-way through the second.
@pytest.mark.parametrize("stop, checkpoint", [(8, 5), (13, 10), (17, 15)])
def test_trainer_resumes_exactly_where_it_stopped(
    tmp_path: Path, stop: int, checkpoint: int
) -> None:
    minato.install()
    whole, _ = _train(tmp_path / "whole")
    assert len(whole) == 20  # 2 epochs of 10 batches
    out = tmp_path / "stopped"
    head, _ = _train(out, stop=stop)
    assert head == whole[:stop]
    tail, _ = _train(out, resume=out / f"checkpoint-{checkpoint}")
    # Every sample after the checkpoint once, with the same draws; none before.
    assert tail == whole[checkpoint:]
    shutil.rmtree(tmp_path)


def test_trainer_with_torchs_loader_still_skips_batches(tmp_path: Path) -> None:
    # Without install(): Trainer's own behaviour, untouched by minato.
    whole, _ = _train(tmp_path / "whole", workers=0)
    out = tmp_path / "stopped"
    _train(out, stop=8, workers=0)
    tail, trainer = _train(out, resume=out / "checkpoint-5", workers=0)
    assert type(trainer.get_train_dataloader().base_dataloader) is tud.DataLoader
    assert [index for index, _ in tail] == [index for index, _ in whole[5:]]


def test_the_example_runs_as_documented() -> None:
    import subprocess
    import sys

    example = Path(__file__).resolve().parent.parent / "examples" / "accelerate_trainer.py"
    result = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=240, cwd="/"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "none twice" in result.stdout
    assert "resumed from checkpoint-5 and finished both epochs" in result.stdout
