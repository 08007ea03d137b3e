"""What torch needs to run DataLoader workers as threads of one process.

``get_worker_info()`` must answer each worker thread with its own
``WorkerInfo`` (minato._thread.worker_info). And ``default_collate`` writes its output
to shared memory whenever ``get_worker_info()`` is not None — pointless work
for a thread, whose batch is already in the consumer's process. :func:`install`
fixes both, in place, so that code which imported torch's functions earlier
sees the fix too; outside minato's worker threads torch behaves exactly as
before.

A worker process runs torch's ops on one thread (torch calls
``torch.set_num_threads(1)`` in each). In a thread of the training process an
op would fan out over all the cores, each worker thread with a team of
OpenMP threads of its own that spin between regions: 16 threads on 16 cores
then start 240 more. :func:`limit_thread_intra_op` gives the calling thread
alone the count a worker process would have, through the OpenMP runtime's
per-thread setting (torch reads its thread count from it).
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch
from torch.utils.data._utils import collate as _collate

from minato._thread import generators, signals
from minato._thread import worker_info as _worker_info
from minato._thread.worker_info import thread_worker_info, worker_info_hidden
from minato._util.warn_once import warn_once

_torch_collate_tensor_fn = _collate.collate_tensor_fn


def _collate_tensor_fn(batch, *, collate_fn_map=None):
    if thread_worker_info() is None:
        return _torch_collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    # torch's own checks and stacking, minus the shared-memory output.
    with worker_info_hidden():
        return _torch_collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


_OPENMP_RUNTIMES = ("libgomp", "libiomp5", "libomp")


@functools.cache
def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded (torch's Linux wheels bundle libgomp),
    or None: a torch built without OpenMP, or a system without /proc. Found
    once (two threads asking at once may both look: the same answer)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if os.path.basename(path).startswith(_OPENMP_RUNTIMES):
            try:
                runtime = ctypes.CDLL(path)  # already loaded: the same library
                runtime.omp_set_num_threads.argtypes = [ctypes.c_int]
                return runtime
            except (OSError, AttributeError):
                continue
    return None


def limit_thread_intra_op(nthreads: int = 1) -> bool:
    """Sets the calling thread's own intra-op thread count, as
    ``torch.set_num_threads(nthreads)`` does in a worker process; other
    threads keep theirs. False where it cannot (no OpenMP runtime found, or a
    torch that no longer reads the per-thread setting): the thread then
    keeps the process's count."""
    runtime = _openmp_runtime()
    if runtime is None:
        return False
    # torch sets each thread's count from the process's the first time the
    # thread asks for it; asked now, that happens before, not over, ours.
    torch.get_num_threads()
    runtime.omp_set_num_threads(nthreads)
    return torch.get_num_threads() == nthreads


_torch_set_num_threads = torch.set_num_threads


def _set_num_threads(nthreads: int) -> None:
    """torch.set_num_threads, except in a minato worker thread: there the
    process-wide call would set the training loop's intra-op threads too,
    where a worker process sets its own (torch sets 1 in each, and recipes
    copy that into worker_init_fn). There it sets the thread's own count; or,
    where that cannot be done, it is ignored with one warning."""
    if thread_worker_info() is None:
        return _torch_set_num_threads(nthreads)
    if not isinstance(nthreads, int) or nthreads <= 0:
        return _torch_set_num_threads(nthreads)  # torch's own error
    if limit_thread_intra_op(nthreads):
        return None
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
    the process-wide random generators, torch.set_num_threads and signal
    dispositions per worker thread. Idempotent."""
    generators.install()
    signals.install()
    if torch.set_num_threads is _torch_set_num_threads:
        _set_num_threads.__doc__ = _torch_set_num_threads.__doc__
        torch.set_num_threads = _set_num_threads
    _worker_info.install()
    collate_map = _collate.default_collate_fn_map
    if collate_map.get(torch.Tensor) is _torch_collate_tensor_fn:
        collate_map[torch.Tensor] = _collate_tensor_fn
