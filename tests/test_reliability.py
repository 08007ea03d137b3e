"""Faults a days-long training run meets: a loader must neither leak, hang
nor deadlock (issue 14, in progress)."""

from __future__ import annotations

import time

import pytest
import torch.utils.data as tud

import minato

pytestmark = pytest.mark.timeout(120)


def memory_maps() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


class OneSlowSample(tud.Dataset):
    """Sample 0 runs past the sample timeout: every epoch a replacement
    thread starts beside its worker and retires once it is done."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        if i == 0:
            time.sleep(0.02)
        return i


def test_threads_that_retire_release_their_stacks() -> None:
    # A retired thread that is neither joined nor detached keeps its stack
    # mapped: over a week of epochs the map count reached the kernel's limit
    # and no thread could start. Here 2 maps leaked per epoch.
    loader = minato.DataLoader(
        OneSlowSample(),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        sample_timeout=0.002,
        adaptive=False,
    )
    counts = []
    for epoch in range(150):
        assert sorted(int(i) for batch in loader for i in batch) == list(range(64))
        if epoch in (30, 149):
            counts.append(memory_maps())
    assert loader.stats().slow_samples >= 100  # the replacements did churn
    assert counts[1] - counts[0] < 40, counts
