"""minato's worker threads inside a user's code, held out of it while minato
forks its fork server from the training process.

A fork child has the parent's memory and only the thread that forked. A
worker thread caught inside the user's ``__getitem__`` or ``collate_fn``
with the GIL released (reading a file, importing a module lazily, holding a
lock of the user's) leaves that state half done in the child: a module
half imported, a lock held for good by a thread the child does not have.
torch forks its workers before they run any of the dataset, and a training
process with torch's loader runs no dataset code beside a fork of its own.
minato forks its fork server once auto's measurements point to processes,
while its worker threads load, and a program may fork beside minato's
threads too (a torch DataLoader's workers, multiprocessing). So every fork
in the process waits, a bounded time, for minato's worker threads to leave
the user's code, and holds new tasks at the door until it is done.

Each thread counts only its own depth: a dict store of its own key, atomic
under the GIL. A thread entering counts itself, then looks at the door; a
fork closes the door, then looks for threads inside: whichever comes
second sees the other, so no thread enters unseen while a fork waits.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

# How long a new task waits at a closed door at most: a fork takes
# milliseconds, and the door reopens even if the forking thread fails.
DOOR_MAX_WAIT_S = 5.0
# How often the forking thread looks again while threads are inside.
_POLL_S = 0.0005
# How long any fork waits at most for the threads inside to leave (their
# samples' time, once); then it forks anyway, as torch forks its workers
# beside whatever other threads run.
FORK_QUIET_BOUND_S = 0.1

# Thread ident -> how deep in the user's code it is (absent: outside).
_depth: dict[int, int] = {}
_door = threading.Event()
_door.set()
# The `out_of_user_code` blocks open now (a fork's own wait among them, and
# auto's move, which holds the threads out across the fork it makes): the
# door reopens as the last one ends. Counted under a lock of its own, held
# only for the count.
_closers = 0
_closers_lock = threading.Lock()


class _InUserCode:
    """``with IN_USER_CODE:`` around a call into the user's code on a minato
    worker thread."""

    __slots__ = ()

    def __enter__(self) -> None:
        ident = threading.get_ident()
        depth = _depth.get(ident, 0)
        if depth:  # inside already: a fork waits for this thread anyway
            _depth[ident] = depth + 1
            return
        held_until = time.monotonic() + DOOR_MAX_WAIT_S
        while True:
            if not _door.is_set():
                _door.wait(max(0.0, held_until - time.monotonic()))
            # Counted first, then the door looked at again: a fork that
            # closed it since the first look may have found no thread
            # inside and fork at any moment, so this one steps back out
            # and waits. (The fork closes the door first, then looks.)
            _depth[ident] = 1
            if _door.is_set() or time.monotonic() >= held_until:
                return
            del _depth[ident]

    def __exit__(self, *exc_info: object) -> None:
        ident = threading.get_ident()
        depth = _depth[ident] - 1
        if depth:
            _depth[ident] = depth
        else:  # no entry left behind by threads that end (the pool shrinks)
            del _depth[ident]


IN_USER_CODE = _InUserCode()


def _others_inside(me: int) -> bool:
    # A thread has an entry only while inside. list() copies the keys in C,
    # under the GIL: no thread adds or removes one meanwhile.
    return any(ident != me for ident in list(_depth))


def _close_door() -> None:
    global _closers
    with _closers_lock:
        _closers += 1
        _door.clear()


def _open_door() -> None:
    global _closers
    with _closers_lock:
        # (A fork child starts with none open, yet may end the block the
        # fork was made in.)
        _closers = max(0, _closers - 1)
        if not _closers:
            _door.set()


def _close_and_wait(bound: float) -> bool:
    """Closes the door to the user's code and waits up to `bound` seconds
    (the GIL released) for minato's threads inside to leave; returns whether
    none is left inside."""
    me = threading.get_ident()
    _close_door()
    deadline = time.monotonic() + bound
    while _others_inside(me) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return not _others_inside(me)


@contextlib.contextmanager
def out_of_user_code(bound: float) -> Iterator[bool]:
    """Closes the door to the user's code and waits up to `bound` seconds
    for minato's threads inside to leave; yields whether none is left
    inside, then reopens the door (unless another such block is still open)."""
    try:
        yield _close_and_wait(bound)
    finally:
        _open_door()


def _before_any_fork() -> None:
    # Inside a fork made in a `with out_of_user_code(...)` (minato's own),
    # the door is closed and no thread inside already: no wait.
    _close_and_wait(FORK_QUIET_BOUND_S)


def _reopen_in_parent() -> None:
    _open_door()


def _start_over_in_child() -> None:
    """A fork child has none of the parent's other threads, and the door's
    lock may have been held by one of them: a new door, open."""
    global _door, _closers, _closers_lock
    me = threading.get_ident()
    own = _depth.get(me, 0)  # a fork made from inside the user's code
    _depth.clear()
    if own:
        _depth[me] = own
    _closers = 0
    _closers_lock = threading.Lock()
    _door = threading.Event()
    _door.set()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(
        before=_before_any_fork,
        after_in_parent=_reopen_in_parent,
        after_in_child=_start_over_in_child,
    )
