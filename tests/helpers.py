"""Test helpers: comparing minato with torch, counting OS threads, datasets."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import minato


def os_thread_count() -> int:
    """Threads of this process as the OS sees them (Rust threads included)."""
    return len(os.listdir("/proc/self/task"))


def _settled(read: Callable[[], Any], done: Callable[[Any], bool], within_s: float) -> Any:
    """Reads `read()` (collecting garbage first) until `done` accepts it or
    `within_s` has passed; returns the last reading."""
    deadline = time.monotonic() + within_s
    while True:
        gc.collect()
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def wait_for_thread_count(expected: int, within_s: float = 10.0) -> int:
    """Waits (collecting garbage) until at most `expected` threads remain; returns the count."""
    return _settled(os_thread_count, lambda count: count <= expected, within_s)


def os_threads() -> set[str]:
    """This process's threads as the OS sees them, by thread id."""
    return set(os.listdir("/proc/self/task"))


def threads_left_since(before: set[str], within_s: float = 10.0) -> set[str]:
    """Waits (collecting garbage) until every thread started since `before`
    has ended; returns those still running. Threads of `before` may end
    meanwhile (a warm-up thread of an earlier test's loader)."""
    return _settled(lambda: os_threads() - before, lambda left: not left, within_s)


def threads_started_since(before: set[str], expected: int, within_s: float = 10.0) -> set[str]:
    """Waits (collecting garbage) until exactly `expected` threads started
    since `before` run, short-lived ones of earlier tests' gone; returns them."""
    return _settled(
        lambda: os_threads() - before, lambda started: len(started) == expected, within_s
    )


def assert_same(a: Any, b: Any, path: str = "batch") -> None:
    """Element-for-element equality of two batches, types included."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a} != {b}"
        assert torch.equal(a, b), f"{path}: {a} != {b}"
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, Mapping):
        assert list(a.keys()) == list(b.keys()), path
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, Sequence) and not isinstance(a, (str, bytes)):
        assert len(a) == len(b), f"{path}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def batches(loader: tud.DataLoader) -> list[Any]:
    return list(loader)


def compare_with_torch(
    make_dataset: Callable[[], Any],
    seed: int | None = 0,
    **kwargs: Any,
) -> list[Any]:
    """Runs the same loader through torch and minato (from the same RNG state) and
    asserts identical batches; returns minato's. minato gets in_order=True
    unless told otherwise: torch's exact order."""
    if seed is not None:
        torch.manual_seed(seed)
    expected = batches(tud.DataLoader(make_dataset(), **kwargs))
    if seed is not None:
        torch.manual_seed(seed)
    got = batches(minato.DataLoader(make_dataset(), **{"in_order": True, **kwargs}))
    assert len(got) == len(expected)
    for i, (x, y) in enumerate(zip(got, expected, strict=True)):
        assert_same(x, y, f"batch {i}")
    return got


# torch's worker processes, minato's worker threads and minato's worker
# processes, side by side: a test's `loader_type(dataset, **options, ...)`.
EVERY_WORKER_KIND = pytest.mark.parametrize(
    "loader_type, options",
    [
        (tud.DataLoader, {}),
        (minato.DataLoader, {"worker_method": "thread"}),
        (minato.DataLoader, {"worker_method": "multiprocessing"}),
    ],
    ids=["torch", "minato-threads", "minato-processes"],
)


# Datasets, at module level so torch's worker processes can use them too.


class RangeDataset(tud.Dataset):
    """Map-style: item i is i."""

    def __init__(self, n: int = 37) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


Point = namedtuple("Point", ["x", "y"])


class RichDataset(tud.Dataset):
    """Map-style items of every type default_collate handles."""

    def __init__(self, n: int = 20) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "tensor": torch.arange(3, dtype=torch.float32) + i,
            "array": np.full((2, 2), i, dtype=np.int16),
            "int": i,
            "float": i / 2,
            "bool": i % 2 == 0,
            "np_scalar": np.float32(i),
            "str": f"s{i}",
            "bytes": bytes([i]),
            "point": Point(i, -i),
            "nested": (torch.tensor([i]), [i, i + 1], {"deep": np.int64(i)}),
        }


class WorkerInfoDataset(tud.Dataset):
    """Item i reports the worker info its loader thread or process saw."""

    def __init__(self, n: int = 16) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = tud.get_worker_info()
        return {
            "index": i,
            "id": -1 if info is None else info.id,
            "seed": -1 if info is None else info.seed,
        }


class ShardedIterable(tud.IterableDataset):
    """Yields range(n), each worker its own interleaved shard, as torch's docs show."""

    def __init__(self, n: int = 50) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


class UnevenIterable(tud.IterableDataset):
    """Worker w yields 3 + 4*w items: workers run dry at different times."""

    def __iter__(self):
        info = tud.get_worker_info()
        worker = 0 if info is None else info.id
        return iter([worker * 1000 + k for k in range(3 + 4 * worker)])


class UnshardedIterable(tud.IterableDataset):
    """Every worker yields the whole range (torch duplicates it per worker)."""

    def __init__(self, n: int = 10) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class CountingDataset(RangeDataset):
    """Counts the samples fetched so far, from any thread."""

    def __init__(self, n: int):
        super().__init__(n)
        self.fetched = 0
        self.lock = threading.Lock()

    def __getitem__(self, i: int) -> int:
        with self.lock:
            self.fetched += 1
        return i


def assert_prefetch_bounded(n: int, batch_size: int, **loader_kwargs: Any) -> None:
    """Iterates with a slow consumer, checking that the samples fetched ahead of
    the consumer never exceed prefetch_factor x num_workers batches (x
    max_workers for an adaptive pool)."""
    workers = loader_kwargs.get("max_workers") or loader_kwargs["num_workers"]
    bound = workers * loader_kwargs["prefetch_factor"] * batch_size
    dataset = CountingDataset(n)
    consumed = 0
    for batch in minato.DataLoader(dataset, batch_size=batch_size, **loader_kwargs):
        consumed += len(batch)
        # A slow consumer: give the workers every chance to run ahead.
        for _ in range(3):
            time.sleep(0.002)
            assert dataset.fetched - consumed <= bound
    assert consumed == n


class DeclaredShuffle(tud.Sampler):
    """A sequential sampler that declares itself shuffling, as a custom one may."""

    shuffle = True

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(range(self.n))


# Set by a test in the training process, after this module was imported: a
# worker process forked from it sees the change, one started from a fresh
# interpreter does not.
PARENT_MARK = 0


class MarkedByItsModule(torch.utils.data.Dataset):
    """Each sample: its index, the PARENT_MARK its worker sees, its worker's pid."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index, PARENT_MARK, os.getpid()])


class MarkedHoldingALock(MarkedByItsModule):
    """A dataset no pickle carries."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


class UsesCuda(torch.utils.data.Dataset):
    """Each sample made on the GPU (a decode there, say), returned on the CPU."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return (torch.full((4,), index, device="cuda") * 2).cpu()
