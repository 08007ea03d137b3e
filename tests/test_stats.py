"""loader.stats(), log_interval, the GIL hint, and the adaptive pool as users see them."""

from __future__ import annotations

import logging
import time

import pytest
import torch.utils.data as tud
from helpers import RangeDataset, ShardedIterable

import minato
from minato._loader.stats import StatsRecorder


def drain(loader) -> list[int]:
    sizes = []
    for batch in loader:
        sizes.append(len(batch))
    return sizes


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_workers=0),
        dict(num_workers=2),
        dict(num_workers=2, shuffle=True),
        dict(num_workers=3, shuffle=True, drop_last=True),
        dict(num_workers=2, in_order=False),
        dict(num_workers=2, adaptive=False),
    ],
)
def test_samples_and_batches_agree_with_what_was_delivered(kwargs) -> None:
    loader = minato.DataLoader(RangeDataset(103), batch_size=8, **kwargs)
    sizes = drain(loader) + drain(loader)
    stats = loader.stats()
    assert stats.batches == len(sizes) == 2 * len(loader)
    assert stats.samples == sum(sizes)
    assert stats.starved >= 0.0
    assert stats.elapsed > 0.0


def test_an_iterable_datasets_short_last_batches_are_counted_exactly() -> None:
    loader = minato.DataLoader(ShardedIterable(50), batch_size=8, num_workers=3)
    sizes = drain(loader)
    assert loader.stats().samples == sum(sizes) == 50
    assert loader.stats().batches == len(sizes)


def test_batch_size_none_counts_one_sample_per_item() -> None:
    loader = minato.DataLoader(RangeDataset(20), batch_size=None, num_workers=2)
    assert len(list(loader)) == 20
    assert (loader.stats().samples, loader.stats().batches) == (20, 20)


def test_worker_figures_are_consistent() -> None:
    class Sleepy(RangeDataset):
        def __getitem__(self, i):
            time.sleep(0.001)
            return i

    loader = minato.DataLoader(Sleepy(64), batch_size=4, num_workers=3, adaptive=False)
    it = iter(loader)
    next(it)
    assert loader.stats().workers == 3
    list(it)
    stats = loader.stats()
    assert stats.workers == 0, "no worker runs once the epoch ended"
    assert stats.worker_history[0][1] == 3 and len(stats.worker_history) == 1
    assert stats.fetch_p50 is not None and stats.fetch_p90 is not None
    assert stats.fetch_p99 is not None
    assert 0.001 <= stats.fetch_p50 <= stats.fetch_p90 <= stats.fetch_p99
    assert 0.0 <= stats.gil_wait <= stats.fetch_time
    assert stats.queue_occupancy is not None and 0.0 <= stats.queue_occupancy <= 1.0
    assert stats.slow_samples == 0


def test_reordered_loading_reports_its_sample_timeout() -> None:
    loader = minato.DataLoader(
        RangeDataset(40), batch_size=4, shuffle=True, num_workers=2, sample_timeout=0.25
    )
    drain(loader)
    assert loader.stats().sample_timeout == pytest.approx(0.25)


def test_stats_print_as_a_table() -> None:
    loader = minato.DataLoader(RangeDataset(30), batch_size=4, num_workers=2)
    drain(loader)
    text = str(loader.stats())
    for row in ("samples", "batches", "workers", "fetch p50", "GIL wait", "starved", "ready-queue"):
        assert row in text
    assert "30" in text
    assert isinstance(minato.LoaderStats(), minato.LoaderStats)


def test_a_fresh_loader_reports_zeros() -> None:
    stats = minato.DataLoader(RangeDataset(4), num_workers=2).stats()
    assert (stats.samples, stats.batches, stats.workers, stats.worker_history) == (0, 0, 0, ())


def test_log_interval_logs_summary_lines(caplog) -> None:
    class Sleepy(RangeDataset):
        def __getitem__(self, i):
            time.sleep(0.002)
            return i

    loader = minato.DataLoader(Sleepy(60), batch_size=2, num_workers=2, log_interval=0.01)
    with caplog.at_level(logging.INFO, logger="minato"):
        drain(loader)
    lines = [r.getMessage() for r in caplog.records if r.name == "minato"]
    assert lines and all(line.startswith("minato: ") and "batches" in line for line in lines)


def test_no_log_lines_without_log_interval(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="minato"):
        drain(minato.DataLoader(RangeDataset(30), batch_size=2, num_workers=2))
    assert not [r for r in caplog.records if r.levelno == logging.INFO and r.name == "minato"]


class _FakeEngine:
    def __init__(self, gil_wait: float, busy: float) -> None:
        self.figures = dict(
            workers=4,
            worker_history=[(0.0, 4)],
            settled_workers=None,
            samples_loaded=500,
            busy=busy,
            gil_wait=gil_wait,
            cpu=busy - gil_wait,
            queue_occupancy=0.1,
            slow_samples=0,
            moved_samples=0,
            sample_timeout=None,
            fetch_p50=0.001,
            fetch_p90=0.002,
            fetch_p99=0.003,
        )

    def stats(self):
        return self.figures


@pytest.mark.parametrize(
    "gil_wait,busy,starved,hinted",
    [
        (0.8, 1.0, 1.0, True),  # the loop waited for data
        (1.6, 2.0, 0.0, True),  # a long wait in all
        (0.2, 1.0, 1.0, False),  # a small share of the fetch time
        (0.03, 0.04, 0.0, False),  # a share of almost nothing, the loop never waiting
    ],
)
def test_the_gil_hint_is_logged_once_when_gil_wait_dominates(
    caplog, gil_wait, busy, starved, hinted
) -> None:
    recorder = StatsRecorder()
    recorder.engine_started(_FakeEngine(gil_wait=gil_wait, busy=busy))
    for _ in range(200):
        recorder.delivered(1, starved / 200)
    with caplog.at_level(logging.WARNING, logger="minato"):
        recorder.check_gil()
        recorder.check_gil()
    hints = [r for r in caplog.records if "GIL" in r.getMessage()]
    assert len(hints) == (1 if hinted else 0)


def test_gil_wait_is_measured_for_code_that_holds_the_gil() -> None:
    class HoldsTheGil(RangeDataset):
        def __getitem__(self, i):
            total = 0
            for k in range(20_000):
                total += k % 7
            return i + total * 0

    loader = minato.DataLoader(HoldsTheGil(64), batch_size=2, num_workers=4, adaptive=False)
    drain(loader)
    stats = loader.stats()
    assert 0.0 < stats.gil_wait <= stats.fetch_time


# the adaptive pool


class SleepyIo(tud.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(0.002)
        return i


@pytest.mark.parametrize("shuffle", [False, True])
def test_an_adaptive_pool_delivers_every_sample_once_within_its_bounds(shuffle) -> None:
    loader = minato.DataLoader(
        SleepyIo(1500), batch_size=4, num_workers=2, shuffle=shuffle, max_workers=6
    )
    seen = [int(i) for batch in loader for i in batch]
    assert sorted(seen) == list(range(1500))
    if not shuffle:
        assert seen == list(range(1500))
    stats = loader.stats()
    assert loader.num_workers == 2, "the public num_workers keeps the value given"
    assert all(1 <= n <= 6 for _, n in stats.worker_history)
    assert stats.worker_history[0] == (0.0, 2)
    # Each change the controller made says why, with the window behind it,
    # and is one of the history's entries.
    for resize in stats.resizes:
        assert isinstance(resize, minato.PoolResize) and resize.reason
        assert (resize.at, resize.workers) in stats.worker_history
        assert resize.samples_per_s >= 0.0


def test_a_growing_pool_says_why_it_grew() -> None:
    loader = minato.DataLoader(SleepyIo(1500), batch_size=4, num_workers=1, max_workers=8)
    drain(loader)
    stats = loader.stats()
    # One worker sleeping 2 ms a sample cannot keep a loop that waits fed:
    # the pool grew, and the first growth is a step while the loop starved.
    assert max(n for _, n in stats.worker_history) > 1
    assert stats.resizes[0].reason.startswith("the loop starved")
    assert stats.resizes[0].queue_occupancy is not None and stats.resizes[0].queue_occupancy < 0.5
    assert "last resize" in str(stats)


def test_the_next_epoch_starts_where_the_controller_settled() -> None:
    loader = minato.DataLoader(SleepyIo(400), batch_size=4, num_workers=2, max_workers=6)
    drain(loader)
    history = loader.stats().worker_history
    settled = loader._stats_recorder.learned_workers
    # A count the pool had (the last, unless a growth step was still to be
    # judged as the epoch ended: the count before it).
    assert settled in {count for _, count in history}
    it = iter(loader)
    assert loader.stats().worker_history[len(history)][1] == settled
    del it


@pytest.mark.parametrize(("settled", "starts_at"), [(2, 2), (None, 4)])
def test_an_epoch_that_ended_on_a_step_still_to_be_judged_is_followed_from_before_it(
    settled, starts_at
) -> None:
    # The epoch ended just after a doubling from 2 to 4: where its controller
    # stood by 2, the next epoch starts there; where none was judged, at 4.
    engine = _FakeEngine(gil_wait=0.0, busy=1.0)
    engine.figures.update(worker_history=[(0.0, 2), (0.5, 4)], settled_workers=settled)
    recorder = StatsRecorder()
    recorder.engine_started(engine)
    recorder.engine_stopped(engine)
    assert recorder.learned_workers == starts_at


def test_an_iterable_datasets_pool_keeps_its_size() -> None:
    loader = minato.DataLoader(ShardedIterable(300), batch_size=2, num_workers=3)
    drain(loader)
    assert [n for _, n in loader.stats().worker_history] == [3]


class OneHung(tud.Dataset):
    """Eight samples; the last sleeps while the loop waits for its batch."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 7:
            time.sleep(3.0)
        return i


def test_a_hung_sample_does_not_grow_the_pool() -> None:
    # The loop starves, but nothing finishes: more workers would only wait
    # beside the hung one (the pool once grew by two a second here). While
    # the first seven samples finish, or as the hung one does (3 s in), a
    # starving loop may grow it: not in between.
    loader = minato.DataLoader(OneHung(), batch_size=8, num_workers=2, sample_timeout=None)
    assert [b.tolist() for b in loader] == [list(range(8))]
    history = loader.stats().worker_history
    grown_while_hung = [
        at
        for (at, count), (_, before) in zip(history[1:], history[:-1], strict=True)
        if count > before and 0.8 < at < 2.8
    ]
    assert not grown_while_hung, history


class PurePython(RangeDataset):
    def __getitem__(self, i):
        total = 0
        for k in range(3_000):
            total += k % 7
        return i + total * 0


class Cheap(RangeDataset):
    """Trainer-like: tokenised samples taken from a list, microseconds each."""


def _gil_hints(caplog, dataset, step_s: float | None) -> list[str]:
    loader = minato.DataLoader(
        dataset, batch_size=4, num_workers=8, adaptive=False, worker_method="thread"
    )
    with caplog.at_level(logging.WARNING, logger="minato"):
        for _ in loader:
            if step_s is not None:
                time.sleep(step_s)  # the training step
    return [r.getMessage() for r in caplog.records if "GIL" in r.getMessage()]


def test_no_gil_hint_for_cheap_samples_and_a_loop_that_never_waits(caplog) -> None:
    assert _gil_hints(caplog, Cheap(1200), step_s=0.005) == []


def test_the_gil_hint_for_a_gil_bound_dataset_that_starves_the_loop(caplog) -> None:
    hints = _gil_hints(caplog, PurePython(16_000), step_s=None)
    assert len(hints) == 1 and "keep num_workers small" in hints[0]
