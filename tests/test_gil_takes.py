"""minato._minato._gil_takes: the GIL takes minato's bindings count
(rust/bindings/gil_takes.rs), which benchmarks/manycore.py reports per batch."""

from __future__ import annotations

import pytest
import torch.utils.data as tud

import minato
from minato._minato import _gil_takes

pytestmark = pytest.mark.timeout(60)


class Squares(tud.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        return index * index


@pytest.mark.parametrize("in_order", [True, None])
def test_every_task_and_wait_counts_a_gil_take(in_order: bool | None) -> None:
    before = _gil_takes()
    loader = minato.DataLoader(
        Squares(), batch_size=8, num_workers=2, worker_method="thread", in_order=in_order
    )
    batches = list(loader)
    # At least one take per batch: a task's entry, or the loop's return
    # from waiting for the batch.
    assert _gil_takes() - before >= len(batches) == 8
