"""Property tests: whatever the workload, minato delivers torch's batches, exactly once."""

from __future__ import annotations

import threading
import time

import torch
import torch.utils.data as tud
from helpers import assert_same, os_threads, threads_left_since
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minato


class DelayedDataset(tud.Dataset):
    """Item i sleeps delays[i] seconds (releasing the GIL), then returns i."""

    def __init__(self, delays: list[float]) -> None:
        self.delays = delays

    def __len__(self) -> int:
        return len(self.delays)

    def __getitem__(self, i: int) -> int:
        if self.delays[i]:
            time.sleep(self.delays[i])
        return i


workloads = st.fixed_dictionaries(
    {
        "delays": st.lists(
            st.sampled_from([0.0, 0.0, 0.0005, 0.002, 0.01]), min_size=0, max_size=60
        ),
        "num_workers": st.integers(1, 6),
        "batch_size": st.integers(1, 9),
        "drop_last": st.booleans(),
        "prefetch_factor": st.integers(1, 3),
        "sampler": st.sampled_from(["sequential", "random", "distributed"]),
        "seed": st.integers(0, 2**16),
        "stop_after": st.one_of(st.none(), st.integers(0, 10)),
        "persistent": st.booleans(),
    }
)


def _sampler(kind: str, dataset: tud.Dataset, seed: int, rank: int = 0, world: int = 2):
    if kind == "random" and len(dataset):  # RandomSampler refuses an empty dataset
        return tud.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    if kind == "distributed":
        return tud.DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed
        )
    return None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads)
def test_same_batches_as_torch_exactly_once_and_no_leaked_thread(workload) -> None:
    delays = workload["delays"]
    before = os_threads()

    def make(cls, num_workers):
        dataset = DelayedDataset(delays)
        kwargs = dict(
            batch_size=workload["batch_size"],
            drop_last=workload["drop_last"],
            sampler=_sampler(workload["sampler"], dataset, workload["seed"]),
            in_order=True,
        )
        if num_workers:
            kwargs.update(
                num_workers=num_workers,
                prefetch_factor=workload["prefetch_factor"],
                persistent_workers=workload["persistent"],
            )
        return cls(dataset, **kwargs)

    # torch in the calling thread is the reference: no processes to start.
    reference = make(tud.DataLoader, 0)
    expected = list(reference)
    loader = make(minato.DataLoader, workload["num_workers"])
    assert len(loader) == len(expected)
    got = []
    for batch in loader:
        got.append(batch)
        if workload["stop_after"] is not None and len(got) >= workload["stop_after"]:
            break
    assert_same(got, expected[: len(got)])
    if workload["stop_after"] is None:
        assert len(got) == len(expected)
    if workload["persistent"]:
        # The next epoch of the same iterator starts over, whole.
        second = list(loader)
        if workload["stop_after"] is None:
            assert_same(second, list(reference))
        else:
            # A break leaves a shuffling sampler's generator wherever prefetching
            # left it, so the order may differ (and with drop_last, which
            # samples are dropped); the sizes and, without drop_last, the
            # content may not.
            assert [len(b) for b in second] == [len(b) for b in expected]
            if not workload["drop_last"]:
                assert sorted(i for b in second for i in b.tolist()) == sorted(
                    i for b in expected for i in b.tolist()
                )
    delivered = [i for batch in got for i in batch.tolist()]
    assert len(delivered) == len(set(delivered)) or workload["sampler"] == "distributed"
    del loader
    assert not threads_left_since(before)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 50),
    world=st.integers(2, 4),
    batch_size=st.integers(1, 6),
    drop_last=st.booleans(),
    num_workers=st.integers(1, 4),
)
def test_every_distributed_rank_yields_the_same_batch_count_as_torch(
    n, world, batch_size, drop_last, num_workers
) -> None:
    counts = set()
    covered = []
    dataset = DelayedDataset([0.0] * n)
    for rank in range(world):
        sampler = tud.DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=1, drop_last=drop_last
        )
        loader = minato.DataLoader(
            dataset, sampler=sampler, batch_size=batch_size, num_workers=num_workers, in_order=False
        )
        batches = list(loader)
        counts.add(len(batches))
        assert len(batches) == len(loader)
        covered += [i for b in batches for i in b.tolist()]
    assert len(counts) == 1
    if n and not drop_last:
        assert set(covered) == set(range(n))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    delays=st.lists(st.sampled_from([0.0, 0.001, 0.005]), min_size=1, max_size=40),
    num_workers=st.integers(1, 5),
    batch_size=st.integers(1, 7),
)
def test_in_order_false_keeps_torchs_batch_sizes_and_every_index_once(
    delays, num_workers, batch_size
):
    dataset = DelayedDataset(delays)
    expected = list(tud.DataLoader(dataset, batch_size=batch_size))
    loader = minato.DataLoader(
        dataset, batch_size=batch_size, num_workers=num_workers, in_order=False
    )
    got = list(loader)
    assert [len(b) for b in got] == [len(b) for b in expected]
    assert sorted(i for b in got for i in b.tolist()) == list(range(len(delays)))


def test_many_loaders_at_once_from_several_consumer_threads() -> None:
    before = os_threads()
    results: dict[int, list[int]] = {}

    def consume(k: int) -> None:
        loader = minato.DataLoader(DelayedDataset([0.0005] * 30), batch_size=4, num_workers=3)
        results[k] = [i for b in loader for i in b.tolist()]

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(results[k] == list(range(30)) for k in range(4))
    assert not threads_left_since(before)


reordering_workloads = st.fixed_dictionaries(
    {
        "delays": st.lists(
            st.sampled_from([0.0, 0.0, 0.0005, 0.003, 0.02]), min_size=0, max_size=60
        ),
        "num_workers": st.integers(1, 6),
        "batch_size": st.integers(1, 9),
        "drop_last": st.booleans(),
        "prefetch_factor": st.integers(1, 3),
        "sampler": st.sampled_from(["sequential", "random", "distributed"]),
        "seed": st.integers(0, 2**16),
        "in_order": st.sampled_from([False, None]),
        "sample_timeout": st.sampled_from([None, 0.001, 0.005, "auto"]),
        "max_slow_samples": st.sampled_from([None, 0, 1, 3]),
        "stop_after": st.one_of(st.none(), st.integers(0, 10)),
        "persistent": st.booleans(),
    }
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=reordering_workloads)
def test_reordered_batches_have_torchs_sizes_and_every_index_exactly_once(workload) -> None:
    """Sample-level reordering under random per-sample delays, timeouts that flag
    slow samples (and start replacement workers), samplers and early breaks."""
    before = os_threads()
    dataset = DelayedDataset(workload["delays"])

    def make(cls, **kwargs):
        return cls(
            dataset,
            batch_size=workload["batch_size"],
            drop_last=workload["drop_last"],
            sampler=_sampler(workload["sampler"], dataset, workload["seed"]),
            **kwargs,
        )

    reference = make(tud.DataLoader)
    loader = make(
        minato.DataLoader,
        num_workers=workload["num_workers"],
        prefetch_factor=workload["prefetch_factor"],
        persistent_workers=workload["persistent"],
        in_order=workload["in_order"],
        sample_timeout=workload["sample_timeout"],
        sample_timeout_warmup=8,
        max_slow_samples=workload["max_slow_samples"],
    )
    epochs = 2 if workload["persistent"] else 1
    for _ in range(epochs):
        expected = list(reference)
        got = []
        for batch in loader:
            got.append(batch)
            if workload["stop_after"] is not None and len(got) >= workload["stop_after"]:
                break
        expected_indices = sorted(i for b in expected for i in b.tolist())
        got_indices = sorted(i for b in got for i in b.tolist())
        assert [len(b) for b in got] == [len(b) for b in expected][: len(got)]
        if len(got) == len(expected):
            assert got_indices == expected_indices
        else:  # a break: what was delivered is part of the epoch, each index at most once
            remaining = list(expected_indices)
            for i in got_indices:
                remaining.remove(i)
    del loader
    assert not threads_left_since(before)
