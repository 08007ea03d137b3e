"""The main function of a worker process (see minato._process.workers).

It is set up as torch sets up a worker process (``_worker_loop``), at the
loader's worker priority (minato._util.priority): the globals seeded
from ``base_seed + worker_id``, ``torch.set_num_threads(1)``, torch's
``WorkerInfo`` (``worker_method="multiprocessing"``), then
``worker_init_fn``. It then runs the same fetch code as a worker thread,
one task per message, and answers each with its result. It leaves when the
loader's end of the socket closes, even in the middle of a task (the loader
is gone or stopped it), and ignores Ctrl-C, which the loader handles.

The fork server imports this module once, so a worker process starts with
torch and minato already imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import multiprocessing
import multiprocessing.context
import multiprocessing.process
import multiprocessing.util
import os
import random
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL
from torch.utils.data._utils import signal_handling as _torch_signal_handling
from torch.utils.data._utils import worker as _torch_worker

from minato._minato import ArenaWriter, SlotRing, Wire
from minato._process import ipc as _ipc
from minato._task.runner import EXHAUSTED, WORKER_NOUN, WorkerSpec, make_runner
from minato._task.seed import SampleRun, seed_process
from minato._thread.generators import set_process_initial_seed
from minato._thread.worker_info import set_thread_worker_info
from minato._util.priority import lower_process_priority

# The spec of a worker process forked from the training process holding it
# (minato._process.workers, forced worker processes), as torch's workers
# forked at ``iter()`` hold their dataset: taken from here, never pickled
# (an open file, a lock, a multiprocessing object made in the 'fork'
# context included).
inherited_spec: Any = None


def _inherited() -> Any:
    if inherited_spec is None:
        raise RuntimeError("minato: this worker process holds no inherited spec")
    return inherited_spec


class InheritedSpec:
    """Pickles as a reference to the spec the receiving process inherited."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _inherited, ()


# How long a worker process's exit may take (its queues flushing), as torch's
# loader waits for each of its workers to exit before terminating it.
EXIT_BOUND_S = MP_STATUS_CHECK_INTERVAL


class _StreamSkip:
    """An IterableDataset's resumed epoch: batches this worker's stream
    drops first, as the loader sends them with the epoch's first task."""

    def __init__(self) -> None:
        self.count = 0

    def take(self, _stream: int) -> int:
        count, self.count = self.count, 0
        return count


def _exit_with_loader(fd: int) -> None:
    """Leaves when the loader's end closes (the loader stopped this worker,
    or its process died), even while the dataset's code runs."""
    poller = select.poll()
    poller.register(fd, select.POLLRDHUP)
    while True:
        for _, events in poller.poll():
            if events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL):
                leave(0)


_leaving = threading.Lock()


def leave(code: int) -> NoReturn:
    """Exits as a process multiprocessing started exits, as torch's worker
    processes do: the finalizers run first (a ``multiprocessing.Queue`` the
    dataset put on sends what it still buffers), then the threads the
    dataset started are waited for, within torch's bound on a worker's
    exit, past which it exits regardless (a pipe nobody reads, a thread
    that never ends)."""
    if _leaving.acquire(blocking=False):
        bound = threading.Thread(target=_exit_after, args=(code,), daemon=True)
        bound.start()
        exit_function = getattr(multiprocessing.util, "_exit_function", None)
        with contextlib.suppress(BaseException):
            if callable(exit_function):
                exit_function()
        with contextlib.suppress(BaseException):
            _join_threads()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    # Another thread is leaving: it exits the process.
    while True:
        time.sleep(EXIT_BOUND_S)


def _join_threads() -> None:
    """What the interpreter's shutdown does, as in a process multiprocessing
    started: threading's exit callbacks run (a ``ThreadPoolExecutor``'s
    workers finish the work queued), then its non-daemon threads are
    joined. Not the main thread, which may be inside the dataset's code
    when the loader's end closed. A private name of CPython's, looked up so
    that one gone is skipped."""
    for callback in reversed(list(getattr(threading, "_threading_atexits", ()))):
        with contextlib.suppress(Exception):
            callback()
    here, main = threading.current_thread(), threading.main_thread()
    for thread in threading.enumerate():
        if not thread.daemon and thread is not here and thread is not main:
            thread.join()


def _exit_after(code: int) -> None:
    time.sleep(EXIT_BOUND_S)
    os._exit(code)


def _call_if_there(module: Any, name: str, *args: Any) -> None:
    call = getattr(module, name, None)
    if callable(call):
        with contextlib.suppress(Exception):
            call(*args)


def _no_run(_run: SampleRun | None) -> None:
    """A worker process's generators are seeded eagerly (`seed_process`)."""


def _set_up(spec: WorkerSpec, worker_id: int) -> None:
    lower_process_priority(spec.nice)
    # As torch's _worker_loop: a crash here (a bus error from a full
    # /dev/shm, say) is told on stderr as a worker's, and the process is
    # named as torch names its workers (ps, top, py-spy). Private names of
    # torch's, looked up so that one gone is skipped.
    _call_if_there(_torch_signal_handling, "_set_worker_signal_handlers")
    _call_if_there(torch.multiprocessing, "_set_thread_name", "pt_data_worker")
    torch.set_num_threads(1)
    seed = spec.base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    # torch.initial_seed() stays the worker's seed whatever minato's
    # per-sample seeding does (minato._task.seed), as in a worker thread.
    set_process_initial_seed(seed)
    import numpy as np

    np.random.seed(_torch_worker._generate_state(spec.base_seed, worker_id))
    # The fork server may have been forked from a worker thread (one that
    # wanted a process first, in a fork child of the training process): that
    # thread's WorkerInfo, which get_worker_info() reads before torch's
    # global, would be every process's.
    set_thread_worker_info(None)
    _torch_worker._worker_info = _torch_worker.WorkerInfo(
        id=worker_id,
        num_workers=spec.num_workers,
        seed=seed,
        dataset=spec.dataset,
        worker_method="multiprocessing",
    )


# This process's connection to its loader.
connection: Wire | None = None


@dataclasses.dataclass(frozen=True)
class ProcessIdentity:
    """What multiprocessing tells a process it started about itself and its
    parent, as the loader's process numbered this worker process (torch's
    worker processes are ``multiprocessing_context.Process`` objects,
    daemonic)."""

    identity: tuple[int, ...]
    parent_name: str
    parent_pid: int
    # The loader's multiprocessing_context's start method, forced in the
    # child as multiprocessing's bootstrap forces it (None: the default).
    start_method: str | None

    @classmethod
    def next_child(cls, start_method: str | None) -> ProcessIdentity:
        """The identity of the next process this process starts: it draws a
        number from multiprocessing's counter, as a ``Process`` made here."""
        me = multiprocessing.process.current_process()
        count = next(multiprocessing.process._process_counter)  # type: ignore[attr-defined]
        return cls((*me._identity, count), me.name, os.getpid(), start_method)  # type: ignore[attr-defined]


def _parent_sentinel(pid: int) -> int:
    """A descriptor that turns readable once the process `pid` exits, as
    multiprocessing's parent sentinel (``parent_process().is_alive()``)."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        gone, write = os.pipe()  # read at its end: gone
        os.close(write)
        return gone
    except (AttributeError, OSError):
        # No pidfd here: a descriptor never readable. This process leaves
        # with the loader's anyway.
        never, _kept = os.pipe()
        return never


def _as_multiprocessing_child(me: ProcessIdentity) -> None:
    """This process as multiprocessing's ``Process._bootstrap`` sets up a
    process it started: ``current_process()`` a daemonic ``Process-N``
    numbered by the loader's process, ``parent_process()`` that process, its
    own counter from 1. Private names of CPython's, looked up so that one
    gone is skipped, not fatal."""
    mp = multiprocessing.process
    if not all(hasattr(mp, name) for name in ("_current_process", "_parent_process")):
        return
    kind: Any = multiprocessing.Process  # the default context's, as torch's default
    if me.start_method is not None:
        with contextlib.suppress(ValueError):
            kind = multiprocessing.get_context(me.start_method).Process
    process = kind(name=f"{kind.__name__}-{':'.join(map(str, me.identity))}")
    # Not through the setter, which refuses a daemon's child (this process's
    # copy of a parent that is itself a worker).
    process._config["daemon"] = True  # type: ignore[attr-defined]
    process._identity = me.identity  # type: ignore[attr-defined]
    process._parent_pid = me.parent_pid  # type: ignore[attr-defined]
    process._parent_name = me.parent_name  # type: ignore[attr-defined]
    # sys.stdin a file of its own on /dev/null, as multiprocessing makes it.
    _call_if_there(multiprocessing.util, "_close_stdin")
    mp._current_process = process  # type: ignore[attr-defined]
    parent_kind = getattr(mp, "_ParentProcess", None)
    if parent_kind is not None:
        sentinel = _parent_sentinel(me.parent_pid)
        mp._parent_process = parent_kind(me.parent_name, me.parent_pid, sentinel)  # type: ignore[attr-defined]
    mp._process_counter = itertools.count(1)  # type: ignore[attr-defined]
    force = getattr(multiprocessing.context, "_force_start_method", None)
    if me.start_method is not None and callable(force):
        force(me.start_method)


def _no_children_of_the_parents() -> None:
    """This process's children start empty, as in ``Process._bootstrap``:
    those of the process it was forked from are not its own to terminate
    and join as it exits (see `leave`), whenever it leaves."""
    if isinstance(getattr(multiprocessing.process, "_children", None), set):
        multiprocessing.process._children = set()  # type: ignore[attr-defined]


def _after_fork_as_multiprocessing() -> None:
    """What multiprocessing runs in a process it starts before its target,
    as in torch's worker processes: the finalizers of the objects of the
    process it was forked from are dropped, and the callbacks registered to
    run after a fork run (a ``multiprocessing.Queue`` made in the 'fork'
    context forgets the parent's feeder thread, and starts one of its own
    when a worker puts on it; a manager's proxy connects anew). Private
    names of CPython's, looked up so that one gone is skipped, not fatal."""
    after_fork = getattr(multiprocessing.process.BaseProcess, "_after_fork", None)
    if callable(after_fork):
        after_fork()


def main(sock: socket.socket) -> None:
    global connection
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _no_children_of_the_parents()
    wire = connection = Wire(sock)
    threading.Thread(target=_exit_with_loader, args=(wire.fileno(),), daemon=True).start()
    WORKER_NOUN["noun"] = "process"
    try:
        worker_id, samples, identity = _ipc.recv(wire)
    except EOFError:
        return
    # Before the after-fork callbacks, as in multiprocessing's bootstrap:
    # they may ask which process this is.
    _as_multiprocessing_child(identity)
    _after_fork_as_multiprocessing()
    try:
        spec = _ipc.recv(wire)
    except EOFError:
        return
    stream_skip = _StreamSkip()
    spec = dataclasses.replace(spec, take_stream_skip=stream_skip.take)
    _set_up(spec, worker_id)
    run = make_runner(
        spec,
        spec.dataset,
        worker_id,
        contextlib.nullcontext(),
        samples=samples,
        begin_run=_no_run,
        eager_seed=seed_process,
    )
    ring = SlotRing()
    writer = _ipc.arena_writer = ArenaWriter()
    while True:
        try:
            epoch, task, skip, freed, placing, defer = _ipc.recv(wire)
        except EOFError:
            return
        ring.give_back(freed)
        ring.task_begins()
        if skip is not None:
            stream_skip.count = skip
        if placing is None:
            output: Any = run(epoch, task)
        else:
            output = run(epoch, task, _settler(placing, writer))
        if output is EXHAUSTED:
            _ipc.send(wire, None)
        elif placing is None:
            _ipc.send(wire, (_deferred(output) if defer else output,), ring)
        else:
            _ipc.send(wire, _placed(output, task, placing), ring, writer)
        # Sent: not held while the next task runs (its samples would stay
        # alive beside the next run's).
        del output


def run(fd: int) -> NoReturn:
    """A forked worker process's whole life: `main` on the socket `fd`,
    then its exit (1 if `main` raised, its traceback printed)."""
    code = 0
    try:
        main(socket.socket(fileno=fd))
    except BaseException:
        code = 1
        import traceback

        traceback.print_exc()
    finally:
        leave(code)


def _deferred(output: list[Any]) -> list[Any]:
    """A run of samples' results, each sample left pickled for the loader's
    collate thread (errors and skipped samples as they are)."""
    return [
        _ipc.Deferred(item)
        if type(item) is tuple and len(item) == 2 and not isinstance(item[1], ExceptionWrapper)
        else item
        for item in output
    ]


def _settler(placing: Any, writer: ArenaWriter) -> Callable[[int, Any], Any]:
    """What a run keeps of each sample as it is loaded: its large leaves
    written at once into the place the loader lent it in its batch's arena
    (minato._process.ipc.written_into_arena), so that the worker's heap
    holds one sample's, not the run's."""
    places, _announced, forget = placing  # the announced arenas are mapped
    if forget:
        writer.forget(forget)

    def settle(ordinal: int, sample: Any) -> Any:
        place = places[ordinal]
        return sample if place is None else _ipc.written_into_arena(sample, place, writer)

    return settle


def _placed(output: list[Any], task: list[Any], placing: Any) -> Any:
    """A run of samples' results, each with the place the loader lent it in
    its batch's arena (its large leaves written there as it was loaded, or
    as it is pickled), and the sizes of the first sample's large leaves."""
    places = placing[0]
    where = {item[0]: place for item, place in zip(task, places, strict=True) if place is not None}
    results = [
        _ipc.Placed(item, where.get(item[0])) if type(item) is tuple and len(item) == 2 else item
        for item in output
    ]
    return results, _ipc.LeafSizes()
