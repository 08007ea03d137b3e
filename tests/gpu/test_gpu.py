"""device="cuda": batches on the GPU, equal to a CPU run, race-free, memory flat.

Skipped without CUDA (CI has none); run on a GPU machine with
``pytest tests/gpu``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import minato
from minato._loader.collate import fast_default_collate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class Images(tud.Dataset):
    def __init__(self, count: int = 256, shape: tuple[int, ...] = (3, 64, 64)) -> None:
        self.count, self.shape = count, shape

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, np.ndarray, int]:
        generator = torch.Generator().manual_seed(i)
        image = torch.randint(0, 256, self.shape, generator=generator, dtype=torch.uint8)
        return image, np.full(4, i, np.float32), i


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_arrive_on_the_device_equal_to_a_cpu_run(workers: int) -> None:
    on_gpu = minato.DataLoader(Images(), batch_size=16, num_workers=workers, device="cuda")
    on_cpu = minato.DataLoader(Images(), batch_size=16, num_workers=workers, in_order=True)
    count = 0
    for (image, array, label), (cpu_image, cpu_array, cpu_label) in zip(
        on_gpu, on_cpu, strict=True
    ):
        assert image.device.type == "cuda" and array.device.type == "cuda"
        assert label.device.type == "cuda"
        assert torch.equal(image.cpu(), cpu_image) and torch.equal(array.cpu(), cpu_array)
        assert torch.equal(label.cpu(), cpu_label)
        count += 1
    assert count == len(on_cpu)


def test_the_collate_fast_path_writes_pinned_memory() -> None:
    batch = fast_default_collate(pin=True)([torch.ones(3, 4), torch.zeros(3, 4)])
    assert batch.is_pinned()


def test_no_race_between_copies_and_a_slow_model_step() -> None:
    # Each batch's checksum is computed on the GPU after a deliberately long
    # kernel on the consumer's stream; were a copy not waited for, or a
    # buffer reused early, sums would differ from the CPU's.
    loader = minato.DataLoader(
        Images(128, (3, 128, 128)), batch_size=8, num_workers=2, device="cuda", in_order=True
    )
    expected = [
        int(image.to(torch.int64).sum())
        for image, _, _ in minato.DataLoader(Images(128, (3, 128, 128)), batch_size=8)
    ]
    slow = torch.randn(2048, 2048, device="cuda")
    sums = []
    for image, _, _ in loader:
        for _ in range(8):
            slow = slow @ slow
            slow = slow / slow.norm()
        sums.append(image.to(torch.int64).sum())
    assert [int(total) for total in sums] == expected


def test_memory_stays_flat_over_1000_batches() -> None:
    loader = minato.DataLoader(
        Images(1000 * 4, (3, 32, 32)), batch_size=4, num_workers=2, device="cuda"
    )
    torch.cuda.synchronize()
    readings = []
    for i, (image, _, _) in enumerate(loader):
        image.float().mean()
        if i in (100, 999):
            torch.cuda.synchronize()
            readings.append(torch.cuda.memory_allocated())
    assert len(readings) == 2
    # A leak of one 12 KiB batch per step would add ~10 MiB by the end.
    assert readings[1] - readings[0] < 2 * 1024 * 1024


@pytest.mark.timeout(300)
def test_a_dataset_using_cuda_runs_where_the_loader_asks_for_spawn() -> None:
    """torch's "spawn" workers may use CUDA after the training process did;
    forked ones may not. minato's forced processes start fresh for such a
    loader, and auto keeps threads."""
    from helpers import UsesCuda

    torch.ones(1, device="cuda")  # the training process's CUDA context
    options = dict(batch_size=4, num_workers=2, multiprocessing_context="spawn")
    expected = [batch.tolist() for batch in tud.DataLoader(UsesCuda(), **options)]
    assert sorted(sum(expected, [])) == [[2 * i] * 4 for i in range(8)]
    for method in ("multiprocessing", "auto"):
        loader = minato.DataLoader(UsesCuda(), worker_method=method, **options)
        assert [batch.tolist() for batch in loader] == expected
        assert loader.stats().worker_method == ("thread" if method == "auto" else method)
