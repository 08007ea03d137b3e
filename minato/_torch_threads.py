"""What torch needs to run DataLoader workers as threads of one process.

torch keeps the current worker's ``WorkerInfo`` in a module global, which is
right for worker processes and wrong for threads: every thread would see the
same one. And ``default_collate`` writes its output to shared memory whenever
``get_worker_info()`` is not None — pointless work for a thread, whose batch
is already in the consumer's process. :func:`install` fixes both, in place, so
that code which imported torch's functions earlier sees the fix too; outside
minato's worker threads torch behaves exactly as before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch.utils.data._utils import collate as _collate
from torch.utils.data._utils import worker as _worker

from minato import _thread_random
from minato._warn_once import warn_once

_thread = threading.local()

_torch_collate_tensor_fn = _collate.collate_tensor_fn


def thread_worker_info() -> object | None:
    """The WorkerInfo of the minato worker thread calling, or None."""
    return getattr(_thread, "info", None)


def set_thread_worker_info(info: object | None) -> None:
    _thread.info = info


@contextlib.contextmanager
def _worker_info_hidden() -> Iterator[None]:
    saved = thread_worker_info()
    _thread.info = None
    try:
        yield
    finally:
        _thread.info = saved


def _per_thread_get_worker_info():  # pragma: no cover - runs as torch's code
    # Compiled here, run with the globals of torch.utils.data._utils.worker:
    # its `_worker_info` for worker processes, minato's hook for threads.
    info = _minato_thread_worker_info()  # noqa: F821
    if info is not None:
        return info
    return _worker_info  # noqa: F821


def _collate_tensor_fn(batch, *, collate_fn_map=None):
    if thread_worker_info() is None:
        return _torch_collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    # torch's own checks and stacking, minus the shared-memory output.
    with _worker_info_hidden():
        return _torch_collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


_torch_set_num_threads = torch.set_num_threads


def _set_num_threads(nthreads: int) -> None:
    """torch.set_num_threads, except in a minato worker thread: there it
    would set the whole process's intra-op threads, the training loop's too,
    where a worker process sets its own (torch sets 1 in each, and recipes
    copy that into worker_init_fn). It is ignored there, with one warning."""
    if thread_worker_info() is None:
        return _torch_set_num_threads(nthreads)
    warn_once(
        "torch.set_num_threads",
        f"minato: torch.set_num_threads({nthreads}) in a DataLoader worker thread is "
        "ignored: it would change the intra-op threads of the whole process, the "
        "training loop's included, where a worker process would change its own.",
        stacklevel=2,
    )
    return None


def install() -> None:
    """Make get_worker_info per-thread, default_collate shm-free in threads,
    the process-wide random generators per worker thread, and
    torch.set_num_threads a no-op in worker threads. Idempotent."""
    _thread_random.install()
    if torch.set_num_threads is _torch_set_num_threads:
        _set_num_threads.__doc__ = _torch_set_num_threads.__doc__
        torch.set_num_threads = _set_num_threads
    get_worker_info = _worker.get_worker_info
    if get_worker_info.__code__ is not _per_thread_get_worker_info.__code__:
        setattr(_worker, "_minato_thread_worker_info", thread_worker_info)  # noqa: B010
        # Swapping the code keeps the function object, so every alias of it
        # (torch.utils.data.get_worker_info, ones users imported) changes too.
        get_worker_info.__code__ = _per_thread_get_worker_info.__code__
    collate_map = _collate.default_collate_fn_map
    if collate_map.get(torch.Tensor) is _torch_collate_tensor_fn:
        collate_map[torch.Tensor] = _collate_tensor_fn
