"""What torch needs to run DataLoader workers as threads of one process.

``get_worker_info()`` must answer each worker thread with its own
``WorkerInfo`` (minato._worker_info). And ``default_collate`` writes its output
to shared memory whenever ``get_worker_info()`` is not None — pointless work
for a thread, whose batch is already in the consumer's process. :func:`install`
fixes both, in place, so that code which imported torch's functions earlier
sees the fix too; outside minato's worker threads torch behaves exactly as
before.
"""

from __future__ import annotations

import torch
from torch.utils.data._utils import collate as _collate

from minato import _thread_random, _worker_info
from minato._warn_once import warn_once
from minato._worker_info import thread_worker_info, worker_info_hidden

_torch_collate_tensor_fn = _collate.collate_tensor_fn


def _collate_tensor_fn(batch, *, collate_fn_map=None):
    if thread_worker_info() is None:
        return _torch_collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    # torch's own checks and stacking, minus the shared-memory output.
    with worker_info_hidden():
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
    _worker_info.install()
    collate_map = _collate.default_collate_fn_map
    if collate_map.get(torch.Tensor) is _torch_collate_tensor_fn:
        collate_map[torch.Tensor] = _collate_tensor_fn
