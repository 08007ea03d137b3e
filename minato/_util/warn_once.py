"""Warnings that minato gives once per process, whichever thread hits them first."""

from __future__ import annotations

import warnings
from collections.abc import Hashable

from minato._util.fork import ForkSafeLock

_warned: set[Hashable] = set()
# Worker threads warn too: one may hold it when another thread forks.
_lock = ForkSafeLock()


def warn_once(key: Hashable, message: str, stacklevel: int = 1) -> None:
    """A UserWarning with `message`, unless one was given for `key` already.
    `stacklevel` counts from the caller of warn_once, as for warnings.warn."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, UserWarning, stacklevel=stacklevel + 1)
