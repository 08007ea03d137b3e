"""minato under Hugging Face Accelerate (issue 32), side by side with torch:
``Accelerator.prepare()`` keeps minato's class and options, batches and
losses are torch's, gradient accumulation syncs at the epoch's end,
``save_state``/``load_state`` resume exactly, and two processes (torchrun,
gloo) get disjoint shards covering the dataset."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.data as tud
from ddp.launch import run_with_port, torchrun

import minato

accelerate = pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(180)

SCRIPT = Path(__file__).resolve().parent / "ddp" / "accelerate_script.py"


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Iterator[None]:
    """Accelerate keeps its state in process-wide singletons; each test
    starts from none."""
    from accelerate.state import AcceleratorState, GradientState

    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


class Features(tud.Dataset[dict[str, torch.Tensor]]):
    """Token ids and a label per index, from the index alone."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = (torch.arange(8) * (index + 3)) % 50
        return {"input_ids": ids, "labels": torch.tensor(index % 2), "index": torch.tensor(index)}


def _loader(cls: type, **kwargs: Any) -> Any:
    kwargs.setdefault("batch_size", 4)
    kwargs.setdefault("num_workers", 2)
    return cls(Features(), generator=torch.Generator().manual_seed(7), **kwargs)


def _tiny_model() -> torch.nn.Module:
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def test_prepare_keeps_minato_class_and_options() -> None:
    loader = _loader(
        minato.DataLoader,
        shuffle=True,
        on_error="skip",
        sample_timeout=2.5,
        adaptive=False,
        worker_method="thread",
        max_failures=3,
    )
    prepared = accelerate.Accelerator(cpu=True).prepare(loader)
    assert isinstance(prepared, minato.DataLoader)
    assert isinstance(prepared, tud.DataLoader)
    base = prepared.base_dataloader
    assert type(base) is minato.DataLoader and base is not loader
    for name, value in loader.minato_options().items():
        assert getattr(base, name) == value, name
    assert base.num_workers == 2 and base.generator is loader.generator
    # A torch loader prepared beside it stays torch's.
    torch_prepared = accelerate.Accelerator(cpu=True).prepare(_loader(tud.DataLoader))
    assert type(torch_prepared.base_dataloader) is tud.DataLoader


def _indices(prepared: Any) -> list[list[int]]:
    return [batch["index"].tolist() for batch in prepared]


@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_are_torchs_under_prepare(shuffle: bool) -> None:
    results = []
    for cls in (tud.DataLoader, minato.DataLoader):
        accelerator = accelerate.Accelerator(cpu=True)
        prepared = accelerator.prepare(_loader(cls, shuffle=shuffle))
        results.append([_indices(prepared) for _ in range(2)])
    assert results[0] == results[1]
    assert sorted(i for batch in results[1][0] for i in batch) == list(range(48))


class Stream(tud.IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        info = tud.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        return iter(range(worker, 30, workers))


def test_an_iterable_dataset_is_dispatched_as_torchs() -> None:
    # accelerate dispatches an IterableDataset's batches from process 0.
    results = []
    for cls in (tud.DataLoader, minato.DataLoader):
        prepared = accelerate.Accelerator(cpu=True).prepare(
            cls(Stream(), batch_size=4, num_workers=2)
        )
        assert isinstance(prepared, cls)
        results.append([batch.tolist() for batch in prepared])
    assert results[0] == results[1]


def _train(cls: type, accumulation: int = 1) -> tuple[list[float], list[bool]]:
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model = _tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = _loader(cls, shuffle=True)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    losses, syncs = [], []
    for batch in prepared:
        with accelerator.accumulate(model):
            batch.pop("index")
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
        syncs.append(accelerator.sync_gradients)
    return losses, syncs


def test_losses_are_torchs_with_a_transformers_model() -> None:
    torch_losses, _ = _train(tud.DataLoader)
    minato_losses, _ = _train(minato.DataLoader)
    assert len(minato_losses) == 12
    assert minato_losses == torch_losses


def test_gradient_accumulation_syncs_at_the_end_of_the_epoch() -> None:
    # 12 batches, accumulating 5: synced after 5, 10, and the last (12).
    _, torch_syncs = _train(tud.DataLoader, accumulation=5)
    _, minato_syncs = _train(minato.DataLoader, accumulation=5)
    assert [i + 1 for i, synced in enumerate(minato_syncs) if synced] == [5, 10, 12]
    assert minato_syncs == torch_syncs


def test_save_state_and_load_state_resume_mid_epoch(tmp_path: Path) -> None:
    accelerator = accelerate.Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    model, prepared = accelerator.prepare(model, _loader(minato.DataLoader, shuffle=True))
    iterator = iter(prepared)
    whole = [next(iterator)["index"].tolist() for _ in range(5)]
    accelerator.save_state(str(tmp_path / "ckpt"))
    whole += [batch["index"].tolist() for batch in iterator]
    assert (tmp_path / "ckpt" / "dl_state_dict.bin").exists()

    restarted = accelerate.Accelerator(cpu=True)
    model2, prepared2 = restarted.prepare(
        torch.nn.Linear(2, 2), _loader(minato.DataLoader, shuffle=True)
    )
    restarted.load_state(str(tmp_path / "ckpt"))
    tail = _indices(prepared2)
    assert tail == whole[5:]


def test_use_stateful_dataloader_keeps_minato(tmp_path: Path) -> None:
    config = accelerate.DataLoaderConfiguration(use_stateful_dataloader=True)
    accelerator = accelerate.Accelerator(cpu=True, dataloader_config=config)
    prepared = accelerator.prepare(_loader(minato.DataLoader, shuffle=True, on_error="skip"))
    assert type(prepared.base_dataloader) is minato.DataLoader
    assert prepared.on_error == "skip" and accelerator.use_stateful_dataloader
    # torch's loaders still become torchdata's, as accelerate makes them.
    other = accelerator.prepare(_loader(tud.DataLoader))
    assert type(other.base_dataloader).__name__ == "StatefulDataLoader"


def test_skip_first_batches_without_a_state_skips_as_accelerate_does() -> None:
    accelerator = accelerate.Accelerator(cpu=True)
    prepared = accelerator.prepare(_loader(minato.DataLoader, shuffle=False))
    skipped = accelerator.skip_first_batches(prepared, 3)
    assert isinstance(skipped, minato.DataLoader)
    assert _indices(skipped) == _indices(prepared)[3:]


class SlowFirst(tud.Dataset[int]):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> int:
        if index < 4:
            time.sleep(0.3)
        return index


def test_an_evaluation_loader_recreated_as_torchs_class_stays_in_order() -> None:
    # A library that re-creates a loader from its attributes with torch's
    # class (as accelerate's own code does, had minato not hooked it).
    from accelerate.data_loader import _PYTORCH_DATALOADER_KWARGS

    loader = minato.DataLoader(SlowFirst(), batch_size=4, num_workers=2)
    fixed_by_the_batch_sampler = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
    kwargs = {
        name: getattr(loader, name, default)
        for name, default in _PYTORCH_DATALOADER_KWARGS.items()
        if name not in fixed_by_the_batch_sampler
    }
    copy = tud.DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, **kwargs)
    assert type(copy) is tud.DataLoader and copy.in_order
    assert [batch.tolist()[0] for batch in copy] == list(range(0, 32, 4))


def test_a_torch_subclass_is_left_to_accelerate() -> None:
    class Mine(tud.DataLoader):  # type: ignore[type-arg]
        pass

    prepared = accelerate.Accelerator(cpu=True).prepare(Mine(Features(), batch_size=4))
    assert type(prepared.base_dataloader) is tud.DataLoader


def test_a_minato_loader_built_before_accelerate_is_imported() -> None:
    # accelerate imported after the loader: hooked at its import.
    code = """
import sys
import minato
loader = minato.DataLoader(list(range(8)), batch_size=2, on_error="skip")
assert "accelerate" not in sys.modules
import accelerate
prepared = accelerate.Accelerator(cpu=True).prepare(loader)
assert isinstance(prepared, minato.DataLoader) and prepared.on_error == "skip"
print("ok", [b.tolist() for b in prepared])
"""
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok [[0, 1], [2, 3]")


def test_two_processes_get_disjoint_shards_covering_the_dataset(tmp_path: Path) -> None:
    result = run_with_port(lambda port: torchrun(port, SCRIPT, str(tmp_path)), timeout=150)
    assert result.returncode == 0, result.stdout
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for record in ranks:
        assert record["minato"] is True and record["on_error"] == "skip"
        # The same shards as torch's loader prepared the same way.
        assert record["minato_batches"] == record["torch_batches"]
    seen = [i for record in ranks for batch in record["minato_batches"] for i in batch]
    assert sorted(seen) == list(range(40))


def test_an_accelerate_that_changed_is_left_alone_with_a_warning() -> None:
    import types
    import warnings

    from minato._integrations import accelerate as hooks
    from minato._util import warn_once

    changed = types.ModuleType("accelerate_changed")
    changed.DataLoader = object  # no longer torch's class
    warn_once._warned.discard("accelerate-data-loader")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooks._hook_data_loader(changed)
    assert changed.DataLoader is object
    assert any("no longer builds torch's DataLoader" in str(w.message) for w in caught)


def test_a_prepared_loader_on_a_gpu_is_given_accelerates_device() -> None:
    # Without a GPU here: the wiring only (tests/gpu/test_accelerate_gpu.py
    # iterates it on one). accelerate's wrapper holds the device it places
    # batches on; minato's loader takes it, for its side-stream prefetch.
    from minato._integrations import accelerate as hooks

    prepared = accelerate.Accelerator(cpu=True).prepare(_loader(minato.DataLoader))
    prepared.device = torch.device("cuda", 0)
    hooks.adopt(prepared)
    assert prepared.base_dataloader.device == torch.device("cuda", 0)
    assert prepared.use_stateful_dataloader is True
    # A device of the loader's own is kept.
    own = accelerate.Accelerator(cpu=True).prepare(_loader(minato.DataLoader, device="cpu"))
    own.device = torch.device("cuda", 0)
    hooks.adopt(own)
    assert own.base_dataloader.device == "cpu"
