"""Faults a days-long training run meets: a loader must neither leak, hang
nor deadlock (issue 14)."""

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


class GatedAt(tud.Dataset):
    """Sample `gate` waits for `release` (set from another process or thread)."""

    def __init__(self, n: int, gate: int, release: object) -> None:
        self.n = n
        self.gate = gate
        self.release = release

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.gate:
            self.release.wait(20)
        return i


@pytest.mark.parametrize(
    "loader_type", [tud.DataLoader, minato.DataLoader], ids=["torch", "minato"]
)
def test_the_same_iterator_goes_on_after_a_keyboard_interrupt(loader_type) -> None:
    """A loop that catches Ctrl-C in next() and goes on (a notebook cell run
    again, a loop that logs and continues) gets the rest of the epoch, once."""
    import _thread
    import multiprocessing
    import threading

    release = multiprocessing.get_context("fork").Event()
    loader = loader_type(GatedAt(200, gate=100, release=release), batch_size=4, num_workers=2)
    iterator = iter(loader)
    delivered: list[int] = []
    interrupted = 0

    def interrupt_then_release() -> None:
        time.sleep(0.3)  # the loop is by then blocked in next(), on sample 100
        _thread.interrupt_main()
        time.sleep(0.2)
        release.set()

    helper = None
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            break
        except KeyboardInterrupt:
            interrupted += 1
            continue
        delivered.extend(int(i) for i in batch)
        if helper is None and len(delivered) >= 60:
            # The loop soon waits in next() for the batch holding sample 100.
            helper = threading.Thread(target=interrupt_then_release)
            helper.start()
    helper.join()
    assert interrupted == 1
    assert sorted(delivered) == list(range(200))


class StuckOnce(tud.Dataset):
    """The first sample loaded gets stuck, until `release`."""

    def __init__(self, release: object) -> None:
        import threading

        self.release = release
        self.stuck: list = []  # shared by every worker's copy
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> int:
        with self.lock:
            first = not self.stuck
            if first:
                self.stuck.append(i)
        if first:
            self.release.wait(60)
        return i


@pytest.mark.timeout(30)
@pytest.mark.parametrize("shuffle", [False, True])
def test_the_next_epoch_does_not_wait_for_a_stuck_sample(shuffle: bool) -> None:
    import threading

    from helpers import os_threads, threads_left_since

    before = os_threads()
    release = threading.Event()
    dataset = StuckOnce(release)
    loader = minato.DataLoader(
        dataset,
        batch_size=2,
        shuffle=shuffle,
        num_workers=2,
        persistent_workers=True,
        adaptive=False,
        sample_timeout=None,
    )
    try:
        # The first epoch's first batches are prefetched at once: wait until
        # one of its samples is in flight, stuck, without asking for a batch
        # (which, in order, would wait for it).
        first = iter(loader)
        deadline = time.monotonic() + 20
        while not dataset.stuck and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dataset.stuck
        # The next epoch is delivered whole while that sample is still stuck:
        # a replacement serves it; the stuck worker leaves once released.
        second = sorted(int(i) for batch in loader for i in batch)
        assert not release.is_set()
        assert second == list(range(32))
    finally:
        release.set()
    del first
    del loader
    assert not threads_left_since(before)
