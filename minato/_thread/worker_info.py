"""torch's ``get_worker_info``, answered per worker thread.

Up to 2.15 torch keeps the current worker's ``WorkerInfo`` in one module
global, ``_worker_info``: right for worker processes, wrong for threads, which
would all see the same one. torch's main branch adds thread workers of its
own, which keep theirs in a ``threading.local`` that ``get_worker_info`` reads
before the global. :func:`install` composes with either:

- a ``get_worker_info`` that reads per-thread storage of its own is left as it
  is, and minato's worker threads put their ``WorkerInfo`` there too;
- one that reads the global only has its code swapped for one that answers
  minato's worker threads and runs torch's own code for every other thread
  (worker processes, torch's thread workers, the main thread);
- any other is left alone, with one warning.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import types
from collections.abc import Callable, Iterator

from torch.utils.data._utils import worker as _worker

from minato._util.warn_once import warn_once

# Whether the calling thread is one of minato's workers, and its WorkerInfo.
_thread = threading.local()

# Puts a value where a get_worker_info reads the calling thread's, and
# returns how to undo that (which only the probe below wants).
_Setter = Callable[[object], Callable[[], None]]

# Where minato's worker threads put their WorkerInfo for a torch that keeps
# one per thread itself; None for one that does not.
_set_torch_thread_info: _Setter | None = None


def thread_worker_info() -> object | None:
    """The WorkerInfo of the minato worker thread calling, or None."""
    return getattr(_thread, "info", None)


def set_thread_worker_info(info: object | None) -> None:
    _thread.info = info
    if _set_torch_thread_info is not None:
        _set_torch_thread_info(info)  # for the thread's life: never undone


@contextlib.contextmanager
def worker_info_hidden() -> Iterator[None]:
    """get_worker_info() is None in the calling minato worker thread, meanwhile."""
    saved = thread_worker_info()
    set_thread_worker_info(None)
    try:
        yield
    finally:
        set_thread_worker_info(saved)


def _per_thread_get_worker_info():  # pragma: no cover - runs as torch's code
    # Compiled here, run with the globals of torch's get_worker_info: minato's
    # hook for its worker threads, torch's own code for every other thread.
    info = _minato_thread_worker_info()  # noqa: F821
    if info is not None:
        return info
    return _minato_torch_get_worker_info()  # noqa: F821


def _reads_the_global_only(code: types.CodeType) -> bool:
    """Whether `code` is torch's get_worker_info as minato knows it: `return _worker_info`."""
    takes_arguments = code.co_argcount or code.co_kwonlyargcount
    return code.co_names == ("_worker_info",) and not takes_arguments and not code.co_freevars


def _probed_setter(get_worker_info: Callable[[], object], set_info: _Setter) -> bool:
    """Whether get_worker_info() returns what `set_info` stores (in the calling
    thread, undone by the function `set_info` returns before this returns)."""
    sentinel = object()
    try:
        undo = set_info(sentinel)
    except Exception:
        return False
    try:
        return get_worker_info() is sentinel
    except Exception:
        return False
    finally:
        undo()


def _set_local(storage: threading.local, name: str) -> _Setter:
    def set_info(info: object) -> Callable[[], None]:
        had, saved = hasattr(storage, name), getattr(storage, name, None)
        setattr(storage, name, info)
        return lambda: setattr(storage, name, saved) if had else delattr(storage, name)

    return set_info


def _set_context_var(var: contextvars.ContextVar) -> _Setter:
    def set_info(info: object) -> Callable[[], None]:
        token = var.set(info)
        return lambda: var.reset(token)

    return set_info


def _torch_thread_setter(get_worker_info: types.FunctionType) -> _Setter | None:
    """How to set the calling thread's answer of `get_worker_info`, if it reads
    per-thread storage (a threading.local or a ContextVar among its globals):
    found by trying each candidate, in the calling thread, and undoing it."""
    code = get_worker_info.__code__
    names = [*code.co_names, *(c for c in code.co_consts if isinstance(c, str))]
    attributes = [name for name in names if name.isidentifier()]
    for name in code.co_names:
        storage = get_worker_info.__globals__.get(name)
        if isinstance(storage, contextvars.ContextVar):
            candidates = [_set_context_var(storage)]
        elif isinstance(storage, threading.local):
            candidates = [_set_local(storage, attribute) for attribute in attributes]
        else:
            continue
        for set_info in candidates:
            if _probed_setter(get_worker_info, set_info):
                return set_info
    return None


def install_into(get_worker_info: Callable[[], object]) -> None:
    """Make `get_worker_info` (torch's, or a stand-in for it in tests) answer
    each minato worker thread with its own WorkerInfo. Idempotent."""
    global _set_torch_thread_info
    if not isinstance(get_worker_info, types.FunctionType):
        _leave_alone()
        return
    code = get_worker_info.__code__
    if code is _per_thread_get_worker_info.__code__:
        return  # swapped already
    setter = _torch_thread_setter(get_worker_info)
    if setter is not None:
        # torch keeps worker info per thread itself: minato's go where its own do.
        _set_torch_thread_info = setter
        return
    if not _reads_the_global_only(code):
        _leave_alone()
        return
    module_globals = get_worker_info.__globals__
    module_globals["_minato_thread_worker_info"] = thread_worker_info
    # torch's own code, as a function of its own, for every other thread.
    module_globals["_minato_torch_get_worker_info"] = types.FunctionType(
        code, module_globals, code.co_name
    )
    # Swapping the code keeps the function object, so every alias of it
    # (torch.utils.data.get_worker_info, ones users imported) changes too.
    get_worker_info.__code__ = _per_thread_get_worker_info.__code__


def _leave_alone() -> None:
    warn_once(
        "torch.utils.data.get_worker_info",
        "minato: torch.utils.data.get_worker_info is not the code minato knows "
        "(this torch changed it), so it is left as it is: in minato's worker "
        "threads it does not return the thread's WorkerInfo.",
        stacklevel=3,
    )


def install() -> None:
    install_into(_worker.get_worker_info)
