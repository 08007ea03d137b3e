"""A worker thread's own signal dispositions, as a worker process has its own.

Recipes set them in ``worker_init_fn``: ``signal.signal(signal.SIGINT,
signal.SIG_IGN)`` keeps Ctrl-C from the workers and leaves it to the
training process. CPython lets only the main thread set one, so in a worker
thread that line raises ``ValueError`` where torch's worker process runs it.
A worker thread receives no signal of its own (CPython runs every handler on
the main thread), so ignoring or defaulting one there is what a worker
process's disposition would do for the program: a signal reaches the
training process as before. In a minato worker thread, :func:`install`'s
``signal.signal`` therefore records ``SIG_IGN`` or ``SIG_DFL`` as that
worker's own and returns its previous one, and ``signal.getsignal`` answers
from the same record. A handler function cannot be given a thread: nothing
sends a signal to one worker thread, and an alarm set there is the whole
process's. That stays CPython's ``ValueError``, its message naming worker
processes, which can. Outside minato's worker threads both functions are
CPython's own.
"""

from __future__ import annotations

import errno
import functools
import operator
import signal
import threading
from collections.abc import Callable
from typing import Any

from minato._thread.worker_info import thread_worker_info

_signal_signal = signal.signal
_signal_getsignal = signal.getsignal

# The calling worker thread's dispositions, with the WorkerInfo they belong
# to: a thread serving another worker (another loader's) starts afresh, as a
# new worker process would.
_thread = threading.local()

_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def _signal_number(signalnum: Any) -> int:
    number = operator.index(signalnum)  # CPython's TypeError for a non-integer
    if number not in signal.valid_signals():
        raise ValueError("signal number out of range")
    return number


def _own_dispositions(info: object) -> dict[int, Any]:
    if getattr(_thread, "info", None) is not info:
        _thread.info, _thread.dispositions = info, {}
    dispositions: dict[int, Any] = _thread.dispositions
    return dispositions


@functools.wraps(_signal_signal)
def _worker_signal(signalnum: Any, handler: Any) -> Any:
    info = thread_worker_info()
    if info is None:
        return _signal_signal(signalnum, handler)
    number = _signal_number(signalnum)
    if handler not in (signal.SIG_IGN, signal.SIG_DFL):
        if callable(handler):
            raise ValueError(
                "signal only works in main thread of the main interpreter: this is a "
                "minato DataLoader worker thread, where a signal handler function "
                "would never run. Pass worker_method='multiprocessing' to run the "
                "workers as processes, each with handlers of its own, as torch's are."
            )
        raise TypeError(
            "signal handler must be signal.SIG_IGN, signal.SIG_DFL, or a callable object"
        )
    if number in _UNCATCHABLE:
        raise OSError(errno.EINVAL, "Invalid argument")
    own = _own_dispositions(info)
    previous = own.get(number)
    if previous is None:
        previous = _signal_getsignal(number)
    own[number] = signal.Handlers(handler)
    return previous


@functools.wraps(_signal_getsignal)
def _worker_getsignal(signalnum: Any) -> Any:
    info = thread_worker_info()
    if info is None:
        return _signal_getsignal(signalnum)
    number = _signal_number(signalnum)
    own = _own_dispositions(info)
    return own[number] if number in own else _signal_getsignal(number)


def install() -> None:
    """``signal.signal`` and ``signal.getsignal`` answer minato's worker
    threads per worker (see the module's note). Idempotent."""
    replacements: tuple[tuple[str, Callable[..., Any], Callable[..., Any]], ...] = (
        ("signal", _signal_signal, _worker_signal),
        ("getsignal", _signal_getsignal, _worker_getsignal),
    )
    for name, original, replacement in replacements:
        if getattr(signal, name) is original:
            setattr(signal, name, replacement)
