"""Accelerate on a GPU (issue 32): a prepared minato loader delivers on
accelerate's device through minato's own side-stream prefetch, with
torch's batches. Skipped without CUDA or accelerate."""

from __future__ import annotations

import pytest
import torch
import torch.utils.data as tud

import minato

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
accelerate = pytest.importorskip("accelerate")


def test_prepared_loader_delivers_on_accelerates_device() -> None:
    data = [torch.full((3, 8, 8), i, dtype=torch.float32) for i in range(64)]
    batches = {}
    for cls in (tud.DataLoader, minato.DataLoader):
        accelerator = accelerate.Accelerator()
        prepared = accelerator.prepare(cls(data, batch_size=8, num_workers=2))
        batches[cls] = [batch for batch in prepared]
        assert all(batch.device.type == "cuda" for batch in batches[cls])
        if cls is minato.DataLoader:
            assert prepared.base_dataloader.device == accelerator.device
    for ours, theirs in zip(batches[minato.DataLoader], batches[tud.DataLoader], strict=True):
        torch.testing.assert_close(ours, theirs)
