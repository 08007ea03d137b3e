"""The training process's output, kept its own when a worker thread's
``worker_init_fn`` redirects it.

A worker process's ``worker_init_fn`` may silence that worker: recipes set
``sys.stdout = open(os.devnull, "w")``, or ``os.dup2`` a devnull descriptor
onto 1 and 2. Those are the worker process's alone. In a worker thread the
same lines would silence the training process: its logs, progress bars and
tracebacks. So after a worker thread's ``worker_init_fn`` the standard
streams and descriptors 1 and 2 are put back as they were when the loader
started its workers (its output then goes where the training process's
does), with one warning naming worker processes, which keep a redirection
their own. A changed working directory cannot be put back (the worker's
relative paths would then miss): it is only warned of.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from minato._util.warn_once import warn_once

_STREAMS = ("stdin", "stdout", "stderr")
_DESCRIPTORS = (1, 2)


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        status = os.fstat(fd)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


class ProcessOutput:
    """The training process's streams and descriptors 1 and 2 as its
    workers start (captured on the training thread), to put back after
    each worker thread's ``worker_init_fn``."""

    def __init__(self) -> None:
        self.streams = {name: getattr(sys, name, None) for name in _STREAMS}
        self.cwd = _cwd()
        self.descriptors: dict[int, tuple[int, tuple[int, int]]] = {}
        for fd in _DESCRIPTORS:
            identity = _identity(fd)
            if identity is None:
                continue
            with contextlib.suppress(OSError):
                self.descriptors[fd] = (os.dup(fd), identity)
        copies = [copy for copy, _ in self.descriptors.values()]
        weakref.finalize(self, _close_all, copies)

    def keeping(self, worker_init_fn: Callable[[int], Any] | None) -> Callable[[int], Any] | None:
        """`worker_init_fn`, after which what it redirected is put back."""
        if worker_init_fn is None:
            return None

        @functools.wraps(worker_init_fn)
        def init(worker_id: int) -> Any:
            before = {name: getattr(sys, name, None) for name in _STREAMS}
            try:
                return worker_init_fn(worker_id)
            finally:
                self._put_back(before)

        return init

    def _put_back(self, before: dict[str, Any]) -> None:
        changed = []
        for name, stream in before.items():
            if getattr(sys, name, None) is not stream:
                setattr(sys, name, self.streams[name])
                changed.append(f"sys.{name}")
        for fd, (copy, identity) in self.descriptors.items():
            if _identity(fd) != identity:
                with contextlib.suppress(OSError):
                    os.dup2(copy, fd)
                    changed.append(f"descriptor {fd}")
        if changed:
            warn_once(
                ("worker_init_fn redirected", tuple(changed)),
                f"minato: worker_init_fn redirected {', '.join(changed)} in a DataLoader "
                "worker thread, where they are the training process's too (a worker "
                "process's are its own): put back, so that the worker's output goes "
                "where the training process's does. Pass "
                "worker_method='multiprocessing' for workers with output of their own.",
                stacklevel=3,
            )
        if self.cwd is not None and _cwd() != self.cwd:
            warn_once(
                "worker_init_fn changed the working directory",
                "minato: worker_init_fn changed the working directory in a DataLoader "
                "worker thread: it is the training process's too (a worker process's "
                "is its own), and the training loop's relative paths now start there. "
                "Pass worker_method='multiprocessing' for workers with directories of "
                "their own.",
                stacklevel=3,
            )


def _close_all(descriptors: list[int]) -> None:
    for fd in descriptors:
        with contextlib.suppress(OSError):
            os.close(fd)
