"""Locks that a fork child finds released.

A child made by ``os.fork`` (multiprocessing's ``fork`` start method, torch's
DataLoader workers on Linux before Python 3.14) has the parent's memory and
only the thread that forked. A ``threading.Lock`` that another thread of the
parent held at that moment stays held for ever in the child, and the first
``with lock:`` there waits for good. minato's locks guard a few short updates
of Python values (bookkeeping, not resources), so a child can start over
with each one released. The Rust side checks the process itself (see
rust/process.rs); the iterators restart their workers (minato._loader.iterator).
"""

from __future__ import annotations

import os
import threading
import weakref


class ForkSafeLock:
    """A ``threading.Lock`` (as a context manager) that is replaced by a new,
    released one in a fork child."""

    __slots__ = ("_lock", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _locks.add(self)

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def acquire(self, blocking: bool = True) -> bool:
        return self._lock.acquire(blocking)

    def release(self) -> None:
        self._lock.release()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()

    def __reduce__(self) -> tuple[type, tuple[()]]:
        # A copy (pickle, copy.deepcopy) gets a new lock, released.
        return (ForkSafeLock, ())


_locks: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


def _release_all_in_child() -> None:
    for lock in list(_locks):
        lock._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_release_all_in_child)
