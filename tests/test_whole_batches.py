"""A reordering loader with many workers loads whole batches once an
epoch's first batches of single samples moved none, from the epoch's next
batch (minato._loader.whole_batches): the same batches and draws as before,
each sample once, and back to single samples for good once a batch keeps
the loop waiting as a late sample would."""

from __future__ import annotations

import hashlib
import io
import itertools
import threading
import time
import types

import pytest
import torch
import torch.utils.data as tud
from helpers import os_threads, threads_left_since

import minato
from minato._loader import iterator as iterator_module
from minato._loader.iterator import _SampleDataLoaderIter, _WholeBatchDataLoaderIter
from minato._loader.whole_batches import (
    MIN_WORKERS,
    SWITCH_AFTER,
    WholeBatchChoice,
    moved_few_and_short,
    whole_pool_start,
)

pytestmark = pytest.mark.timeout(240)


class Drawing(tud.Dataset):
    """Quick samples that each draw a random number; those in `slow` take
    `slow_s` while `slowing` is set."""

    def __init__(self, size: int = 320, slow: frozenset[int] = frozenset(), slow_s: float = 0.0):
        self.size, self.slow, self.slow_s = size, slow, slow_s
        # Only where some samples may be slow: worker processes cannot take an Event.
        self.slowing = threading.Event() if slow else None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        slowing = self.slowing is not None and self.slowing.is_set()
        time.sleep(self.slow_s if slowing and index in self.slow else 0.0005)
        return index, torch.rand(())


def drawing_collate(samples):
    """A collate that draws, as MixUp's does."""
    return (*tud.default_collate(samples), torch.rand(()))


def _epochs(loader: minato.DataLoader, epochs: int) -> tuple[list[str], list[type]]:
    digests, kinds = [], []
    for _ in range(epochs):
        digest = hashlib.sha256()
        batches = iter(loader)
        kinds.append(type(batches))
        for batch in batches:
            for part in batch:
                digest.update(part.numpy().tobytes())
        digests.append(digest.hexdigest())
    return digests, kinds


def _loader(dataset: tud.Dataset, **options) -> minato.DataLoader:
    options = {"batch_size": 8, "shuffle": True, "num_workers": MIN_WORKERS, **options}
    return minato.DataLoader(dataset, collate_fn=drawing_collate, **options)


@pytest.mark.parametrize(
    ("method", "persistent"),
    [("thread", False), ("thread", True), ("multiprocessing", False)],
)
def test_an_epoch_that_moved_no_sample_is_followed_by_whole_batches_that_draw_the_same(
    method: str, persistent: bool
) -> None:
    runs = {}
    for name, options in {
        "default": {},
        # A timeout of its own: the loader never chooses; nothing moves in 5 s.
        "single samples": {"sample_timeout": 5.0},
        "whole batches": {"in_order": True},
    }.items():
        torch.manual_seed(0)
        loader = _loader(Drawing(), worker_method=method, persistent_workers=persistent, **options)
        digests, kinds = _epochs(loader, 3)
        # The training loop's own draws after: the iterators drew no extra seed.
        runs[name] = (digests, kinds, torch.rand(()).item(), loader.stats())
    digests, kinds, after, stats = runs["default"]
    if stats.moved_samples and kinds[1] is _SampleDataLoaderIter:
        # On a loaded machine a worker process's start, or a thread kept off
        # a core past a stall, can make a sample late: the first epoch moved
        # it, and the loader rightly keeps single samples (and another batch
        # holds that sample), unless the move was few and short and whole
        # batches were earned, then given up for a loop they kept waiting,
        # or the second epoch moved none and earned them for the third.
        reason = stats.whole_batches_reason
        assert (
            reason is None
            or "single samples again" in reason
            or kinds[2] is _WholeBatchDataLoaderIter
        )
        return
    assert kinds[:2] == [_SampleDataLoaderIter, _WholeBatchDataLoaderIter]
    assert kinds[2] in (_SampleDataLoaderIter, _WholeBatchDataLoaderIter)
    assert stats.moved_samples == 0
    # Timing decides whether the loop took longer per batch on an epoch of
    # whole batches (then later epochs go back); the reason says which.
    reason = stats.whole_batches_reason or ""
    assert "moved no sample" in reason or "single samples again" in reason
    if kinds[2] is _SampleDataLoaderIter:
        assert "single samples again" in reason
    assert runs["single samples"][1] == [_SampleDataLoaderIter] * 3
    assert runs["single samples"][3].whole_batches_reason is None
    for name in ("single samples", "whole batches"):
        assert runs[name][0] == digests, name
        assert runs[name][2] == after, name


def test_fewer_workers_keep_single_samples() -> None:
    loader = _loader(Drawing(), num_workers=MIN_WORKERS - 1, worker_method="thread")
    _, kinds = _epochs(loader, 2)
    assert kinds == [_SampleDataLoaderIter] * 2
    assert loader.stats().whole_batches_reason is None


class InOrderShuffle(tud.Sampler[int]):
    """A sampler minato takes for a shuffling one (``shuffle = True``) that
    yields the indices in order, so that a test knows each one's position."""

    shuffle = True

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        return iter(range(self.size))

    def __len__(self) -> int:
        return self.size


def test_a_batch_that_keeps_the_loop_waiting_sends_the_loader_back_to_single_samples() -> None:
    # From the second epoch on, three samples take 1.5 s: in batches 26, 31
    # and 36, long after every worker's first.
    dataset = Drawing(slow=frozenset({200, 240, 280}), slow_s=1.5)
    sampler = InOrderShuffle(len(dataset))
    loader = _loader(dataset, sampler=sampler, shuffle=False, worker_method="thread")
    _, kinds = _epochs(loader, 1)
    if loader.stats().moved_samples:
        # Under load a quick sample ran late in the first epoch: it rightly
        # earned no whole batches.
        assert not loader._whole_batches.earned
        return
    assert dataset.slowing is not None
    dataset.slowing.set()
    more, more_kinds = _epochs(loader, 2)
    assert kinds + more_kinds == [
        _SampleDataLoaderIter,
        _WholeBatchDataLoaderIter,
        _SampleDataLoaderIter,
    ]
    stats = loader.stats()
    assert "waited" in (stats.whole_batches_reason or "")
    # Back on single samples, the late ones move rather than hold their batches.
    assert stats.moved_samples > 0
    # And for good: an epoch that moves none does not bring whole batches back.
    dataset.slowing.clear()
    _, last_kinds = _epochs(loader, 2)
    assert last_kinds == [_SampleDataLoaderIter] * 2


@pytest.mark.parametrize("stop_on", ["whole batches", "single samples"])
def test_a_state_saved_on_either_path_resumes_in_a_fresh_loader(stop_on: str) -> None:
    torch.manual_seed(0)
    uninterrupted = _loader(Drawing(), worker_method="thread")
    expected, _ = _epochs(uninterrupted, 2)

    torch.manual_seed(0)
    loader = _loader(Drawing(), worker_method="thread")
    if stop_on == "whole batches":
        _epochs(loader, 1)  # the second epoch then loads whole batches
    digest = hashlib.sha256()
    batches = iter(loader)
    saved_on = type(batches)
    for count, batch in enumerate(batches, 1):
        for part in batch:
            digest.update(part.numpy().tobytes())
        if count == 7:
            break
    saved = io.BytesIO()
    torch.save(loader.state_dict(), saved)
    moved = uninterrupted.stats().moved_samples + loader.stats().moved_samples
    del batches, loader

    torch.manual_seed(123)  # a restarted program's own draws differ
    resumed = _loader(Drawing(), worker_method="thread")
    resumed.load_state_dict(torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    batches = iter(resumed)
    assert type(batches) is saved_on
    for batch in batches:
        for part in batch:
            digest.update(part.numpy().tobytes())
    if moved or resumed.stats().moved_samples:
        # On a loaded machine a sample ran late and moved: a batch holds
        # another sample than in the other run, as the README says.
        return
    assert saved_on is (
        _WholeBatchDataLoaderIter if stop_on == "whole batches" else _SampleDataLoaderIter
    )
    epoch = 1 if stop_on == "whole batches" else 0
    assert digest.hexdigest() == expected[epoch]


def test_whole_batches_on_which_the_loop_takes_longer_per_batch_are_given_up() -> None:
    # As skewed samples do (hol.py's speech-3s): none moved, but the whole
    # pool working on the next batch fed the loop faster than whole batches.
    choice = WholeBatchChoice()
    choice.samples_epoch_ended(moved=0, batches=40, spent=0.4)
    assert choice.earned and not choice.lost
    choice.whole_epoch_ended(batches=40, spent=0.44)  # within the tolerance
    assert not choice.lost
    choice.whole_epoch_ended(batches=40, spent=0.75)
    assert choice.lost and "single samples again" in (choice.reason or "")
    # For good.
    choice.samples_epoch_ended(moved=0, batches=40, spent=0.1)
    assert choice.lost


def test_whole_batches_are_judged_against_the_pool_where_its_start_left_samples_ready() -> None:
    # The loop's first batches on single samples came at once (2 ms a
    # batch), samples the pool had loaded ahead while the first batch
    # waited for its last thread; the pool loaded a batch's samples every
    # 6 ms: whole batches at 6 ms a batch keep up with it.
    choice = WholeBatchChoice()
    choice.samples_part_ended(batches=32, spent=32 * 0.002, loading_pace=0.006)
    choice.whole_epoch_ended(batches=400, spent=400 * 0.006)
    assert not choice.lost
    # Where the loop sets the pace the pool reads faster: the loop's counts.
    choice = WholeBatchChoice()
    choice.samples_part_ended(batches=32, spent=32 * 0.006, loading_pace=0.002)
    choice.whole_epoch_ended(batches=400, spent=400 * 0.006)
    assert not choice.lost
    choice.whole_epoch_ended(batches=400, spent=400 * 0.009)
    assert choice.lost
    # So for an epoch that ran to its end on single samples: a short one's
    # batches may all have been loaded ahead of the loop.
    choice = WholeBatchChoice()
    choice.samples_epoch_ended(moved=0, batches=32, spent=32 * 0.00001, loading_pace=0.0012)
    choice.whole_epoch_ended(batches=32, spent=32 * 0.0014)
    assert not choice.lost


def test_the_pools_pace_counts_from_the_epochs_start_if_under_a_batch_since_the_first() -> None:
    def pace(marks: list[tuple[float, int]]) -> float | None:
        # 64 samples a batch; at the hand-over, 10 s in, 1,000 samples loaded.
        iterator = types.SimpleNamespace(
            _samples_per_batch=64, _loaded_marks=marks, _loaded_mark=lambda _live: (10.0, 1000)
        )
        return _SampleDataLoaderIter._loading_pace(iterator, {})  # type: ignore[arg-type]

    # From the loop's first batch (8 s in, 800 loaded): 200 samples in 2 s.
    assert pace([(0.0, 0), (8.0, 800)]) == pytest.approx(2 * 64 / 200)
    # Ten samples since the first batch, the batches after it taken from
    # samples loaded before: from the epoch's start, 1,000 in 10 s.
    assert pace([(0.0, 0), (9.0, 990)]) == pytest.approx(10 * 64 / 1000)
    assert pace([]) is None


def test_a_hand_over_tells_the_choice_the_pools_loading_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    told: list[tuple] = []
    samples_part_ended = WholeBatchChoice.samples_part_ended

    def record(self, *args) -> None:
        told.append(args)
        samples_part_ended(self, *args)

    monkeypatch.setattr(WholeBatchChoice, "samples_part_ended", record)
    if _long_epoch_handed_over() is None:
        return
    (batches_on_samples, spent, _moved, loading_pace) = told[-1]
    assert batches_on_samples > 0 and spent > 0
    # The pool's time per batch's samples since the loop's first batch.
    assert loading_pace is not None and loading_pace > 0


def test_an_epoch_that_moved_a_sample_earns_no_whole_batches() -> None:
    choice = WholeBatchChoice()
    choice.samples_epoch_ended(moved=1, batches=40, spent=0.4)
    assert not choice.earned and choice.reason is None


# Enough batches that an epoch has handed over to whole batches part way:
# SWITCH_AFTER of each worker's, and one more of each to spare.
HANDOVER_BATCH = (1 + SWITCH_AFTER) * MIN_WORKERS
LONG_EPOCH = 8 * (HANDOVER_BATCH + 12 * MIN_WORKERS)


class Indexed(Drawing):
    """Drawing's samples, each with its index: which sample each batch holds."""

    def __getitem__(self, index: int):
        time.sleep(0.0005)
        return index, torch.rand(())


def _handed_over(batches: object) -> bool:
    return getattr(batches, "_handed_over", False)


def _long_epoch_handed_over() -> minato.DataLoader | None:
    """A fresh loader's long epoch, each sample once: the loader where it
    handed over to whole batches, None where under load a sample ran late
    before the hand-over and the epoch rightly stayed on single samples."""
    loader = _loader(Indexed(LONG_EPOCH), worker_method="thread")
    batches = iter(loader)
    seen = [index for indices, _, _ in batches for index in indices.tolist()]
    assert sorted(seen) == list(range(LONG_EPOCH))
    if not _handed_over(batches):
        assert loader.stats().moved_samples
        return None
    return loader


def test_a_fresh_loaders_first_epoch_hands_over_to_whole_batches_each_sample_once() -> None:
    before = os_threads()
    torch.manual_seed(0)
    loader = _loader(Indexed(LONG_EPOCH), worker_method="thread")
    batches = iter(loader)
    in_flight = loader.prefetch_factor * loader.effective_max_workers()
    seen: list[int] = []
    draws = hashlib.sha256()
    for indices, values, collated in batches:
        seen.extend(indices.tolist())
        draws.update(values.numpy().tobytes() + collated.numpy().tobytes())
        # One pool at a time: the engine the epoch hands over from empties
        # before the whole batches' engine starts.
        if batches._draining is not None:
            assert batches._engine is batches._draining
        engine = batches._engine
        if _handed_over(batches) and batches._draining is None and engine is not None:
            # And it holds what one loader's prefetch would (which scales
            # with the adaptive pool, up to its bound).
            assert engine.pending() <= in_flight
    stats = loader.stats()
    after = torch.rand(()).item()
    assert sorted(seen) == list(range(LONG_EPOCH))
    if stats.moved_samples:
        # Under load a sample ran late before the hand-over: the epoch rightly
        # stayed on single samples.
        assert not _handed_over(batches)
        return
    assert _handed_over(batches), stats.whole_batches_reason
    assert "from its next batch" in (stats.whole_batches_reason or "")
    # The same data and draws as an epoch on single samples, and the loop's
    # generator where that one leaves it.
    torch.manual_seed(0)
    single = _loader(Indexed(LONG_EPOCH), worker_method="thread", sample_timeout=5.0)
    expected = hashlib.sha256()
    expected_seen: list[int] = []
    for indices, values, collated in single:
        expected_seen.extend(indices.tolist())
        expected.update(values.numpy().tobytes() + collated.numpy().tobytes())
    assert seen == expected_seen
    assert draws.hexdigest() == expected.hexdigest()
    assert torch.rand(()).item() == after
    # Both engines' threads are gone with the epoch.
    del batches, loader, single
    assert not threads_left_since(before)


@pytest.mark.parametrize("stop_at", [HANDOVER_BATCH + 2, HANDOVER_BATCH + 6 * MIN_WORKERS])
def test_a_state_saved_after_the_hand_over_resumes_each_sample_once(stop_at: int) -> None:
    # At stop_at, the engine handed over from may still be delivering its
    # batches (just after the hand-over), or be gone (later).
    torch.manual_seed(0)
    uninterrupted = [
        (indices.tolist(), values)
        for indices, values, _ in _loader(Indexed(LONG_EPOCH), worker_method="thread")
    ]
    torch.manual_seed(0)
    loader = _loader(Indexed(LONG_EPOCH), worker_method="thread")
    batches = iter(loader)
    got = []
    for count, (indices, values, _) in enumerate(batches, 1):
        got.append((indices.tolist(), values))
        if count == stop_at:
            break
    handed_over = _handed_over(batches)
    saved = io.BytesIO()
    torch.save(loader.state_dict(), saved)
    del batches, loader

    resumed = _loader(Indexed(LONG_EPOCH), worker_method="thread")
    resumed.load_state_dict(torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    got.extend((indices.tolist(), values) for indices, values, _ in resumed)
    seen = [index for indices, _ in got for index in indices]
    assert sorted(seen) == list(range(LONG_EPOCH))
    if handed_over and not resumed.stats().moved_samples:
        # Nothing moved anywhere: the very batches, the very draws.
        assert [indices for indices, _ in got] == [indices for indices, _ in uninterrupted]
        for (_, values), (_, expected) in zip(got, uninterrupted, strict=True):
            assert torch.equal(values, expected)


@pytest.mark.parametrize(
    "options",
    [
        {"worker_method": "multiprocessing"},
        {"worker_method": "thread", "on_error": "skip"},
        {"worker_method": "thread", "in_order": False},
        {"worker_method": "thread", "sample_timeout": 5.0},
    ],
    ids=["processes", "skipping", "in_order=False", "own timeout"],
)
def test_an_epoch_hands_over_only_on_threads_with_the_choice_left_to_minato(options) -> None:
    loader = _loader(Indexed(LONG_EPOCH), **options)
    batches = iter(loader)
    seen = [index for indices, _, _ in batches for index in indices.tolist()]
    assert sorted(seen) == list(range(LONG_EPOCH))
    assert not _handed_over(batches)


class WorkerRecording(Indexed):
    """Indexed's samples; records which worker thread loaded each, by id."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.loaded_by: list[tuple[int, int]] = []  # shared by every worker's copy

    def __getitem__(self, index: int):
        info = tud.get_worker_info()
        assert info is not None
        self.loaded_by.append((info.id, threading.get_ident()))
        return super().__getitem__(index)


def test_no_worker_id_is_given_twice_across_the_hand_over() -> None:
    dataset = WorkerRecording(LONG_EPOCH)
    loader = _loader(dataset, worker_method="thread")
    batches = iter(loader)
    for _ in batches:
        pass
    threads_of: dict[int, set[int]] = {}
    for worker_id, thread in dataset.loaded_by:
        threads_of.setdefault(worker_id, set()).add(thread)
    assert all(len(threads) == 1 for threads in threads_of.values()), threads_of
    if _handed_over(batches):
        # Both pools loaded samples: more ids than one pool's workers.
        assert len(threads_of) > MIN_WORKERS


class HeldAfter(Indexed):
    """Indexed's samples; from the `limit`-th sample loaded on, each waits
    for `release` (at most `hold_s`): the batches after the hand-over's are
    still queued when it comes."""

    def __init__(self, size: int, limit: int, hold_s: float = 5.0) -> None:
        super().__init__(size)
        self.limit, self.hold_s = limit, hold_s
        self.loaded = itertools.count()  # shared by every worker's copy
        self.release = threading.Event()

    def __getitem__(self, index: int):
        if next(self.loaded) >= self.limit:
            self.release.wait(self.hold_s)
        return super().__getitem__(index)


def test_the_batches_no_worker_started_at_the_hand_over_are_loaded_whole_with_the_same_draws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every sample of the batches up to the hand-over's loads at once; the
    # workers then wait, so the batches after it are still queued: the old
    # engine gives them back, and the whole batches' engine loads them.
    limit = HANDOVER_BATCH * 8 + 8
    dataset = HeldAfter(LONG_EPOCH, limit)
    taken_back: list[int] = []
    switch = _SampleDataLoaderIter._switch_to_whole

    def switch_and_release(self, loader, *args) -> None:
        switch(self, loader, *args)
        taken_back.append(len(self._withdrawn))
        dataset.release.set()

    monkeypatch.setattr(_SampleDataLoaderIter, "_switch_to_whole", switch_and_release)
    torch.manual_seed(0)
    loader = _loader(dataset, worker_method="thread")
    batches = iter(loader)
    got, state = [], None
    for indices, values, collated in batches:
        got.append((indices.tolist(), values, collated))
        if state is None and _handed_over(batches) and batches._withdrawn:
            # Saved while the batches taken back wait for their engine.
            state = io.BytesIO()
            torch.save(loader.state_dict(), state)
            resume_after = len(got)
    if loader.stats().moved_samples:
        # Under load a sample ran late before the hand-over: the epoch rightly
        # stayed on single samples.
        assert not _handed_over(batches)
        return
    assert _handed_over(batches)
    assert taken_back and taken_back[0] > 0
    assert state is not None
    # The very batches and draws of an epoch on single samples.
    torch.manual_seed(0)
    single = _loader(Indexed(LONG_EPOCH), worker_method="thread", sample_timeout=5.0)
    expected = [(indices.tolist(), values, collated) for indices, values, collated in single]
    assert [indices for indices, _, _ in got] == [indices for indices, _, _ in expected]
    for (_, values, collated), (_, want_values, want_collated) in zip(got, expected, strict=True):
        assert torch.equal(values, want_values) and torch.equal(collated, want_collated)
    # And the state saved then resumes the rest, each sample once.
    resumed = _loader(Indexed(LONG_EPOCH), worker_method="thread")
    resumed.load_state_dict(torch.load(io.BytesIO(state.getvalue()), weights_only=True))
    rest = [indices.tolist() for indices, _, _ in resumed]
    seen = [index for indices, _, _ in got[:resume_after] for index in indices]
    seen += [index for indices in rest for index in indices]
    assert sorted(seen) == list(range(LONG_EPOCH))


class OneSlow(tud.Dataset):
    """Samples of 3 ms (a batch of 64 takes a worker 192 ms: a stall is
    three times that), but for those in `slow` that take `slow_s`."""

    def __init__(self, size: int, slow: range, slow_s: float) -> None:
        self.size, self.slow, self.slow_s = size, slow, slow_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        time.sleep(self.slow_s if index in self.slow else 0.003)
        return index, torch.rand(())


def _one_slow_loader(
    batches: int, slow_s: float, slow: range = range(200, 201)
) -> minato.DataLoader:
    # Batches of 64, a fixed pool: the hand-over is asked for from the 8th
    # batch on, 16 in flight; sample 200, in the 4th batch, is late past the
    # 0.1 s floor of lateness (and those after it in `slow`, on other
    # threads at the same time).
    dataset = OneSlow(batches * 64, slow=slow, slow_s=slow_s)
    return _loader(
        dataset,
        batch_size=64,
        sampler=InOrderShuffle(len(dataset)),
        shuffle=False,
        worker_method="thread",
        adaptive=False,
    )


def _an_epoch(loader: minato.DataLoader) -> tuple[object, list[int]]:
    batches = iter(loader)
    return batches, [index for indices, _, _ in batches for index in indices.tolist()]


def _one_slow_epoch(slow_s: float) -> tuple[minato.DataLoader, object, list[int]]:
    loader = _one_slow_loader(80, slow_s)
    return (loader, *_an_epoch(loader))


def _judging(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The arguments of every judgement of moved samples, as they are made."""
    judged: list[tuple] = []

    def judge(*args):
        judged.append(args)
        return moved_few_and_short(*args)

    monkeypatch.setattr(iterator_module, "moved_few_and_short", judge)
    return judged


def _last_found_few_and_short(judged: list[tuple]) -> bool:
    """Whether the last judgement found the moved samples done and short:
    under load a thread kept off a core for a stall's time makes it not so."""
    return moved_few_and_short(*judged[-1]) is True


def test_an_epoch_that_moved_a_sample_whole_batches_would_not_have_waited_on_hands_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Late, but done within what a batch of whole samples may keep the loop
    # waiting anyway (three batches' loading time): on cores that are taken,
    # a thread kept off one moves its sample so.
    judged = _judging(monkeypatch)
    loader, batches, seen = _one_slow_epoch(0.2)
    assert sorted(seen) == list(range(80 * 64))
    stats = loader.stats()
    if stats.moved_samples != 1:
        # Under load other samples ran late too, or the timeout rose past it.
        return
    if not _last_found_few_and_short(judged):
        assert not _handed_over(batches)
        return
    assert _handed_over(batches)
    assert "moved 1 sample, none that whole batches" in (stats.whole_batches_reason or "")


def test_an_epoch_that_ran_to_its_end_having_moved_a_short_late_sample_earns_whole_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Too short to hand over part way (its last four batches of each
    # worker's are given out by the time it may): the next epoch loads whole.
    judged = _judging(monkeypatch)
    loader = _one_slow_loader(40, 0.2)
    first, seen = _an_epoch(loader)
    assert sorted(seen) == list(range(40 * 64)) and not _handed_over(first)
    if loader.stats().moved_samples != 1:
        return  # under load other samples ran late too, or the timeout rose past it
    second, seen = _an_epoch(loader)
    assert sorted(seen) == list(range(40 * 64))
    if not _last_found_few_and_short(judged):
        assert isinstance(second, _SampleDataLoaderIter)
        return
    assert isinstance(second, _WholeBatchDataLoaderIter)
    assert "moved 1 sample, none that whole batches" in (loader.stats().whole_batches_reason or "")


def test_samples_moved_together_by_one_stall_hand_over(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three samples late at once, on three threads: on cores that are
    # taken, one stall moves the samples of every thread it keeps off a
    # core, where whole batches would have waited on it once.
    judged = _judging(monkeypatch)
    loader = _one_slow_loader(80, 0.2, slow=range(200, 203))
    batches, seen = _an_epoch(loader)
    assert sorted(seen) == list(range(80 * 64))
    stats = loader.stats()
    if stats.moved_samples != 3:
        return  # under load other samples ran late too, or the timeout rose past them
    assert judged and judged[-1][0] == 3
    if not _last_found_few_and_short(judged):
        # Under load a thread reached its slow sample after the others' ended.
        assert not _handed_over(batches)
        return
    assert judged[-1][2] == 1  # one stall
    assert _handed_over(batches)
    assert "moved 3 samples, none that whole batches" in (stats.whole_batches_reason or "")


def test_an_epoch_that_moved_a_sample_whole_batches_would_have_waited_on_stays() -> None:
    loader, batches, seen = _one_slow_epoch(3.0)
    assert sorted(seen) == list(range(80 * 64))
    assert loader.stats().moved_samples >= 1
    assert not _handed_over(batches)
    assert loader.stats().whole_batches_reason is None


def test_a_few_moved_samples_hand_over_only_when_done_and_short() -> None:
    # moved, of samples, in stalls, still loading, the longest stall,
    # samples a batch, the median fetch time.
    assert moved_few_and_short(1, 1024, 1, 0, 0.2, 64, 0.002) is True
    # Several moved by one stall: whole batches would have waited once.
    assert moved_few_and_short(10, 1024, 1, 0, 0.2, 64, 0.002) is True
    # Few: at most one in a hundred...
    assert moved_few_and_short(11, 1024, 1, 0, 0.2, 64, 0.002) is False
    # ...in one stall for every thousand samples, one at least.
    assert moved_few_and_short(2, 1024, 2, 0, 0.2, 64, 0.002) is False
    assert moved_few_and_short(2, 2048, 2, 0, 0.2, 64, 0.002) is True
    # Still loading: asked again.
    assert moved_few_and_short(1, 1024, 0, 1, None, 64, 0.002) is None
    # An epoch that ran to its end so earns whole batches for the next.
    choice = WholeBatchChoice()
    choice.samples_epoch_ended(moved=1, batches=40, spent=0.4, few_and_short=True)
    assert choice.earned and "moved 1 sample" in (choice.reason or "")
    # As long as a stall: a whole batch would have kept the loop waiting.
    assert moved_few_and_short(1, 1024, 1, 0, 0.5, 64, 0.002) is False


@pytest.mark.parametrize(
    ("figures", "adaptive", "start"),
    [
        # A fixed pool keeps its size, whatever the sample pool did.
        ({"workers": 12, "settled_workers": 12}, False, 8),
        # A growth step still to be judged is not carried over.
        ({"workers": 64, "settled_workers": 32}, True, 32),
        ({"workers": 35, "settled_workers": 34}, True, 34),
        # No window judged yet: the pool's size.
        ({"workers": 8, "settled_workers": None}, True, 8),
    ],
)
def test_a_pool_of_whole_batches_starts_from_what_the_sample_pool_stands_by(
    figures: dict, adaptive: bool, start: int
) -> None:
    assert whole_pool_start(figures, 8, adaptive) == start


def test_the_hand_over_starts_whole_batches_where_the_sample_pools_controller_stood(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    figures_seen: list[dict] = []
    chosen: list[int] = []
    engines: list[dict] = []

    def start_recorded(figures, num_workers, adaptive):
        figures_seen.append(figures)
        chosen.append(whole_pool_start(figures, num_workers, adaptive))
        return chosen[-1]

    engine = iterator_module.Engine

    def engine_recorded(*args, **options):
        engines.append(options)
        return engine(*args, **options)

    monkeypatch.setattr(iterator_module, "whole_pool_start", start_recorded)
    monkeypatch.setattr(iterator_module, "Engine", engine_recorded)
    loader = _long_epoch_handed_over()
    if loader is None:
        return
    # The sample engine says what its controller stands by, and the pool of
    # whole batches starts there.
    (figures,) = figures_seen
    assert "settled_workers" in figures
    (whole,) = engines
    assert whole["num_workers"] == chosen[0]
    assert whole["max_workers"] == loader.effective_max_workers()
