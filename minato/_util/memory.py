"""Memory freed by worker threads, given back to the system.

glibc's allocator gives each thread that allocates a heap of its own (an
arena), up to eight per core, and keeps what is freed there for that
thread's next allocations. Worker threads that decoded images hold tens of
megabytes each that way after their last task. Once the loader's workers
have moved to processes, nothing will reuse them: `malloc_trim` returns the
free pages of every arena, with the GIL released but slowly where many
arenas hold much or other threads are allocating (benchmarks/RESULTS.md,
session 17): the training thread leaves that to a thread of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import sys
import threading
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


def give_back_freed_memory() -> None:
    """Returns the allocator's free pages to the system, where it can."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def give_back_arrow_memory() -> None:
    """Returns the free pages of pyarrow's allocator (mimalloc or jemalloc,
    which keep what was freed for later), where pyarrow is loaded. Pickling
    a pandas column held by pyarrow copies it (pandas' ``__getstate__``
    combines its chunks), and the copy's pages stay with the allocator once
    freed (benchmarks/RESULTS.md, session 28). mimalloc keeps them per
    thread: called from the thread that freed them."""
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is not None:
        with contextlib.suppress(Exception):  # an old pyarrow, a pool without it
            pyarrow.default_memory_pool().release_unused()


def give_back_freed_memory_soon() -> None:
    """`give_back_freed_memory` on a short-lived thread of its own, so that
    the caller (the training thread) does not wait for it."""
    if _malloc_trim() is not None:
        threading.Thread(target=give_back_freed_memory, name="minato-trim", daemon=True).start()
