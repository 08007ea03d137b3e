"""Batches that arrive on the GPU: copies on a side CUDA stream, kept ahead.

torch moves each batch to the GPU on the training loop's stream, where the
copy queues behind the model's kernels. Here a batch that comes out of the
loader (already in page-locked memory) is copied with ``non_blocking=True``
on a dedicated stream, ``device_prefetch`` batches ahead of the loop; the
loop's stream waits on an event for just that copy, and each tensor is
``record_stream``-ed so the caching allocator never reuses its memory while
the loop's kernels may still read it.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import torch
from torch._utils import ExceptionWrapper

from minato._util.fork import ForkSafeLock

# Two threads using one iterator at once (torch's iterators are not thread-safe).
_IN_USE = (
    "this DataLoader iterator is in use by another thread: an iterator (and a loader "
    "with persistent_workers, which keeps one) serves one thread at a time, as torch's "
    "do; give each thread a DataLoader of its own"
)


def resolve_device(device: str | int | torch.device | None) -> torch.device | None:
    """The CUDA device batches go to, or None to leave them in CPU memory.

    A bare ``"cuda"`` means this process's GPU: the local rank's under
    torchrun (``LOCAL_RANK``), else the current CUDA device.
    """
    if device is None:
        return None
    resolved = torch.device(device)
    if resolved.type == "cpu":
        return None
    if resolved.type != "cuda":
        raise ValueError(
            f"device should be None, 'cpu' or a CUDA device, but got device={device!r}"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"DataLoader was given device={device!r}, but CUDA is not available "
            "(no GPU, or a torch build without CUDA); pass device=None to keep batches "
            "in CPU memory"
        )
    if resolved.index is None:
        local_rank = os.environ.get("LOCAL_RANK")
        index = int(local_rank) if local_rank is not None else torch.cuda.current_device()
        resolved = torch.device("cuda", index)
    if resolved.index >= torch.cuda.device_count():
        raise RuntimeError(
            f"DataLoader was given device={device!r}, but only "
            f"{torch.cuda.device_count()} CUDA devices are visible"
        )
    return resolved


def to_device(data: Any, device: torch.device, tensors: list[torch.Tensor]) -> Any:
    """``data`` with every tensor copied to ``device`` (non-blocking), the
    nesting kept as it is; the copies are appended to ``tensors``."""
    if isinstance(data, torch.Tensor):
        moved = data.to(device, non_blocking=True)
        tensors.append(moved)
        return moved
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, Mapping):
        items = {key: to_device(value, device, tensors) for key, value in data.items()}
        try:
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(to_device(sample, device, tensors) for sample in data))
    if isinstance(data, tuple):
        return tuple(to_device(sample, device, tensors) for sample in data)
    if isinstance(data, Sequence):
        moved_items = [to_device(sample, device, tensors) for sample in data]
        try:
            return type(data)(moved_items)  # type: ignore[call-arg]
        except TypeError:
            return moved_items
    return data


class Failure:
    """A batch that failed to load, delivered in its turn: a worker's
    ``ExceptionWrapper`` (re-raised as torch does) or an exception raised
    on the consumer's thread."""

    def __init__(self, error: BaseException | ExceptionWrapper) -> None:
        self.error = error

    def raise_error(self) -> NoReturn:
        if isinstance(self.error, ExceptionWrapper):
            self.error.reraise()
        raise self.error


# What an iterator's host stage hands on: the tags of the indices in the
# batch (see minato._loader.resume) and the batch, or its Failure.
HostBatch = tuple[list[int], Any]


class DevicePrefetcher:
    """Keeps up to ``depth`` batches' copies in flight on a side stream."""

    def __init__(self, device: torch.device, depth: int) -> None:
        self.device = device
        self.depth = depth
        self.stream = torch.cuda.Stream(device)
        self._queue: deque[tuple[list[int], torch.cuda.Event | None, Any, list[torch.Tensor]]] = (
            deque()
        )
        self._ended = False

    def reset(self) -> None:
        """A new epoch: what was prefetched for the last one is dropped."""
        self._queue.clear()
        self._ended = False

    def _start_copy(self, tags: list[int], batch: Any) -> None:
        if isinstance(batch, Failure):
            self._queue.append((tags, None, batch, []))
            return
        tensors: list[torch.Tensor] = []
        with torch.cuda.stream(self.stream):
            moved = to_device(batch, self.device, tensors)
            copied = torch.cuda.Event()
            copied.record(self.stream)
        self._queue.append((tags, copied, moved, tensors))

    def next(self, load: Callable[[], HostBatch]) -> HostBatch:
        """The next batch on the device, with its tags; ``load()`` gives the next host batch."""
        while len(self._queue) < self.depth and not self._ended:
            try:
                tags, batch = load()
            except StopIteration:
                self._ended = True
                break
            except Exception as error:
                # Not a batch's own failure (a timeout, say): raised in turn.
                self._queue.append(([], None, Failure(error), []))
                break
            self._start_copy(tags, batch)
        if not self._queue:
            self._ended = False
            raise StopIteration
        tags, copied, moved, tensors = self._queue.popleft()
        if copied is None:
            return tags, moved
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(copied)
        for tensor in tensors:
            # Allocated on the side stream, used on the consumer's: the
            # allocator must wait for the consumer's work before reusing it.
            tensor.record_stream(consumer)
        return tags, moved


class DeviceStage:
    """Iterator mixin: batches come out on ``loader.device``, prefetched.

    An iterator class lists it first among its bases and names its own
    loading method ``_next_host_data``, which returns a ``HostBatch``.
    """

    _prefetcher: DevicePrefetcher | None = None

    def _init_device(self, loader: Any) -> None:
        device = resolve_device(loader.device)
        if device is not None:
            self._prefetcher = DevicePrefetcher(device, loader.device_prefetch)

    def _next_host_data(self) -> HostBatch:
        raise NotImplementedError

    def _delivered(self, tags: list[int]) -> None:
        """Called as each batch (or its failure) is handed to the loop."""

    def _epoch_ended(self) -> None:
        """Called as the loop is told the epoch is over (StopIteration)."""

    def _next_data(self) -> Any:
        # torch's iterators are not thread-safe either; two threads in one
        # would corrupt its epoch: the second is refused at once.
        # (Released in a fork child, whose copy of the iterator goes on alone.)
        in_use = self.__dict__.setdefault("_in_use", ForkSafeLock())
        if not in_use.acquire(blocking=False):
            raise RuntimeError(_IN_USE)
        try:
            return self._next_data_alone()
        finally:
            in_use.release()

    def _next_data_alone(self) -> Any:
        try:
            if self._prefetcher is None:
                tags, data = self._next_host_data()
            else:
                tags, data = self._prefetcher.next(self._next_host_data)
        except StopIteration:
            self._epoch_ended()
            raise
        self._delivered(tags)
        if isinstance(data, Failure):
            data.raise_error()
        return data

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        # A persistent loader's iter() from another thread while this
        # iterator is in next() would restart the epoch under it.
        in_use = self.__dict__.setdefault("_in_use", ForkSafeLock())
        if not in_use.acquire(blocking=False):
            raise RuntimeError(_IN_USE)
        try:
            self._reset_alone(loader, first_iter)
        finally:
            in_use.release()

    def _reset_alone(self, loader: Any, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)  # type: ignore[misc]
        if self._prefetcher is not None:
            self._prefetcher.reset()
