"""Each worker's own dataset, as each torch worker process has its own copy.

torch's worker processes each get the dataset by fork or pickle, so what a
worker does to it — ``worker_init_fn`` sharding an IterableDataset through
``get_worker_info().dataset``, a handle opened lazily in ``__getitem__``, a
counter — stays in that worker, and the caller's object never changes. A
minato worker thread gets a shallow copy: a new object whose attributes
refer to the same values (arrays, tensors, path lists, file contents are
shared, not duplicated), so setting an attribute changes that worker's copy
only. Datasets that wrap datasets (``Subset``, ``random_split``'s results,
``ConcatDataset``, ``ChainDataset``, ``StackDataset``, or a user's own
wrapper holding one in an attribute) have the wrapped ones copied the same
way. ``copy.copy`` does the copying, so a dataset's own ``__copy__`` or
``__getstate__``/``__setstate__`` (often written to drop handles before
pickling to worker processes) is honoured. In-place changes to a shared
value (appending to a list attribute) are still seen by every worker.
"""

from __future__ import annotations

import copy
import types
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from minato._util.warn_once import warn_once

# Wrappers nest a few levels at most; a bound keeps cyclic or odd object
# graphs from costing anything.
MAX_DEPTH = 8
# Containers of datasets (ConcatDataset.datasets) are scanned up to this many
# entries for a dataset: a 240k-entry path list is never walked.
SCAN_LIMIT = 64

# Values a worker cannot give new attributes: shared as they are.
_SHARED_AS_IS = (list, tuple, dict, set, frozenset, str, bytes, range, np.ndarray, torch.Tensor)


def worker_dataset(dataset: Any, copies: dict[int, Any] | None = None) -> Any:
    """A copy of `dataset` for one worker; the dataset itself (with one
    warning per type) when it cannot be copied. `copies`, when given, gets
    each copied object's id mapped to its copy (see `bound_to_copies`)."""
    if isinstance(dataset, _SHARED_AS_IS) or not _has_attributes(dataset):
        return dataset
    memo: dict[int, Any] = {}
    try:
        clone = _copy(dataset, memo, 0)
    except Exception as error:  # any failure of a user's __copy__/__reduce__
        _warn_shared(dataset, error)
        return dataset
    if copies is not None:
        copies.update(memo)
    return clone


def bound_to_copies(function: Any, copies: dict[int, Any]) -> Any:
    """`function`, bound to the copy of its object where it is a method of
    a dataset that was copied (``worker_init_fn=dataset.open_handle``): in a
    torch worker process it arrives pickled with the dataset, bound to that
    process's copy."""
    owner = getattr(function, "__self__", None)
    if not isinstance(function, types.MethodType) or id(owner) not in copies:
        return function
    return types.MethodType(function.__func__, copies[id(owner)])


def _has_attributes(value: Any) -> bool:
    return hasattr(value, "__dict__") or hasattr(type(value), "__slots__")


def _copy(dataset: Any, memo: dict[int, Any], depth: int) -> Any:
    copied = memo.get(id(dataset))
    if copied is not None:
        return copied
    clone = copy.copy(dataset)
    memo[id(dataset)] = clone
    attributes = getattr(clone, "__dict__", None)
    if depth < MAX_DEPTH and isinstance(attributes, dict):
        for name, value in list(attributes.items()):
            replaced = _copy_wrapped(value, memo, depth + 1)
            if replaced is not value:
                attributes[name] = replaced
    return clone


def _copy_wrapped(value: Any, memo: dict[int, Any], depth: int) -> Any:
    """`value` with the datasets in it copied: a dataset, or a list, tuple
    or dict of them (``ConcatDataset.datasets``, ``StackDataset.datasets``)."""
    if isinstance(value, Dataset):
        return _copy(value, memo, depth)
    if type(value) in (list, tuple):
        head = value[:SCAN_LIMIT]
        if not any(isinstance(item, Dataset) for item in head):
            return value
        return type(value)(
            _copy(item, memo, depth) if isinstance(item, Dataset) else item for item in value
        )
    if type(value) is dict and len(value) <= SCAN_LIMIT:
        if not any(isinstance(item, Dataset) for item in value.values()):
            return value
        return {
            key: _copy(item, memo, depth) if isinstance(item, Dataset) else item
            for key, item in value.items()
        }
    return value


def _warn_shared(dataset: Any, error: Exception) -> None:
    kind = type(dataset)
    warn_once(
        ("uncopyable dataset", kind),
        f"minato: the dataset ({kind.__qualname__}) cannot be copied for each worker "
        f"({type(error).__name__}: {error}), so its worker threads share it: attributes "
        "that worker_init_fn or the dataset set (a shard, a lazily opened file) are seen by "
        "every worker, where each torch worker process would have its own. Give the class a "
        "__copy__ method to make per-worker copies possible.",
        stacklevel=2,
    )
