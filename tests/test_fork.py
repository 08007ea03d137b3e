"""minato in fork children (issue 15), side by side with torch where torch has the case.

A child made by ``fork`` (multiprocessing's default on Linux before Python
3.14, and so torch's DataLoader workers, Lightning's, ``multiprocessing.Pool``)
has the parent's memory and only the thread that forked. Everything minato
starts — its rayon pool (minato.io, the collate fast path), a loader's worker
threads — is started again in the child on first use, never waited on; the
parent goes on unchanged. Each child runs under a deadline: a hang fails the
test instead of stalling it.
"""

from __future__ import annotations

import ctypes
import functools
import io
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from PIL import Image
from torch.utils.data._utils.collate import default_collate

import minato
import minato.io
from minato._loader.collate import fast_default_collate
from minato._process import method as _worker_method
from minato._util import warn_once as _warn_once

pytestmark = pytest.mark.timeout(120)

FORK = multiprocessing.get_context("fork")
# What a child gets to finish its work; far more than any needs here.
CHILD_LIMIT_S = 40.0
# torch's loaders here raise rather than hang past this (torch's ``timeout``).
TORCH_TIMEOUT_S = 30.0


def in_fork_child(work: Callable[[], Any], limit: float = CHILD_LIMIT_S) -> Any:
    """``work()``'s value, computed in a fork child; its exception re-raised
    here as ``ChildError``; an AssertionError if the child hangs."""
    receiver, sender = FORK.Pipe(duplex=False)

    def target() -> None:
        try:
            result: tuple[str, Any] = ("ok", work())
        except BaseException as error:  # everything, to report it
            result = ("error", (type(error).__name__, str(error)))
        sender.send(result)

    child = FORK.Process(target=target)
    child.start()
    try:
        if not receiver.poll(limit):
            raise AssertionError(f"the fork child gave no result in {limit:.0f} s: it hangs")
        status, value = receiver.recv()
    finally:
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
    if status == "error":
        raise ChildError(*value)
    return value


class ChildError(Exception):
    """An exception raised in the fork child: (type name, message)."""


def lists(batches: Any) -> list[Any]:
    """Batches as nested lists: plain values that cross a pipe."""
    return [batch.tolist() for batch in batches]


def samples_of(batches: list[Any]) -> list[Any]:
    """Every sample of the batches, sorted: what an epoch delivered, in any order."""
    return sorted(sample for batch in batches for sample in batch)


class Squares(tud.Dataset[torch.Tensor]):
    """Sample i is [i, i*i], after `delay` seconds (the GIL released)."""

    def __init__(self, n: int = 48, delay: float = 0.0) -> None:
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return torch.tensor([index, index * index])


class Stream(tud.IterableDataset[torch.Tensor]):
    """0..n-1, split between workers by worker id."""

    def __init__(self, n: int = 48) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield torch.tensor([i, i * i])


EPOCH = [[i, i * i] for i in range(48)]


# -- minato.io and the collate fast path in torch's DataLoader workers -------


def photo_jpeg(seed: int, height: int = 96, width: int = 128) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.stack([128 + 100 * np.sin(x / 13 + seed), 128 + 90 * np.cos(y / 11), x], -1)
    pixels += rng.normal(0, 4, pixels.shape)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


JPEGS = [photo_jpeg(seed) for seed in range(8)]


class DecodedBatches(tud.Dataset[torch.Tensor]):
    """Item i: all of JPEGS decoded by minato.io.decode_images (rayon), rolled by i."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> torch.Tensor:
        sources = JPEGS[index:] + JPEGS[:index]
        return torch.from_numpy(minato.io.decode_images(sources, size=(64, 80)))


class DecodedImages(tud.Dataset[torch.Tensor]):
    """Item i: JPEGS[i] decoded by minato.io.decode_image."""

    def __len__(self) -> int:
        return len(JPEGS)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.from_numpy(minato.io.decode_image(JPEGS[index], size=(64, 80)))


class BigSamples(tud.Dataset[Any]):
    """Samples of 512 KiB, a tensor and an array: a batch of 4 is past the
    size where the collate fast path copies on its thread pool."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> Any:
        values = torch.arange(128 * 1024, dtype=torch.float32) + index
        return {"tensor": values, "array": values.numpy() * 2}


def torch_epoch(dataset: Any, collate_fn: Any = None, **kwargs: Any) -> list[Any]:
    """One epoch of torch's own DataLoader over `dataset`."""
    loader = tud.DataLoader(dataset, batch_size=2, collate_fn=collate_fn, **kwargs)
    return list(loader)


def assert_equal_batches(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected, strict=True):
        if isinstance(theirs, dict):
            assert ours.keys() == theirs.keys()
            for key in theirs:
                assert torch.equal(ours[key], theirs[key]), key
        else:
            assert torch.equal(ours, theirs)


FORK_WORKERS: dict[str, Any] = dict(
    num_workers=2, multiprocessing_context="fork", timeout=TORCH_TIMEOUT_S
)


@pytest.mark.parametrize(
    ("dataset", "collate_fn"),
    [
        pytest.param(DecodedBatches(), None, id="decode_images"),
        pytest.param(DecodedImages(), None, id="decode_image"),
        pytest.param(BigSamples(), fast_default_collate(pin=False), id="collate-fast-path"),
    ],
)
def test_minato_in_torch_fork_workers_after_the_parent_used_it(
    dataset: Any, collate_fn: Any
) -> None:
    """The issue's first case: the parent starts minato's thread pool, then
    torch forks its workers, which use it too. Before, they waited for the
    parent's pool until torch's timeout; now each builds its own. Compared
    with the same loader run in this process (torch's num_workers=0), with
    torch's own default_collate for the fast path."""
    in_process = torch_epoch(dataset, collate_fn)  # the parent's pool is now running
    if collate_fn is not None:
        assert_equal_batches(in_process, torch_epoch(dataset, default_collate))
    for _ in range(2):  # two epochs: new worker processes each time
        assert_equal_batches(torch_epoch(dataset, collate_fn, **FORK_WORKERS), in_process)
    # The parent's pool still serves the parent.
    assert_equal_batches(torch_epoch(dataset, collate_fn), in_process)


def test_persistent_torch_fork_workers_use_minato_io_across_epochs() -> None:
    dataset = DecodedBatches()
    expected = torch_epoch(dataset)
    loader = tud.DataLoader(dataset, batch_size=2, persistent_workers=True, **FORK_WORKERS)
    for _ in range(2):
        assert_equal_batches(list(loader), expected)


def test_a_decode_running_in_a_parent_thread_at_the_fork_does_not_block_the_child() -> None:
    """A parent thread inside decode_images at the fork (its pool's locks
    and latches busy): the child decodes on a pool of its own."""
    expected = minato.io.decode_images(JPEGS, size=(64, 80))
    stop = threading.Event()
    decoded = []

    def decode_until_stopped() -> None:
        while not stop.is_set():
            decoded.append(np.array_equal(minato.io.decode_images(JPEGS, size=(64, 80)), expected))

    thread = threading.Thread(target=decode_until_stopped)
    thread.start()
    try:
        time.sleep(0.05)
        for _ in range(3):
            assert in_fork_child(
                lambda: np.array_equal(minato.io.decode_images(JPEGS, size=(64, 80)), expected)
            )
    finally:
        stop.set()
        thread.join()
    assert decoded and all(decoded)


# -- a minato DataLoader used in a fork child --------------------------------


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_a_loader_used_between_epochs_in_a_fork_child(persistent: bool) -> None:
    """The issue's second case. torch: works, both ways (a persistent
    loader's child sends its indices to the parent's worker processes).
    minato: the child starts worker threads of its own."""
    results = {}
    for kind in (tud.DataLoader, minato.DataLoader):
        loader: Any = kind(Squares(), batch_size=4, num_workers=2, persistent_workers=persistent)
        first = lists(loader)
        child = in_fork_child(functools.partial(lists, loader))
        parent_next = lists(loader)
        results[kind] = (first, child, parent_next)
    epoch = [EPOCH[i : i + 4] for i in range(0, 48, 4)]
    assert results[minato.DataLoader] == results[tud.DataLoader] == (epoch, epoch, epoch)


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_an_iterator_inherited_mid_epoch_goes_on_in_the_child(persistent: bool) -> None:
    """next() in the child on an iterator the parent was in the middle of:
    the child's epoch goes on from there with its own workers (the batches
    the parent's workers held are loaded again), as torch's in-process
    iterator does (num_workers=0, compared here). torch's worker processes
    cannot: its child waits until ``timeout``, then raises, and the parent's
    iterator is broken (persistent: the child takes batches meant for the
    parent). The parent's epoch, and its next one, are whole."""
    # Slow samples: the parent's workers are mid-task at the fork.
    loader = minato.DataLoader(
        Squares(delay=0.01), batch_size=4, num_workers=2, persistent_workers=persistent
    )
    it = iter(loader)
    head = lists(next(it) for _ in range(3))
    child = in_fork_child(lambda: lists(it))
    parent_rest = lists(it)

    reference = iter(tud.DataLoader(Squares(), batch_size=4))
    assert lists(next(reference) for _ in range(3)) == head
    assert child == in_fork_child(lambda: lists(reference)) == parent_rest
    assert lists(loader) == [EPOCH[i : i + 4] for i in range(0, 48, 4)]


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_a_reordering_iterator_inherited_mid_epoch_delivers_the_rest_once(
    persistent: bool,
) -> None:
    """Batches built from whichever samples are ready first (shuffle): the
    child gets exactly the samples the parent had not delivered at the
    fork, each once, as does the parent."""
    torch.manual_seed(0)
    loader = minato.DataLoader(
        Squares(delay=0.005),
        batch_size=4,
        shuffle=True,
        num_workers=3,
        persistent_workers=persistent,
    )
    it = iter(loader)
    head = lists(next(it) for _ in range(4))
    child = in_fork_child(lambda: lists(it))
    parent_rest = lists(it)
    assert all(len(batch) == 4 for batch in head + child + parent_rest)
    assert samples_of(head + child) == samples_of(head + parent_rest) == EPOCH
    assert samples_of(lists(loader)) == EPOCH


def test_a_persistent_loader_mid_epoch_in_the_parent_starts_a_new_epoch_in_the_child() -> None:
    """iter(loader) in the child while the parent's epoch is not over: a
    new epoch, as iter() gives in the parent."""
    loader = minato.DataLoader(Squares(), batch_size=4, num_workers=2, persistent_workers=True)
    it = iter(loader)
    head = lists(next(it) for _ in range(2))
    assert in_fork_child(lambda: lists(loader)) == [EPOCH[i : i + 4] for i in range(0, 48, 4)]
    assert head + lists(it) == [EPOCH[i : i + 4] for i in range(0, 48, 4)]


def test_an_iterable_dataset_epoch_cannot_go_on_in_the_child() -> None:
    """An IterableDataset's streams lived in the parent's worker threads: a
    clear RuntimeError says to call iter() in the child, which then works.
    (torch's worker processes: the child waits until ``timeout`` and fails.)"""
    loader = minato.DataLoader(Stream(), batch_size=4, num_workers=2, persistent_workers=True)
    it = iter(loader)
    head = lists(next(it) for _ in range(2))

    def go_on() -> Any:
        try:
            next(it)
        except RuntimeError as error:
            return str(error), samples_of(lists(loader))
        return "no error", []

    message, new_epoch = in_fork_child(go_on)
    assert "forked" in message and "iter()" in message
    assert new_epoch == EPOCH
    assert samples_of(head + lists(it)) == EPOCH
    # Between epochs, iter() in the child is just a new epoch.
    assert in_fork_child(lambda: samples_of(lists(loader))) == EPOCH
    assert samples_of(lists(loader)) == EPOCH


def test_worker_processes_started_in_a_fork_child_have_their_own_worker_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a fork child the fork server starts afresh, forked from the worker
    thread that first wants a process (here: auto decided processes for an
    earlier loader of the dataset's type). The processes it forks must not
    take that thread's WorkerInfo for theirs: each stream would be that
    worker's, read twice. (Seen as a flaky test under load, where auto
    moved this module's Stream loader to processes.) Kept off the forks at
    each engine's start, as when auto moves within an epoch."""
    monkeypatch.setattr(_worker_method, "DECIDED_PROCESSES_FORKED_AT_START", False)
    monkeypatch.setitem(
        _worker_method._decided_for, Stream, (True, "auto: decided for the test", True)
    )
    loader = minato.DataLoader(Stream(), batch_size=4, num_workers=2, persistent_workers=True)
    assert samples_of(lists(loader)) == EPOCH
    assert in_fork_child(lambda: samples_of(lists(loader))) == EPOCH
    assert samples_of(lists(loader)) == EPOCH


def test_a_persistent_iterator_whose_loader_is_gone_cannot_go_on_in_the_child() -> None:
    """A persistent iterator holds its loader weakly (the loader holds it):
    kept alone and forked mid-epoch, it has nothing to start workers from."""
    it = iter(minato.DataLoader(Squares(), batch_size=4, num_workers=2, persistent_workers=True))
    head = lists(next(it) for _ in range(2))

    def go_on() -> str:
        try:
            next(it)
        except RuntimeError as error:
            return str(error)
        return "no error"

    message = in_fork_child(go_on)
    assert "DataLoader is gone" in message and "iter()" in message
    assert head + lists(it) == [EPOCH[i : i + 4] for i in range(0, 48, 4)]


def test_an_iterator_past_its_epoch_stays_ended_in_the_child() -> None:
    loader = minato.DataLoader(Squares(), batch_size=4, num_workers=2, persistent_workers=True)
    it = iter(loader)
    assert lists(it) == [EPOCH[i : i + 4] for i in range(0, 48, 4)]
    assert in_fork_child(lambda: (lists(it), lists(loader))) == (
        [],
        [EPOCH[i : i + 4] for i in range(0, 48, 4)],
    )


_POOL_LOADER: Any = None


def _epoch_of_the_pool_loader(_: int) -> list[Any]:
    return lists(_POOL_LOADER)


def test_a_persistent_loader_in_a_multiprocessing_pool() -> None:
    """The issue's evaluation pool: a persistent loader used in the parent,
    then in the fork workers of a ``Pool``, several at once."""
    global _POOL_LOADER
    _POOL_LOADER = loader = minato.DataLoader(
        Squares(), batch_size=4, num_workers=2, persistent_workers=True
    )
    try:
        first = lists(loader)
        with FORK.Pool(2) as pool:
            epochs = pool.map_async(_epoch_of_the_pool_loader, range(4)).get(CHILD_LIMIT_S)
        assert epochs == [first] * 4
        assert lists(loader) == first
    finally:
        _POOL_LOADER = None


def _fresh_epoch(kind: Any) -> Any:
    try:
        return lists(kind(Squares(), batch_size=4, num_workers=2))
    except AssertionError as error:
        return str(error)


def test_a_new_loader_in_a_pool_worker() -> None:
    """Pool workers are daemons: torch's worker processes cannot start
    there; minato's threads can."""
    with FORK.Pool(1) as pool:
        ours = pool.apply_async(_fresh_epoch, (minato.DataLoader,)).get(CHILD_LIMIT_S)
        theirs = pool.apply_async(_fresh_epoch, (tud.DataLoader,)).get(CHILD_LIMIT_S)
    assert ours == [EPOCH[i : i + 4] for i in range(0, 48, 4)]
    assert "daemonic processes are not allowed to have children" in theirs


# -- locks held by parent threads at the fork --------------------------------


def test_locks_held_by_parent_threads_at_the_fork_do_not_block_the_child() -> None:
    """At the fork, one parent thread waits in next() (inside the engine's
    lock, the GIL released) and another holds minato's Python locks (the
    loader's stats, the epoch's indices, warn_once). The child must not wait
    on any of them: it iterates, reads stats, warns; the parent goes on."""
    parent = os.getpid()
    gate = threading.Event()

    class Gated(Squares):
        def __getitem__(self, index: int) -> torch.Tensor:
            # In the parent, the second batch waits for the gate.
            while index >= 4 and os.getpid() == parent and not gate.is_set():
                time.sleep(0.005)
            return super().__getitem__(index)

    loader = minato.DataLoader(Gated(), batch_size=4, num_workers=2, persistent_workers=True)
    it: Any = iter(loader)
    head = lists([next(it)])
    waiting: list[Any] = []
    waiter = threading.Thread(target=lambda: waiting.append(next(it).tolist()))
    waiter.start()
    holding, release = threading.Event(), threading.Event()
    held = (loader._stats_recorder._lock, it._epoch.lock, _warn_once._lock)

    def hold_locks() -> None:
        with held[0], held[1], held[2]:
            holding.set()
            release.wait()

    holder = threading.Thread(target=hold_locks)
    holder.start()
    try:
        assert holding.wait(10)
        time.sleep(0.2)  # the waiter is inside next() by now
        assert waiter.is_alive()

        def in_child() -> Any:
            stats = loader.stats()
            _warn_once.warn_once(("test_fork", os.getpid()), "from the child")
            rest = lists(it)
            return stats.batches, head + rest, lists(loader)

        batches, child_epoch, child_next = in_fork_child(in_child)
        assert batches == 1
        # The child re-loads the batch the parent's waiter was waiting for.
        assert child_epoch == child_next == [EPOCH[i : i + 4] for i in range(0, 48, 4)]
    finally:
        release.set()
        gate.set()
        holder.join()
        waiter.join(CHILD_LIMIT_S)
    assert head + waiting + lists(it) == [EPOCH[i : i + 4] for i in range(0, 48, 4)]
    assert lists(loader) == [EPOCH[i : i + 4] for i in range(0, 48, 4)]


def _fork_and_reap(deadline_s: float = CHILD_LIMIT_S) -> bool:
    """Forks a child that exits at once; whether it did within the deadline
    (a child that hangs in CPython's after-fork is killed)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    deadline = time.monotonic() + deadline_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status) == 0
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return False
        time.sleep(0.001)


def test_forks_while_worker_threads_start_never_hang_a_child() -> None:
    """A thread new to Python creates its interpreter state under a lock
    that CPython before 3.12 takes again in a fork child before resetting
    it (gh-112275; seen as a torch DataLoader's worker hanging at start
    beside minato's threads). Forks made while loaders keep starting worker
    threads each wait for those threads to finish attaching: every child
    comes up and exits."""
    stop = threading.Event()
    epochs = []

    def start_threads_until_stopped() -> None:
        while not stop.is_set():
            loader = minato.DataLoader(
                Squares(), batch_size=4, num_workers=8, worker_method="thread"
            )
            epochs.append(len(lists(loader)))

    churn = threading.Thread(target=start_threads_until_stopped)
    churn.start()
    try:
        children = [_fork_and_reap() for _ in range(100)]
    finally:
        stop.set()
        churn.join(CHILD_LIMIT_S)
    assert all(children), f"{children.count(False)} of 100 children hung"
    assert epochs and set(epochs) == {12}


def test_a_worker_thread_that_forks_waits_for_no_one() -> None:
    """The dataset's own code forks (a subprocess by hand) from a worker
    thread while the pool's other threads start: the fork goes on, the
    children exit, the epoch is whole."""

    class Forking(Squares):
        def __getitem__(self, index: int) -> torch.Tensor:
            if index % 6 == 0:
                assert _fork_and_reap()
            return super().__getitem__(index)

    loader = minato.DataLoader(Forking(), batch_size=4, num_workers=8, worker_method="thread")
    # A slow fork may make its sample late (it then joins a later batch).
    assert samples_of(lists(loader)) == samples_of([EPOCH])


# -- a fork Python was not told about ----------------------------------------


def test_a_fork_python_was_not_told_about_fails_loudly() -> None:
    """A fork made in C (no ``os.register_at_fork`` hooks run) is still seen
    by the Rust side: the inherited engine raises a RuntimeError naming the
    fork instead of waiting for threads that are not there, and minato.io
    works. The child reports through its exit status."""
    loader = minato.DataLoader(Squares(), batch_size=4, num_workers=2, persistent_workers=True)
    assert len(lists(loader)) == 12
    expected = minato.io.decode_images(JPEGS, size=(64, 80))
    time.sleep(0.1)  # workers idle, none holding the GIL
    pid = ctypes.CDLL(None, use_errno=True).fork()
    if pid == 0:  # the child: report by exit status only
        status = 1
        try:
            try:
                next(iter(loader))
            except RuntimeError as error:
                if "fork" in str(error) and "iter()" in str(error):
                    status = 2
            decoded = minato.io.decode_images(JPEGS, size=(64, 80))
            if status == 2 and np.array_equal(decoded, expected):
                status = 0
        finally:
            os._exit(status)
    assert pid > 0
    deadline = time.monotonic() + CHILD_LIMIT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the C-forked child hangs")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(lists(loader)) == 12
