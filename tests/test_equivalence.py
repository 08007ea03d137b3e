"""The same program through torch's DataLoader and minato's gives the same batches."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from helpers import (
    RangeDataset,
    RichDataset,
    ShardedIterable,
    UnevenIterable,
    UnshardedIterable,
    assert_same,
    batches,
    compare_with_torch,
)

import minato

pytestmark = pytest.mark.usefixtures("no_leaked_threads")

WORKERS = [0, 1, 3]


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("batch_size,drop_last", [(1, False), (4, False), (4, True), (None, False)])
def test_sequential(num_workers, batch_size, drop_last) -> None:
    compare_with_torch(
        RangeDataset, batch_size=batch_size, drop_last=drop_last, num_workers=num_workers
    )


@pytest.mark.parametrize("num_workers", WORKERS)
def test_shuffle_with_generator(num_workers) -> None:
    def gen():
        return torch.Generator().manual_seed(1234)

    torch.manual_seed(0)
    expected = batches(
        tud.DataLoader(
            RangeDataset(), batch_size=5, shuffle=True, generator=gen(), num_workers=num_workers
        )
    )
    got = batches(
        minato.DataLoader(
            RangeDataset(),
            batch_size=5,
            shuffle=True,
            generator=gen(),
            num_workers=num_workers,
            in_order=True,
        )
    )
    assert_same(got, expected)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_shuffle_from_the_global_rng(num_workers) -> None:
    got = compare_with_torch(
        RangeDataset, seed=7, batch_size=6, shuffle=True, num_workers=num_workers
    )
    # And it consumes the global RNG as torch does: the next draw agrees too.
    torch.manual_seed(7)
    list(tud.DataLoader(RangeDataset(), batch_size=6, shuffle=True, num_workers=num_workers))
    after_torch = torch.rand(1)
    torch.manual_seed(7)
    list(minato.DataLoader(RangeDataset(), batch_size=6, shuffle=True, num_workers=num_workers))
    assert torch.equal(torch.rand(1), after_torch)
    assert sorted(torch.cat(got).tolist()) == list(range(37))


@pytest.mark.parametrize("num_workers", WORKERS)
def test_custom_sampler(num_workers) -> None:
    sampler = [5, 3, 1, 30, 2, 2, 9]
    compare_with_torch(RangeDataset, sampler=sampler, batch_size=3, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_weighted_sampler_with_generator(num_workers) -> None:
    def loader(cls):
        sampler = tud.WeightedRandomSampler(
            torch.linspace(0.1, 1, 37), 50, generator=torch.Generator().manual_seed(3)
        )
        return cls(
            RangeDataset(), sampler=sampler, batch_size=7, num_workers=num_workers, in_order=True
        )

    assert_same(batches(loader(minato.DataLoader)), batches(loader(tud.DataLoader)))


@pytest.mark.parametrize("num_workers", WORKERS)
def test_batch_sampler(num_workers) -> None:
    batch_sampler = [[0, 1], [5], [7, 8, 9, 10], [2, 2, 2]]
    compare_with_torch(RangeDataset, batch_sampler=batch_sampler, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_custom_collate_fn(num_workers) -> None:
    def collate(items):
        return {"sum": sum(items), "items": tuple(items)}

    compare_with_torch(RangeDataset, batch_size=4, collate_fn=collate, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("batch_size", [4, None])
def test_default_collate_and_convert_on_every_type(num_workers, batch_size) -> None:
    compare_with_torch(RichDataset, batch_size=batch_size, num_workers=num_workers)


class NoneForOdd(RangeDataset):
    def __getitem__(self, i: int) -> int | None:
        return None if i % 2 else i


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize(
    "options",
    [
        dict(batch_size=None),
        dict(batch_size=4, collate_fn=lambda samples: None),
        dict(batch_size=4, collate_fn=lambda samples: samples),
    ],
    ids=["unbatched", "collate-returns-none", "collate-keeps-none"],
)
def test_none_samples_and_batches_are_yielded_as_torchs(num_workers, options) -> None:
    """A None sample (batch_size=None) or a collate_fn's None batch is
    yielded, as torch yields it: the loop decides what to do with it."""
    got = compare_with_torch(NoneForOdd, num_workers=num_workers, **options)
    assert None in got or any(None in batch for batch in got)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_getitems_is_used_like_torch(num_workers) -> None:
    class Batched(RangeDataset):
        def __getitems__(self, indices):
            return [i * 10 for i in indices]

    got = compare_with_torch(Batched, batch_size=4, num_workers=num_workers)
    assert got[0].tolist() == [0, 10, 20, 30]


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize("batch_size,drop_last", [(4, False), (4, True), (None, False)])
def test_iterable_sharded_by_worker(num_workers, batch_size, drop_last) -> None:
    # Each worker owns a shard: with in_order the interleaving is torch's.
    compare_with_torch(
        ShardedIterable, batch_size=batch_size, drop_last=drop_last, num_workers=num_workers
    )


@pytest.mark.parametrize("num_workers", [1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_whose_workers_run_dry_at_different_times(num_workers, drop_last) -> None:
    compare_with_torch(UnevenIterable, batch_size=2, drop_last=drop_last, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [2, 3])
def test_iterable_without_sharding_yields_torchs_multiset(num_workers) -> None:
    def multiset(loader):
        return Counter(x for batch in loader for x in batch.tolist())

    ours = multiset(minato.DataLoader(UnshardedIterable(10), batch_size=3, num_workers=num_workers))
    theirs = multiset(tud.DataLoader(UnshardedIterable(10), batch_size=3, num_workers=num_workers))
    assert ours == theirs == Counter({i: num_workers for i in range(10)})


def test_in_order_false_with_a_batch_sampler_moves_whole_batches_only() -> None:
    batch_sampler = [list(range(k, min(k + 7, 100))) for k in range(0, 100, 7)]
    loader = minato.DataLoader(
        RangeDataset(100), batch_sampler=batch_sampler, num_workers=3, in_order=False
    )
    assert sorted(b.tolist() for b in loader) == batch_sampler


def test_numpy_batches_become_tensors() -> None:
    class Arrays(RangeDataset):
        def __getitem__(self, i):
            return np.arange(4, dtype=np.float64) * i

    got = compare_with_torch(Arrays, batch_size=3, num_workers=2)
    assert got[0].dtype == torch.float64 and got[0].shape == (3, 4)


class CountingSampler(tud.Sampler):
    """Sequential, counting how many indices were drawn."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.drawn = 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            self.drawn += 1
            yield i


@pytest.mark.parametrize("num_workers,prefetch_factor", [(1, 1), (2, 2), (3, 3)])
@pytest.mark.parametrize("taken", [1, 2, 5])
def test_sampler_is_advanced_as_far_as_torchs(num_workers, prefetch_factor, taken) -> None:
    def drawn_after(cls):
        sampler = CountingSampler(100)
        it = iter(
            cls(
                RangeDataset(100),
                sampler=sampler,
                batch_size=2,
                num_workers=num_workers,
                prefetch_factor=prefetch_factor,
                # A fixed pool: an adaptive one that grows prefetches more.
                **({"adaptive": False} if cls is minato.DataLoader else {}),
            )
        )
        for _ in range(taken):
            next(it)
        drawn = sampler.drawn
        del it
        return drawn

    assert drawn_after(minato.DataLoader) == drawn_after(tud.DataLoader)
