"""Sample-level out-of-order batching: a slow sample never holds up the samples behind it."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.utils.data as tud
from helpers import (
    DeclaredShuffle,
    RangeDataset,
    ShardedIterable,
    assert_prefetch_bounded,
    os_threads,
    threads_left_since,
)

import minato

pytestmark = pytest.mark.usefixtures("no_leaked_threads")


def wait_until(condition, within_s: float = 20.0) -> bool:
    """Polls `condition` (no timing is asserted: a hang fails the test's own timeout)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class Blocking(RangeDataset):
    """Items in `blocked` wait for `release`; the others take `fast_s`."""

    def __init__(self, n: int, blocked: set[int], fast_s: float = 0.0) -> None:
        super().__init__(n)
        self.blocked = blocked
        self.fast_s = fast_s
        self.release = threading.Event()

    def __getitem__(self, i: int) -> int:
        if i in self.blocked:
            self.release.wait(30)
        elif self.fast_s:
            time.sleep(self.fast_s)
        return i


def sizes_and_indices(batches):
    return [len(b) for b in batches], sorted(i for b in batches for i in b.tolist())


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(in_order=False, sample_timeout=None),
        # In the sampler's order but for a late sample: past the timeout.
        dict(sampler=DeclaredShuffle(16), sample_timeout=0.05),
        dict(sampler=DeclaredShuffle(16)),  # "auto": late past its floor
    ],
    ids=["in_order=False", "in_order=None, shuffling sampler", "in_order=None, auto"],
)
def test_a_slow_sample_lands_in_a_later_batch(kwargs) -> None:
    dataset = Blocking(16, blocked={0})
    loader = minato.DataLoader(dataset, batch_size=4, num_workers=2, **kwargs)
    it = iter(loader)
    first = next(it).tolist()
    assert 0 not in first and len(first) == 4  # built while sample 0 is still loading
    dataset.release.set()
    rest = list(it)
    assert sizes_and_indices([torch.tensor(first), *rest]) == ([4, 4, 4, 4], list(range(16)))


def test_in_order_none_keeps_a_sequential_loader_in_exact_order() -> None:
    class SlowFirst(RangeDataset):
        def __getitem__(self, i):
            time.sleep(0.05 if i == 0 else 0)
            return i

    batches = [b.tolist() for b in minato.DataLoader(SlowFirst(12), batch_size=4, num_workers=2)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_which_loaders_reorder() -> None:
    ds = RangeDataset(10)

    def reorders(**kwargs):
        return minato.DataLoader(ds, **kwargs).reorders()

    assert reorders(shuffle=True)
    assert reorders(sampler=tud.RandomSampler(ds))
    assert reorders(sampler=tud.SubsetRandomSampler(range(5)))
    assert reorders(sampler=tud.WeightedRandomSampler([1.0] * 10, 10))
    assert reorders(sampler=tud.DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True))
    assert reorders(sampler=DeclaredShuffle(10))
    assert reorders(in_order=False)
    assert not reorders()
    assert not reorders(sampler=tud.DistributedSampler(ds, num_replicas=2, rank=0, shuffle=False))
    assert not reorders(shuffle=True, in_order=True)


def test_only_whole_batches_move_with_a_users_batch_sampler() -> None:
    dataset = Blocking(12, blocked={0})
    batch_sampler = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    it = iter(
        minato.DataLoader(dataset, batch_sampler=batch_sampler, num_workers=2, in_order=False)
    )
    first = next(it).tolist()
    assert first in batch_sampler[1:]  # another whole batch overtook the slow one
    dataset.release.set()
    assert sorted([first, *(b.tolist() for b in it)]) == batch_sampler


def test_an_iterable_dataset_moves_whole_batches_only() -> None:
    loader = minato.DataLoader(ShardedIterable(40), batch_size=4, num_workers=2, in_order=False)
    expected = sorted(
        b.tolist() for b in tud.DataLoader(ShardedIterable(40), batch_size=4, num_workers=2)
    )
    assert sorted(b.tolist() for b in loader) == expected


def test_a_worker_stuck_on_a_slow_sample_is_replaced_then_retired() -> None:
    dataset = Blocking(40, blocked={0}, fast_s=0.001)
    # A fixed pool: the adaptive controller may also add workers while the
    # first batch is awaited, and this counts replacements exactly.
    loader = minato.DataLoader(
        dataset, batch_size=4, num_workers=2, in_order=False, sample_timeout=0.05, adaptive=False
    )
    it = iter(loader)
    batches = [next(it)]
    engine = it._engine
    # While sample 0 is stuck, a third worker keeps two on the fast samples.
    assert wait_until(lambda: engine.num_workers == 3)
    dataset.release.set()
    batches += list(it)
    assert sizes_and_indices(batches) == ([4] * 10, list(range(40)))
    # The stuck sample, and on a loaded machine perhaps a fast one held past
    # the 50 ms timeout too.
    assert engine.slow_samples >= 1
    assert engine.sample_timeout == pytest.approx(0.05)


def test_the_pool_shrinks_back_once_the_slow_sample_finishes() -> None:
    dataset = Blocking(400, blocked={0}, fast_s=0.002)
    loader = minato.DataLoader(
        dataset,
        batch_size=4,
        num_workers=2,
        in_order=False,
        sample_timeout=0.02,
        persistent_workers=True,
        adaptive=False,  # a fixed pool: only replacements change its size
    )
    it = iter(loader)
    next(it)
    engine = it._engine
    assert wait_until(lambda: engine.num_workers == 3)
    dataset.release.set()
    # Keep consuming (the pool resizes as tasks finish) until it is back to two.
    assert wait_until(lambda: (next(it, None), engine.num_workers)[1] == 2)
    it = loader = None  # the last references: the workers stop


def test_slow_samples_in_flight_are_bounded() -> None:
    dataset = Blocking(60, blocked={0, 1, 2})
    loader = minato.DataLoader(
        dataset,
        batch_size=4,
        num_workers=4,
        in_order=False,
        sample_timeout=0.02,
        max_slow_samples=1,
        adaptive=False,  # a fixed pool: only replacements change its size
    )
    it = iter(loader)
    batches = [next(it)]
    engine = it._engine
    assert wait_until(lambda: engine.num_workers == 5)
    # Three samples are stuck and flagged, but at the bound no more
    # replacements start: give the monitor many chances to overshoot.
    time.sleep(0.3)
    assert engine.num_workers == 5
    dataset.release.set()
    batches += list(it)
    assert sizes_and_indices(batches) == ([4] * 15, list(range(60)))


def test_no_replacement_with_max_slow_samples_zero() -> None:
    dataset = Blocking(20, blocked={0})
    loader = minato.DataLoader(
        dataset,
        batch_size=4,
        num_workers=2,
        in_order=False,
        sample_timeout=0.01,
        max_slow_samples=0,
        adaptive=False,
    )
    it = iter(loader)
    next(it)
    time.sleep(0.2)
    assert it._engine.num_workers == 2
    dataset.release.set()
    assert len(list(it)) == 4


def test_auto_timeout_warms_up_then_follows_the_75th_percentile() -> None:
    class Skewed(RangeDataset):
        def __getitem__(self, i):
            time.sleep(0.02 if i % 8 == 0 else 0.001)
            return i

    loader = minato.DataLoader(
        Skewed(200), batch_size=4, num_workers=2, in_order=False, sample_timeout_warmup=40
    )
    it = iter(loader)
    assert it._engine.sample_timeout is None  # still warming up
    list(it)
    assert it._engine is None  # the epoch ended: the engine is gone, its figures kept
    # Seven samples in eight take about 1 ms: the 75th percentile sits among
    # them, well below the 20 ms ones. (With one in four slow it would be the
    # slowest fast sample, or a slow one wherever a window held a few more.)
    timeout = loader.stats().sample_timeout
    assert timeout is not None and 0 < timeout < 0.02


def test_auto_timeout_is_set_after_the_warmup() -> None:
    class Skewed(RangeDataset):
        def __getitem__(self, i):
            time.sleep(0.02 if i % 8 == 0 else 0.001)
            return i

    loader = minato.DataLoader(
        Skewed(200),
        batch_size=4,
        num_workers=2,
        in_order=False,
        sample_timeout_warmup=40,
        persistent_workers=True,
    )
    it = iter(loader)
    list(it)
    timeout = it._engine.sample_timeout
    assert timeout is not None and 0 < timeout < 0.02
    assert list(it) == []  # the epoch is over
    del it, loader


def test_sample_errors_keep_their_type_and_index() -> None:
    class Fails(RangeDataset):
        def __getitem__(self, i):
            if i == 5:
                raise KeyError("no label")
            return i

    loader = minato.DataLoader(Fails(16), batch_size=4, num_workers=2, in_order=False)
    with pytest.raises(KeyError, match=r"DataLoader worker thread \d \(sample index 5\)"):
        list(loader)


@pytest.mark.parametrize("num_workers,prefetch_factor", [(1, 1), (2, 2), (3, 1)])
def test_prefetch_bounds_samples_in_flight(num_workers, prefetch_factor) -> None:
    assert_prefetch_bounded(
        150,
        batch_size=3,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        in_order=False,
        adaptive=False,
    )


def test_persistent_workers_reorder_every_epoch_and_recover_from_a_break() -> None:
    loader = minato.DataLoader(
        RangeDataset(50), batch_size=6, shuffle=True, num_workers=3, persistent_workers=True
    )
    for i, _ in enumerate(loader):
        if i == 2:
            break
    for _ in range(3):
        assert sizes_and_indices(list(loader)) == ([6] * 8 + [2], list(range(50)))


def test_threads_exit_after_a_break_with_slow_samples_in_flight() -> None:
    before = os_threads()
    dataset = Blocking(40, blocked={0, 1}, fast_s=0.001)
    it = iter(
        minato.DataLoader(dataset, batch_size=4, num_workers=2, in_order=False, sample_timeout=0.02)
    )
    next(it)
    engine = it._engine
    assert wait_until(lambda: engine.num_workers >= 3)
    it = engine = None  # a break: the stuck workers are left to finish their sample
    dataset.release.set()
    assert not threads_left_since(before)


class _RepeatSampler:
    """timm's: a sampler repeated for ever."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


def multi_epochs_loader(base: type) -> type:
    """timm's MultiEpochsDataLoader (timm/data/loader.py), over `base`: it
    swaps in an endless batch sampler after construction and keeps one
    iterator for every epoch."""

    class MultiEpochsDataLoader(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._DataLoader__initialized = False
            if self.batch_sampler is None:
                self.sampler = _RepeatSampler(self.sampler)
            else:
                self.batch_sampler = _RepeatSampler(self.batch_sampler)
            self._DataLoader__initialized = True
            self.iterator = super().__iter__()

        def __len__(self):
            if self.batch_sampler is None:
                return len(self.sampler.sampler)
            return len(self.batch_sampler.sampler)

        def __iter__(self):
            for _ in range(len(self)):
                yield next(self.iterator)

    return MultiEpochsDataLoader


class UnevenCost(tud.Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> int:
        time.sleep(0.02 if index % 3 == 0 else 0.001)
        return index


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_a_batch_sampler_swapped_in_after_construction_keeps_its_batches(
    persistent: bool,
) -> None:
    """timm's --use-multi-epochs-loader: every epoch is a permutation, as
    with torch (whole batches of the endless sampler, in its order)."""
    epochs = {}
    for base in (tud.DataLoader, minato.DataLoader):
        loader = multi_epochs_loader(base)(
            UnevenCost(),
            batch_size=4,
            shuffle=True,
            num_workers=2,
            persistent_workers=persistent,
        )
        epochs[base] = [sorted(int(i) for batch in loader for i in batch) for _ in range(4)]
        del loader
    assert epochs[tud.DataLoader] == [list(range(20))] * 4
    assert epochs[minato.DataLoader] == epochs[tud.DataLoader]


@pytest.mark.timeout(60)
def test_a_persistent_loader_whose_batch_sampler_is_swapped_between_epochs() -> None:
    """Decided as each epoch starts: a persistent iterator built for single
    samples gives way once a batch sampler of the user's is in place."""
    loader = minato.DataLoader(
        UnevenCost(), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True
    )
    assert sorted(int(i) for batch in loader for i in batch) == list(range(20))
    loader._DataLoader__initialized = False
    loader.batch_sampler = [[3, 2, 1, 0], [7, 6, 5, 4]]
    loader._DataLoader__initialized = True
    assert [batch.tolist() for batch in loader] == [[3, 2, 1, 0], [7, 6, 5, 4]]
