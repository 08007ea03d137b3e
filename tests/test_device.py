"""device= and device_prefetch= without a GPU: the CPU paths and the clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.utils.data as tud
from helpers import assert_same

import minato
from minato._loader.device import to_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


class Squares(tud.Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((2, 3), float(i * i)), i


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu")])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_cpu_device_changes_nothing(device: object, workers: int) -> None:
    ours = list(minato.DataLoader(Squares(), batch_size=4, num_workers=workers, device=device))
    torchs = list(tud.DataLoader(Squares(), batch_size=4))
    assert len(ours) == len(torchs)
    for a, b in zip(ours, torchs, strict=True):
        assert_same(a, b)
        assert a[0].device.type == "cpu"


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_a_cuda_device_without_cuda_fails_at_construction(device: object) -> None:
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        minato.DataLoader(Squares(), batch_size=4, device=device)  # type: ignore[arg-type]


def test_other_devices_and_bad_prefetch_depths_are_refused() -> None:
    with pytest.raises(ValueError, match="CUDA device"):
        minato.DataLoader(Squares(), device="meta")
    with pytest.raises(ValueError, match="device_prefetch option should be positive"):
        minato.DataLoader(Squares(), device_prefetch=0)
    with pytest.raises(TypeError, match="device_prefetch"):
        minato.DataLoader(Squares(), device_prefetch=1.5)  # type: ignore[arg-type]


def test_device_options_are_public_attributes_for_lightning() -> None:
    loader = minato.DataLoader(Squares(), batch_size=4, device="cpu", device_prefetch=3)
    assert loader.device == "cpu" and loader.device_prefetch == 3


def test_moving_keeps_the_nesting() -> None:
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    batch = {"x": torch.ones(2), "y": [torch.zeros(1), "text"], "z": Pair(torch.ones(1), 3)}
    moved: list[torch.Tensor] = []
    out = to_device(batch, torch.device("cpu"), moved)
    assert_same(out, batch)
    assert type(out["z"]) is Pair and len(moved) == 3


class _FakeStream:
    """Stands in for a CUDA stream: copies on the CPU are already done."""

    def __init__(self, device: object = None) -> None:
        self.waited: list[object] = []

    def wait_event(self, event: object) -> None:
        self.waited.append(event)


class _FakeEvent:
    def record(self, stream: object) -> None:
        self.recorded_on = stream


@pytest.fixture
def fake_cuda_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device stage run on the CPU: streams and events are fakes, the
    "device" is the CPU, and pinning is skipped. What is left is the stage's
    own bookkeeping: order, prefetch depth, failures, resume tags."""
    import contextlib

    import minato._loader.collate_stage as collate_stage
    import minato._loader.device as device_module
    import minato._loader.iterator as iterator_module

    consumer = _FakeStream()
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: consumer)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    monkeypatch.setattr(
        device_module,
        "resolve_device",
        lambda device: torch.device("cpu") if device == "fake-cuda" else None,
    )
    monkeypatch.setattr(collate_stage, "pinned", lambda data, device=None: data)
    # torch's own single-process iterator pins through its module.
    monkeypatch.setattr(
        torch.utils.data._utils.pin_memory, "pin_memory", lambda data, device=None: data
    )
    monkeypatch.setattr(iterator_module, "fast_default_collate", lambda pin: tud.default_collate)


def fake_cuda_loader(dataset: tud.Dataset, **options: object) -> minato.DataLoader:
    loader = minato.DataLoader(dataset, **options)
    loader.device = "fake-cuda"  # after construction, which checks for real CUDA
    return loader


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("depth", [1, 3])
def test_the_device_stage_keeps_order_and_contents(
    fake_cuda_stage: None, workers: int, depth: int
) -> None:
    options = dict(batch_size=4, num_workers=workers, device_prefetch=depth)
    expected = list(minato.DataLoader(Squares(), **options))
    got = list(fake_cuda_loader(Squares(), **options))
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert_same(a, b)


def test_the_device_stage_raises_a_failed_batch_in_its_turn(fake_cuda_stage: None) -> None:
    class FailsAt(Squares):
        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            if i == 9:
                raise KeyError("bad")
            return super().__getitem__(i)

    loader = fake_cuda_loader(FailsAt(), batch_size=4, num_workers=2, device_prefetch=3)
    iterator = iter(loader)
    assert [int(i) for i in next(iterator)[1]] == [0, 1, 2, 3]
    assert [int(i) for i in next(iterator)[1]] == [4, 5, 6, 7]
    with pytest.raises(KeyError, match="bad"):
        next(iterator)
    assert [int(i) for i in next(iterator)[1]] == [12, 13, 14, 15]


def test_batches_prefetched_to_the_device_are_not_yet_delivered(fake_cuda_stage: None) -> None:
    """A checkpoint counts only batches the loop received, not those the
    stage holds on the device ahead of it."""
    options = dict(batch_size=2, num_workers=2, shuffle=True, device_prefetch=3)
    loader = fake_cuda_loader(Squares(), generator=torch.Generator().manual_seed(0), **options)
    iterator = iter(loader)
    before = [int(i) for _ in range(3) for i in next(iterator)[1]]
    state = loader.state_dict()
    del iterator
    assert len(state["epoch"]["undelivered"]) >= 2 * 3  # the prefetched ones at least
    resumed = fake_cuda_loader(Squares(), generator=torch.Generator().manual_seed(5), **options)
    resumed.load_state_dict(state)
    after = [int(i) for batch in resumed for i in batch[1]]
    assert sorted(before + after) == list(range(20))
