"""Epochs, bounded prefetch, the GIL, and shutdown in every way a loop can end."""

from __future__ import annotations

import _thread
import gc
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.utils.data as tud
from helpers import (
    RangeDataset,
    ShardedIterable,
    assert_prefetch_bounded,
    assert_same,
    os_thread_count,
    os_threads,
    threads_left_since,
    threads_started_since,
    wait_for_thread_count,
)

import minato

pytestmark = pytest.mark.usefixtures("no_leaked_threads")


class _GateCounts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.max_inside = 0
        self.fetched = 0


class Gate(RangeDataset):
    """__getitem__ blocks until `open` is set (or 30 s), counting who is inside.

    The counts live in one object every worker's copy of the dataset shares."""

    def __init__(self, n: int = 100) -> None:
        super().__init__(n)
        self.open = threading.Event()
        self.counts = _GateCounts()

    @property
    def max_inside(self) -> int:
        return self.counts.max_inside

    @property
    def fetched(self) -> int:
        return self.counts.fetched

    def __getitem__(self, i: int) -> int:
        counts = self.counts
        with counts.lock:
            counts.inside += 1
            counts.max_inside = max(counts.max_inside, counts.inside)
        self.open.wait(30)
        with counts.lock:
            counts.inside -= 1
            counts.fetched += 1
        return i


# persistent_workers


def test_persistent_workers_reuse_the_iterator_and_threads() -> None:
    idents = []

    class Recording(RangeDataset):
        def __getitem__(self, i):
            idents.append(threading.get_ident())
            return i

    # A fixed pool: an adaptive one may grow on a busy machine (seen under
    # load: 3-4 threads), which is not what this test is about.
    loader = minato.DataLoader(
        Recording(12), batch_size=3, num_workers=2, persistent_workers=True, adaptive=False
    )
    first = iter(loader)
    epoch1 = [b.tolist() for b in first]
    threads_after_epoch1 = os_thread_count()
    second = iter(loader)
    assert second is first
    epoch2 = [b.tolist() for b in second]
    assert epoch1 == epoch2 == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert len(set(idents)) <= 2
    assert os_thread_count() == threads_after_epoch1
    del loader, first, second


def test_persistent_workers_reiterate_the_sampler_so_set_epoch_applies() -> None:
    def run(cls):
        sampler = tud.DistributedSampler(
            RangeDataset(20), num_replicas=2, rank=1, shuffle=True, seed=3
        )
        loader = cls(
            RangeDataset(20),
            sampler=sampler,
            batch_size=4,
            num_workers=2,
            persistent_workers=True,
            in_order=True,
        )
        out = []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            out.append([b.tolist() for b in loader])
        return out

    ours, theirs = run(minato.DataLoader), run(tud.DataLoader)
    assert ours == theirs
    assert ours[0] != ours[1]


def test_persistent_workers_start_a_new_epoch_cleanly_after_a_break() -> None:
    loader = minato.DataLoader(
        RangeDataset(40), batch_size=4, num_workers=2, persistent_workers=True
    )
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert [b.tolist() for b in loader] == [list(range(k, k + 4)) for k in range(0, 40, 4)]


def test_persistent_workers_restart_iterable_streams_each_epoch() -> None:
    loader = minato.DataLoader(
        ShardedIterable(20), batch_size=3, num_workers=2, persistent_workers=True
    )
    expected = list(tud.DataLoader(ShardedIterable(20), batch_size=3, num_workers=2))
    for _ in range(3):
        assert_same(list(loader), expected)


# bounded prefetch


@pytest.mark.parametrize("num_workers,prefetch_factor", [(1, 1), (2, 2), (3, 4)])
def test_prefetch_factor_bounds_the_batches_in_flight(num_workers, prefetch_factor) -> None:
    assert_prefetch_bounded(
        200, batch_size=2, num_workers=num_workers, prefetch_factor=prefetch_factor, adaptive=False
    )


@pytest.mark.parametrize("in_order", [True, False])
def test_an_adaptive_pool_bounds_prefetch_by_its_largest_size(in_order) -> None:
    # The bound scales with the pool: prefetch_factor x max_workers batches at most.
    assert_prefetch_bounded(
        200, batch_size=2, num_workers=2, prefetch_factor=2, max_workers=3, in_order=in_order
    )


# the GIL


def test_worker_threads_overlap_while_they_wait() -> None:
    dataset = Gate(8)
    result = []
    consumer = threading.Thread(
        target=lambda: result.extend(minato.DataLoader(dataset, batch_size=1, num_workers=4))
    )
    consumer.start()
    # All four workers get inside __getitem__ at once: none holds the GIL while it waits.
    for _ in range(3000):
        if dataset.max_inside >= 4:
            break
        threading.Event().wait(0.01)
    dataset.open.set()
    consumer.join(30)
    assert dataset.max_inside == 4
    assert len(result) == 8


def test_consumer_releases_the_gil_while_it_waits() -> None:
    # The only sample waits for an event that another Python thread sets. If
    # __next__ held the GIL while waiting, that thread could never run.
    released = threading.Event()

    class WaitsForHelper(RangeDataset):
        def __getitem__(self, i):
            released.wait(30)
            return i

    helper_ran = []

    def helper():
        threading.Event().wait(0.2)  # let the consumer block in __next__ first
        helper_ran.append(True)
        released.set()

    thread = threading.Thread(target=helper)
    thread.start()
    assert next(iter(minato.DataLoader(WaitsForHelper(1), num_workers=1))).tolist() == [0]
    thread.join()
    assert helper_ran == [True]
    assert released.is_set()


# shutdown


def test_threads_exit_after_a_finished_epoch() -> None:
    before = os_thread_count()
    loader = minato.DataLoader(RangeDataset(30), batch_size=4, num_workers=4, adaptive=False)
    it = iter(loader)
    assert os_thread_count() == before + 4
    list(it)
    # CI saw one thread more right after the epoch, twice (not reproduced
    # here, even beside two busy processes): a thread the shutdown's grace
    # left to exit on its own, or one reaping a fork server an earlier test
    # left, would do that. Both halves wait for the count.
    assert wait_for_thread_count(before) == before
    # An adaptive pool adds a monitor thread; it goes with the workers.
    it = iter(minato.DataLoader(RangeDataset(30), batch_size=4, num_workers=4))
    assert os_thread_count() > before + 4
    list(it)
    assert wait_for_thread_count(before) == before


def test_threads_exit_after_break() -> None:
    before = os_threads()
    for i, _ in enumerate(minato.DataLoader(RangeDataset(100), batch_size=2, num_workers=3)):
        if i == 1:
            break
    assert not threads_left_since(before)


def test_threads_exit_after_an_exception_in_the_consumer() -> None:
    before = os_threads()
    with pytest.raises(ZeroDivisionError):
        for batch in minato.DataLoader(RangeDataset(100), batch_size=2, num_workers=3):
            batch.sum().item() / 0
    assert not threads_left_since(before)


def test_threads_exit_after_an_exception_in_a_worker() -> None:
    class Fails(RangeDataset):
        def __getitem__(self, i):
            if i == 10:
                raise ValueError("boom")
            return i

    before = os_threads()
    with pytest.raises(ValueError):
        list(minato.DataLoader(Fails(100), batch_size=2, num_workers=3))
    assert not threads_left_since(before)


def test_threads_exit_on_del_loader_with_persistent_workers() -> None:
    # By thread id: a short-lived thread of an earlier test's (a warm-up, a
    # trim) may come and go meanwhile; a count read once counted two (CI).
    before = os_threads()
    loader = minato.DataLoader(
        RangeDataset(20), batch_size=2, num_workers=3, persistent_workers=True, adaptive=False
    )
    next(iter(loader))
    assert len(threads_started_since(before, 3)) == 3  # its workers, kept between epochs
    del loader
    assert not threads_left_since(before)


def test_threads_exit_when_a_reference_cycle_is_collected() -> None:
    before = os_threads()
    loader = minato.DataLoader(
        RangeDataset(20), batch_size=2, num_workers=2, persistent_workers=True
    )
    next(iter(loader))
    loader.cycle = loader  # only the garbage collector can free it now
    del loader
    gc.collect()
    assert not threads_left_since(before)


def test_lightning_style_iterator_reset_frees_the_threads() -> None:
    before = os_threads()
    loader = minato.DataLoader(
        RangeDataset(20), batch_size=2, num_workers=2, persistent_workers=True
    )
    next(iter(loader))
    loader._iterator = None
    assert not threads_left_since(before)


def test_keyboard_interrupt_leaves_a_loop_blocked_on_a_stuck_sample() -> None:
    dataset = Gate(10)
    before = os_threads()
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in minato.DataLoader(dataset, batch_size=2, num_workers=2):
                pass
        # The loop was left while the samples are still stuck: it did not wait for them.
        assert not dataset.open.is_set()
        assert dataset.fetched == 0
    finally:
        timer.cancel()
        dataset.open.set()
    assert not threads_left_since(before)


def test_interpreter_exit_with_live_workers_is_clean(tmp_path) -> None:
    script = textwrap.dedent("""
        import threading, time
        import torch.utils.data as tud
        import minato

        class Slow(tud.Dataset):
            def __len__(self): return 1000
            def __getitem__(self, i):
                time.sleep(0.01)
                return i

        loader = minato.DataLoader(Slow(), batch_size=4, num_workers=4, persistent_workers=True)
        it = iter(loader)
        next(it)
        plain = iter(minato.DataLoader(Slow(), batch_size=4, num_workers=2))
        next(plain)
        print("exiting", flush=True)
    """)
    # Run elsewhere, so that the installed package is imported, not the source folder.
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"
    assert "Traceback" not in done.stderr


def test_get_worker_info_stays_none_on_the_main_thread_after_loading() -> None:
    list(minato.DataLoader(RangeDataset(10), batch_size=2, num_workers=2))
    assert tud.get_worker_info() is None
    assert not torch.empty(1).is_shared()


def test_a_finished_iterator_keeps_raising_stopiteration() -> None:
    it = iter(minato.DataLoader(RangeDataset(4), batch_size=2, num_workers=2))
    assert len(list(it)) == 2
    with pytest.raises(StopIteration):
        next(it)


def test_a_persistent_loader_works_again_after_keyboard_interrupt() -> None:
    dataset = Gate(6)
    loader = minato.DataLoader(dataset, batch_size=2, num_workers=2, persistent_workers=True)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            list(loader)
    finally:
        timer.cancel()
        dataset.open.set()
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
    del loader


def test_keyboard_interrupt_leaves_a_waiting_next_within_a_second() -> None:
    # next() waits with the GIL released and looks for signals only now and
    # then (each look takes the GIL from the workers): rarely, but within 1 s.
    dataset = Gate(10)
    it = iter(minato.DataLoader(dataset, batch_size=2, num_workers=2))
    signalled = []

    def interrupt() -> None:
        signalled.append(time.perf_counter())
        _thread.interrupt_main()

    timer = threading.Timer(0.3, interrupt)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(it)
        left = time.perf_counter()
        assert left - signalled[0] < 1.0
    finally:
        timer.cancel()
        dataset.open.set()
        del it
