"""state_dict / load_state_dict: a restarted loader delivers exactly what the
interrupted epoch had not delivered, then the epochs an uninterrupted run would."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest
import torch
import torch.utils.data as tud
from helpers import RangeDataset, ShardedIterable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minato

N = 120
BATCH = 8
BATCHES = N // BATCH


class SlowSamples(tud.Dataset):
    """Item i is i; every 17th sample is slow, so it is in flight when others finish."""

    def __init__(self, n: int = N, slow_s: float = 0.03) -> None:
        self.n = n
        self.slow_s = slow_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i % 17 == 5:
            time.sleep(self.slow_s)
        return i


# Each kind of iterator minato has: calling thread, in order, whole batches
# reordered (a user's batch_sampler), single samples reordered with slow ones
# deferred past the per-sample timeout.
KINDS = {
    "calling-thread": dict(num_workers=0),
    "in-order": dict(num_workers=3, in_order=True),
    "batches-reordered": dict(num_workers=3, in_order=False, batch_sampler="random"),
    "samples-reordered": dict(num_workers=3, sample_timeout=0.005),
    "samples-reordered-persistent": dict(num_workers=3, persistent_workers=True),
}


def make_loader(kind: str, seed: int, dataset: tud.Dataset | None = None) -> minato.DataLoader:
    options = dict(KINDS[kind])
    generator = torch.Generator().manual_seed(seed)
    dataset = SlowSamples() if dataset is None else dataset
    if options.pop("batch_sampler", None):
        sampler = tud.RandomSampler(dataset, generator=generator)
        batch_sampler = tud.BatchSampler(sampler, BATCH, drop_last=False)
        return minato.DataLoader(dataset, batch_sampler=batch_sampler, **options)
    return minato.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, generator=generator, **options
    )


def as_lists(batches: list[Any]) -> list[list[int]]:
    return [[int(x) for x in batch] for batch in batches]


def round_trip(state: dict[str, Any]) -> dict[str, Any]:
    """Through torch.save and a weights-only torch.load, as a checkpoint goes."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def generator_state(loader: minato.DataLoader) -> torch.Tensor:
    generator = loader.generator or loader.batch_sampler.sampler.generator
    return generator.get_state()


def interrupted_at(kind: str, cut: int) -> tuple[list[list[int]], dict[str, Any]]:
    """The first `cut` batches of an epoch and the state saved after them."""
    loader = make_loader(kind, seed=1)
    iterator = iter(loader)
    before = as_lists([next(iterator) for _ in range(cut)])
    state = round_trip(loader.state_dict())
    del iterator
    return before, state


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("cut", [0, 1, 6, BATCHES - 1, BATCHES])
def test_resume_delivers_exactly_the_rest_of_the_epoch_then_the_same_epochs(
    kind: str, cut: int, no_leaked_threads: None
) -> None:
    uninterrupted = make_loader(kind, seed=1)
    first_epoch = as_lists(list(uninterrupted))
    generator_after_epoch = generator_state(uninterrupted)
    second_epoch = as_lists(list(uninterrupted))

    before, state = interrupted_at(kind, cut)
    # Another seed: everything that matters comes from the state.
    resumed = make_loader(kind, seed=99)
    resumed.load_state_dict(state)
    after = as_lists(list(resumed))

    delivered = [i for batch in before + after for i in batch]
    assert sorted(delivered) == list(range(N)), "an index was lost or delivered twice"
    assert len(before) + len(after) == len(first_epoch)
    assert torch.equal(generator_state(resumed), generator_after_epoch)
    next_epoch = as_lists(list(resumed))
    if kind in ("calling-thread", "in-order"):
        assert before + after == first_epoch
        assert next_epoch == second_epoch
    else:
        assert sorted(sum(next_epoch, [])) == list(range(N))


def test_samples_in_flight_at_the_checkpoint_are_delivered_after_resume() -> None:
    loader = make_loader("samples-reordered", seed=1, dataset=SlowSamples(slow_s=0.2))
    iterator = iter(loader)
    before = as_lists([next(iterator) for _ in range(3)])
    state = loader.state_dict()
    # The slow samples the first batches skipped are still running or queued.
    assert len(state["epoch"]["undelivered"]) > 0
    del iterator
    resumed = make_loader("samples-reordered", seed=5, dataset=SlowSamples(slow_s=0.2))
    resumed.load_state_dict(state)
    after = as_lists(list(resumed))
    assert sorted(i for batch in before + after for i in batch) == list(range(N))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=BATCHES), min_size=1, max_size=3),
    workers=st.integers(min_value=1, max_value=4),
    kind=st.sampled_from(["samples-reordered", "batches-reordered", "in-order"]),
)
def test_property_exactly_once_over_an_epoch_interrupted_anywhere(
    cuts: list[int], workers: int, kind: str
) -> None:
    """Interrupt at random batch positions, possibly several times in one
    epoch, with slow samples in flight: each index arrives exactly once."""
    options = dict(KINDS[kind], num_workers=workers)
    dataset = SlowSamples(slow_s=0.01)

    def loader() -> minato.DataLoader:
        generator = torch.Generator().manual_seed(7)
        opts = dict(options)
        if opts.pop("batch_sampler", None):
            sampler = tud.RandomSampler(dataset, generator=generator)
            return minato.DataLoader(
                dataset, batch_sampler=tud.BatchSampler(sampler, BATCH, False), **opts
            )
        return minato.DataLoader(
            dataset, batch_size=BATCH, shuffle=True, generator=generator, **opts
        )

    delivered: list[int] = []
    state = None
    ended = False
    for cut in cuts:
        current = loader()
        if state is not None:
            current.load_state_dict(round_trip(state))
        iterator = iter(current)
        for _ in range(cut):
            try:
                delivered.extend(int(i) for i in next(iterator))
            except StopIteration:
                ended = True
                break
        state = current.state_dict()
        del iterator
        if ended:
            # The epoch is over: a state saved now starts the next one.
            assert state["epoch"] is None
            break
    if not ended:
        last = loader()
        last.load_state_dict(round_trip(state))
        delivered.extend(int(i) for batch in last for i in batch)
    assert sorted(delivered) == list(range(N))


def test_global_generator_order_resumes_without_touching_the_programs_generator() -> None:
    """generator=None: the epoch's order came from torch's global generator."""
    dataset = RangeDataset(N)
    torch.manual_seed(0)
    expected = as_lists(list(minato.DataLoader(dataset, batch_size=BATCH, shuffle=True)))
    torch.manual_seed(0)
    loader = minato.DataLoader(dataset, batch_size=BATCH, shuffle=True)
    iterator = iter(loader)
    before = as_lists([next(iterator) for _ in range(4)])
    state = loader.state_dict()
    torch.manual_seed(1234)
    resumed = minato.DataLoader(dataset, batch_size=BATCH, shuffle=True)
    resumed.load_state_dict(state)
    program_state = torch.get_rng_state()
    after = as_lists(list(resumed))
    assert before + after == expected
    # The replay drew from the saved state; the program's generator gave only
    # the iterator's base seed, as torch's iterator draws it.
    final = torch.get_rng_state()
    torch.set_rng_state(program_state)
    torch.empty((), dtype=torch.int64).random_()
    assert torch.equal(final, torch.get_rng_state())


def test_state_after_a_finished_epoch_starts_the_next_one() -> None:
    loader = make_loader("in-order", seed=3)
    epochs = [as_lists(list(loader)) for _ in range(3)]
    fresh = make_loader("in-order", seed=3)
    list(fresh)
    state = fresh.state_dict()
    assert state["epoch"] is None
    resumed = make_loader("in-order", seed=42)
    resumed.load_state_dict(state)
    assert [as_lists(list(resumed)) for _ in range(2)] == epochs[1:]


def test_state_after_the_last_batch_but_before_stopiteration_resumes_an_empty_rest() -> None:
    before, state = interrupted_at("in-order", BATCHES)
    assert state["epoch"] is not None
    resumed = make_loader("in-order", seed=8)
    resumed.load_state_dict(state)
    assert list(resumed) == []
    assert sorted(sum(as_lists(list(resumed)), [])) == list(range(N))


def test_state_before_iterating_is_a_fresh_start() -> None:
    loader = make_loader("in-order", seed=3)
    state = loader.state_dict()
    expected = as_lists(list(loader))
    resumed = make_loader("in-order", seed=77)
    resumed.load_state_dict(state)
    assert as_lists(list(resumed)) == expected


def test_a_persistent_iterator_resumes_a_loaded_state_at_its_next_epoch() -> None:
    loader = make_loader("samples-reordered-persistent", seed=1)
    iterator = iter(loader)
    before = as_lists([next(iterator) for _ in range(5)])
    state = loader.state_dict()
    list(iterator)  # finish the epoch; the state still says where it was
    loader.load_state_dict(state)
    after = as_lists(list(loader))
    assert sorted(i for batch in before + after for i in batch) == list(range(N))


def test_a_batch_that_raised_counts_as_delivered() -> None:
    class FailsOnce(RangeDataset):
        def __getitem__(self, i: int) -> int:
            if i == 0:
                raise KeyError("bad sample")
            return i

    def loader() -> minato.DataLoader:
        return minato.DataLoader(FailsOnce(N), batch_size=BATCH, num_workers=2, in_order=True)

    first = loader()
    iterator = iter(first)
    with pytest.raises(KeyError):
        next(iterator)
    delivered = [int(i) for _ in range(3) for i in next(iterator)]
    state = first.state_dict()
    del iterator
    resumed = loader()
    resumed.load_state_dict(state)
    delivered += [int(i) for batch in resumed for i in batch]
    # The failed batch (0..7) is not loaded again, nothing else is lost.
    assert sorted(delivered) == list(range(BATCH, N))


class StatefulDataset(RangeDataset):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.difficulty = 0

    def state_dict(self) -> dict[str, int]:
        return {"difficulty": self.difficulty}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.difficulty = state["difficulty"]


def test_the_datasets_own_state_is_saved_and_restored() -> None:
    dataset = StatefulDataset(N)
    dataset.difficulty = 3
    state = minato.DataLoader(dataset, batch_size=BATCH).state_dict()
    restored = StatefulDataset(N)
    minato.DataLoader(restored, batch_size=BATCH).load_state_dict(state)
    assert restored.difficulty == 3


def test_torchdatas_stateful_distributed_sampler_resumes_from_its_own_state() -> None:
    sampler_module = pytest.importorskip("torchdata.stateful_dataloader.sampler")
    dataset = SlowSamples()

    def loader() -> minato.DataLoader:
        sampler = sampler_module.StatefulDistributedSampler(
            dataset, num_replicas=2, rank=1, shuffle=True, seed=4
        )
        sampler.set_epoch(2)
        return minato.DataLoader(
            dataset, batch_size=BATCH, sampler=sampler, num_workers=3, sample_timeout=0.005
        )

    shard = list(loader().sampler)
    first = loader()
    iterator = iter(first)
    before = as_lists([next(iterator) for _ in range(2)])
    state = round_trip(first.state_dict())
    assert state["epoch"]["mode"] == "sampler"
    del iterator
    resumed = loader()
    resumed.load_state_dict(state)
    after = as_lists(list(resumed))
    assert sorted(i for batch in before + after for i in batch) == sorted(shard)


def test_torchdatas_random_sampler_replays_from_its_generator() -> None:
    sampler_module = pytest.importorskip("torchdata.stateful_dataloader.sampler")
    dataset = RangeDataset(N)

    def loader(seed: int) -> minato.DataLoader:
        generator = torch.Generator().manual_seed(seed)
        sampler = sampler_module.RandomSampler(dataset, generator=generator)
        return minato.DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=2)

    expected = as_lists(list(loader(5)))
    first = loader(5)
    iterator = iter(first)
    before = as_lists([next(iterator) for _ in range(5)])
    state = round_trip(first.state_dict())
    del iterator
    resumed = loader(6)
    resumed.load_state_dict(state)
    after = as_lists(list(resumed))
    assert sorted(sum(before + after, [])) == list(range(N))
    assert sorted(map(sorted, before + after)) == sorted(map(sorted, expected))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dataset_streams_resume_where_each_left_off(num_workers: int) -> None:
    def loader() -> minato.DataLoader:
        return minato.DataLoader(ShardedIterable(N), batch_size=BATCH, num_workers=num_workers)

    first = loader()
    iterator = iter(first)
    before = as_lists([next(iterator) for _ in range(5)])
    state = round_trip(first.state_dict())
    del iterator
    resumed = loader()
    resumed.load_state_dict(state)
    after = as_lists(list(resumed))
    assert sorted(i for batch in before + after for i in batch) == list(range(N))
    # The epoch after that is whole again.
    assert sorted(sum(as_lists(list(resumed)), [])) == list(range(N))


def test_an_iterable_state_needs_the_same_number_of_streams() -> None:
    first = minato.DataLoader(ShardedIterable(N), batch_size=BATCH, num_workers=2)
    iterator = iter(first)
    next(iterator)
    state = first.state_dict()
    del iterator
    with pytest.raises(ValueError, match="2 streams"):
        minato.DataLoader(ShardedIterable(N), batch_size=BATCH, num_workers=3).load_state_dict(
            state
        )


def test_a_state_from_elsewhere_is_refused() -> None:
    loader = minato.DataLoader(RangeDataset(N), batch_size=BATCH)
    with pytest.raises(ValueError, match="minato.DataLoader.state_dict"):
        loader.load_state_dict({"_num_yielded": 3})
    state = loader.state_dict()
    state["version"] = 999
    with pytest.raises(ValueError, match="version 999"):
        loader.load_state_dict(state)


def test_a_sample_level_state_is_refused_by_a_whole_batch_loader() -> None:
    _, state = interrupted_at("samples-reordered", 2)
    with pytest.raises(ValueError, match="reorders single samples"):
        make_loader("in-order", seed=1).load_state_dict(state)


def test_state_dict_is_safe_to_call_while_workers_run() -> None:
    """A checkpoint taken from another thread while the loop iterates (an
    async checkpointing callback) sees a consistent state."""
    loader = make_loader("samples-reordered", seed=1)
    states = []
    stop = threading.Event()

    def checkpoint() -> None:
        while not stop.is_set():
            states.append(loader.state_dict())
            time.sleep(0.001)

    saver = threading.Thread(target=checkpoint)
    saver.start()
    try:
        assert sorted(sum(as_lists(list(loader)), [])) == list(range(N))
    finally:
        stop.set()
        saver.join()
    assert states


def test_the_ledger_keeps_each_units_position_until_it_is_delivered() -> None:
    from minato._minato import SampleLedger

    ledger = SampleLedger(5, [3, 1], ["c", "a"])  # carried over, out of order
    assert (ledger.queued, ledger.next_position) == (2, 5)
    assert ledger.hand_out(1, ["x", "y"]) == [(1, "a"), (5, "x"), (6, "y")]
    ledger.delivered([5])
    ledger.skipped(6)
    assert ledger.undelivered() == ([1, 3], ["a", "c"])
    assert ledger.indices_of([1, 5]) == ["a", None]
    ledger.requeue_pending()
    assert ledger.hand_out(5, []) == [(1, "a"), (3, "c")]
    with pytest.raises(ValueError, match="2 positions for 1 carried indices"):
        SampleLedger(0, [0, 1], ["a"])
