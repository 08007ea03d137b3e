"""device= and device_prefetch= without a GPU: the CPU paths and the clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.utils.data as tud
from helpers import assert_same

import minato
from minato._device import to_device

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
