"""Worker processes: one more kind of worker under the same engine.

With processes, each engine worker thread owns one worker process and hands
it its tasks: the thread sends the task over a Unix socket and waits with
the GIL released, the process runs the dataset and answers. Everything else
stays the engine's, unchanged: sample-level batching and the slow lane,
per-sample timeouts, the adaptive pool (a thread added starts its process),
stats, exactly-once resume, persistent workers. Exceptions keep their type,
worker id and sample index; large tensors and arrays come back in shared
memory (minato._process.ipc).

Start: forced worker processes (``worker_method="multiprocessing"``) start
from the training process as their engine starts (each epoch, or once for
persistent workers), as torch forks its workers at ``iter()``: they see the
training process as it is then (its module globals, its process settings)
and inherit the spec unpickled (``ProcessWorkers.inherit_spec``). Up to
``FORKED_DIRECTLY`` of them are forked from it directly (this process reaps
them); more come from a fork server of the engine's own, forked then.
Auto's worker processes fork from this process's shared fork server
(minato._process.zygote), started once per process when first wanted
(``warm_up``): as a loader that starts on processes is built, or as auto's
measurements first point to processes (a loader that keeps threads never
forks it), and forked again before a loader's worker processes start where
it holds pages this process has since let go
(``STALE_SERVER_BYTES``). The fork server is forked from this process, by the calling
thread, with minato's worker threads held out of the user's code
(minato._util.user_code), as torch forks its workers from it: it shares
this process's pages copy-on-write (torch, the user's modules, the
dataset's data), so it starts in milliseconds and costs no interpreter of
its own. It keeps only its socket of this process's descriptors, and never
collects what it inherited (``gc.freeze``). ``MINATO_FORK_SERVER=exec``
starts it as a fresh interpreter instead (fork+exec: it imports torch and
minato itself, about a second, and shares nothing). Either way a worker
process then starts in milliseconds, and never runs ``__main__`` again.
From the shared server, the dataset and the rest of the worker's spec are
pickled once per engine and the same bytes sent to every worker process it
starts (its tensors in shared memory, shared by all of them). A loader that asks for "spawn" or
"forkserver" gets a fresh interpreter of its engine's own as its fork
server, as torch's workers start fresh (``ProcessWorkers.start_fresh``).

Hard limit: a process, unlike a thread, can be stopped. A task that runs
past ``sample_hard_timeout`` seconds per sample has its process killed and
fails with a RuntimeError naming the sample (``on_error="skip"`` skips it);
a run of several samples is first re-run one sample at a time, so only the
one that hangs again fails. A worker process that dies (``kill -9``, a
crash in a decoder) fails its task the same way, as does one that sends
what is not a message of the wire (rust/wire/, read without the GIL): it
is stopped, and the error says what arrived. Either way the thread
starts a new process for its next task: an index is delivered once or
reported failed, never lost or repeated.

No process outlives its loader: the thread's end of the socket closing
(the engine stopped, the loader collected, the interpreter exiting, this
process killed) makes the worker process exit, even mid-task, once
multiprocessing's finalizers ran (within a bound, past which the loader
kills it: minato._process.child.leave).
"""

from __future__ import annotations

import _thread
import contextlib
import dataclasses
import gc
import json
import mmap
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from torch._utils import ExceptionWrapper

from minato._minato import (
    ArenaPool,
    SlotMap,
    Wire,
    WireError,
    _own_status_bytes,
    _private_dirty_bytes,
)
from minato._process import child as _process_child
from minato._process import inherit
from minato._process import ipc as _ipc
from minato._process import zygote as _zygote
from minato._process.method import WorkerMethod, exec_server_wanted
from minato._task.error import WorkerError
from minato._task.failures import NOTHING_LOADED, SampleFailure, Skipped
from minato._task.runner import EXHAUSTED, WorkerSpec
from minato._util.fork import ForkSafeLock
from minato._util.memory import give_back_arrow_memory, give_back_freed_memory
from minato._util.user_code import FORK_QUIET_BOUND_S, out_of_user_code

# `_process_child` is what a forked child runs, imported before any fork: its
# objects are then shared with the child, not made there on pages it would
# copy from this process's (benchmarks/RESULTS.md, session 27).


class _ForkedServer:
    """A fork server forked from this process, with the part of
    ``subprocess.Popen``'s interface the loader uses."""

    def __init__(self, pid: int, anonymous_at_fork: int | None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        # This process's anonymous resident bytes as it forked the server,
        # and its minor page faults when the server's own pages were last
        # read (see `_server_stale`).
        self.anonymous_at_fork = anonymous_at_fork
        self.faults_at_look = _minor_faults()

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                self.returncode = -1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("minato fork server", timeout or 0.0)
            time.sleep(0.002)
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def _fork_server(
    theirs: socket.socket, inheriting: Any = None, ours: socket.socket | None = None
) -> _ForkedServer:
    """Forks this process into the fork server, serving `theirs`; or, given
    the spec `inheriting`, into a loader's own fork server holding it, for
    its workers to take (minato._process.child.InheritedSpec). `ours`, this
    process's end of the server's socket, is closed there: a server holding
    it would never see this process gone."""
    anonymous = _anonymous_resident()
    pid = _fork_child(theirs.fileno(), inheriting, ours, server=True)
    if inheriting is None:
        inherit.server_forked()
    return _ForkedServer(pid, anonymous)


def _fork_worker(theirs: socket.socket, ours: socket.socket, spec: Any) -> int:
    """Forks this process into a worker process on `theirs`, holding `spec`
    (taken as minato._process.child.InheritedSpec), as torch forks its
    workers from the training process; returns its pid. `ours`, this
    process's end of its socket, is closed there: a worker holding it would
    never see this process gone."""
    return _fork_child(theirs.fileno(), spec, ours, server=False)


# One fork at a time: the spec a child holds is set just before it forks.
_forking = ForkSafeLock()


def _fork_child(keep: int, spec: Any, ours: socket.socket | None, server: bool) -> int:
    """Forks this process, from the calling thread, into a fork server
    serving the socket `keep`, or into a worker process on it, holding
    `spec` (None: the shared server, which keeps no descriptor of this
    process's but `keep`). Returns the child's pid."""
    # Auto forks its server while its worker threads load: none is left
    # inside the user's code, half done, in the child (minato._util.user_code).
    # Every fork waits so (its at-fork hook); waiting here, before the
    # warnings filters are swapped, keeps that window to the fork itself,
    # and the hook then finds no thread inside.
    pid = -1
    # Released by the parent only: a fork child's is a new one, released.
    _forking.acquire()
    try:
        with out_of_user_code(FORK_QUIET_BOUND_S), warnings.catch_warnings():
            # Python warns of forking a process with threads; the child runs
            # only the fork server's loop, or one worker's.
            warnings.simplefilter("ignore", DeprecationWarning)
            # minato's own sockets, which a child keeping the user's
            # descriptors must not keep open: their peers would not see
            # them closed. (Read with every minato thread out of the user's
            # code.)
            minatos = _own_sockets() if spec is not None else set()
            if ours is not None:
                minatos.add(ours.fileno())
            _process_child.inherited_spec = spec
            pid = os.fork()
    finally:
        if pid != 0:
            _process_child.inherited_spec = None
            _forking.release()
    if pid:
        return pid
    try:
        # The parent's Python signal handlers (a trainer's SIGTERM checkpoint,
        # say) are not the fork server's, nor its workers'.
        for number in signal.valid_signals():
            if callable(signal.getsignal(number)):
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(number, signal.SIG_DFL)
        # Objects of this process's that hold descriptors (sockets, files)
        # must never be collected here: closing their numbers, reused for
        # the workers' sockets, would cut those.
        gc.freeze()
        # Free pages of this process's heaps (worker threads' arenas that
        # decoded images before auto moved) are no memory of the child's:
        # unmapped here, they are neither held by it once the training
        # process trims its own nor inherited by the workers it forks.
        give_back_freed_memory()
        if spec is None:
            # Only its socket: a copy of another one would keep its peer from
            # seeing it closed (a worker process of this loader, say).
            os.closerange(3, keep)
            os.closerange(keep + 1, _max_fd())
        else:
            # The spec's files stay open, as in torch's forked workers;
            # minato's own sockets and shared memory go.
            _close_own_descriptors(minatos)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        if server:
            _zygote.serve(keep)
        else:
            _process_child.run(keep)
    finally:
        os._exit(0)


def _own_sockets() -> set[int]:
    """The descriptors of minato's sockets in this process: its fork
    servers' and its worker processes'."""
    here = os.getpid()
    fds = set()
    zygotes = [_the_zygote]
    with contextlib.suppress(RuntimeError):  # a set changed while read
        for workers in list(_live):
            processes = list(workers._processes)
            fds.update(process.wire.fileno() for process in processes if process.owner == here)
            fds.update(spare.sock.fileno() for spare in list(workers._spares))
            zygotes.append(workers.own_zygote)
    fds.update(zygote.sock.fileno() for zygote in zygotes if zygote and zygote.pid == here)
    return fds


def _close_own_descriptors(sockets: set[int]) -> None:
    """Closes minato's descriptors: the `sockets` (still sockets: a number
    given back meanwhile may be a file of the user's now) and its shared
    memory (batch arenas and slot rings, named so in /proc)."""
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc/self/fd"):
            fd = int(entry)
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/self/fd/{entry}")
                if link.startswith("/memfd:minato-") or (
                    fd in sockets and link.startswith("socket:")
                ):
                    os.close(fd)


def _max_fd() -> int:
    try:
        return max(int(os.sysconf("SC_OPEN_MAX")), 256)
    except (ValueError, OSError):
        return 65536


# Forced worker processes forked from the training process itself, at most:
# more come from a fork server of their engine's own. A server holds a copy
# of its own of every page that the training process and the workers all
# write (the interpreter's own objects: a few MB, benchmarks/RESULTS.md,
# session 40), while each direct fork stops the training thread for as long
# as copying its page tables takes, one per worker per epoch, as torch's.
FORKED_DIRECTLY = 2


def _exec_server(theirs: socket.socket) -> subprocess.Popen:
    """Starts the fork server as a fresh interpreter, serving `theirs`."""
    code = (
        "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
        # The whole package, once, before the first fork.
        "import minato; "
        "from minato._process.zygote import serve; serve(int(sys.argv[2]))"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(sys.path), str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
    )


class _Zygote:
    """The fork server worker processes come from (see minato._process.zygote);
    given a spec, a loader's own, forked holding it; `fresh`, a fresh
    interpreter."""

    def __init__(self, inheriting: Any = None, fresh: bool = False) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.process: _ForkedServer | subprocess.Popen
        try:
            if inheriting is not None:
                self.process = _fork_server(theirs, inheriting, ours)
            elif fresh or exec_server_wanted():
                self.process = _exec_server(theirs)
            else:
                self.process = _fork_server(theirs)
        finally:
            theirs.close()
        self.sock = ours
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.imported: set[str] = set()
        # Its "ready" is read by the first request, not here: the thread that
        # forked it (auto's, the training loop's) goes on meanwhile.
        self._ready = False

    def _wait_ready(self) -> None:
        """Waits for the server's "ready" (under `lock`, before a request)."""
        if not self._ready:
            if self.sock.recv(1) != b"r":
                raise RuntimeError("minato's fork server failed to start (see its output above)")
            self._ready = True

    def preload(self, modules: list[str]) -> None:
        """Has the zygote import `modules` (those not sent before), so that
        the workers it forks from now on start with them imported."""
        with self.lock:
            self._wait_ready()
            new = [name for name in modules if name not in self.imported]
            if not new:
                return
            names = json.dumps(new).encode()
            self.sock.sendall(b"i" + _zygote.LENGTH.pack(len(names)) + names)
            if self.sock.recv(1) != b"k":
                raise EOFError("minato's fork server exited")
            self.imported.update(new)

    def fork(self, worker_end: socket.socket) -> int:
        """Starts a worker process on `worker_end`; returns its pid."""
        with self.lock:
            self._wait_ready()
            socket.send_fds(self.sock, [b"f"], [worker_end.fileno()])
            answer = b""
            while len(answer) < _zygote.PID.size:
                more = self.sock.recv(_zygote.PID.size - len(answer))
                if not more:
                    raise EOFError("minato's fork server exited")
                answer += more
        return int(_zygote.PID.unpack(answer)[0])


_zygote_lock = ForkSafeLock()
_the_zygote: _Zygote | None = None


def _zygote_now() -> _Zygote:
    """The running zygote of this process, forked if need be (its "ready"
    is waited for by its first request)."""
    global _the_zygote
    with _zygote_lock:
        zygote = _the_zygote
        if zygote is None or not _zygote_running():
            zygote = _the_zygote = _Zygote()
        return zygote


def _zygote_running() -> bool:
    """Whether this process's fork server is up (not one a parent started)."""
    zygote = _the_zygote
    return zygote is not None and zygote.pid == os.getpid() and zygote.process.poll() is None


def warm_up(modules: list[str] | None = None, dataset: Any = None) -> None:
    """Starts the fork server, and has it import `modules` (the dataset's)
    in the background, so that worker processes, when wanted, start in
    milliseconds; `dataset`'s large arrays are registered first, for its
    workers to take from the server's memory (minato._process.inherit).
    Forked, the server starts here, in the calling thread (a fork takes
    milliseconds, and the caller knows what its threads do: another
    thread's import half done would be half done in every worker);
    a fresh interpreter (``MINATO_FORK_SERVER=exec``) starts in the
    background. Asking again for modules already asked for does nothing.
    Given a dataset, a running server that has come to hold pages this
    process let go since its fork (`_server_stale`) is replaced first."""
    global _warming_in
    forked = not exec_server_wanted()
    if forked and dataset is not None and _zygote_running() and _server_stale():
        # Only the training thread gives a dataset: the one a new server
        # may be forked from.
        _stop_fork_server(aside=True)
    if forked:
        # Up on return, even where these modules were asked for before (a
        # server that died since): auto pickles its workers' spec next.
        if dataset is not None and not _zygote_running():
            # Only what is registered before the fork is in the server's memory.
            inherit.register(dataset)
        with contextlib.suppress(Exception):  # reported when a worker process starts
            _zygote_now()
    wanted = set(modules or ())
    with _zygote_start_lock:
        if _warming_in == os.getpid() and wanted <= _warming_modules:
            return
        if _warming_in != os.getpid():
            _warming_modules.clear()
        _warming_in = os.getpid()
        _warming_modules.update(wanted)
    if wanted or not forked:  # imports to make, or a fresh interpreter to start
        threading.Thread(
            target=_warm, args=(modules or [],), name="minato fork server", daemon=True
        ).start()


# The process a warm-up was started in (a fork child starts its own), and
# the modules asked for there.
_warming_in: int | None = None
_warming_modules: set[str] = set()
_zygote_start_lock = ForkSafeLock()


def _warm(modules: list[str]) -> None:
    try:
        _zygote_now().preload(modules)
    except Exception:  # reported again when a worker process is started
        with _zygote_start_lock:
            _warming_modules.difference_update(modules)  # a later warm-up tries again


def fork_server_ready(modules: list[str]) -> bool:
    """Whether a worker process starts at once: the fork server of this
    process is up and has imported `modules`. (Moving while it still
    imports them would stall every worker until it is done: seconds, with
    torchvision on a busy machine.)"""
    zygote = _the_zygote
    return zygote is not None and zygote.pid == os.getpid() and set(modules) <= zygote.imported


def _no_stream_skip(_stream: int) -> int:
    return 0


def _end(wire: Wire, pid: int, child: bool, started: int | None) -> None:
    """Ends a worker process's connection: it leaves, as torch's workers
    leave, once its finalizers ran (its queues flushed, see
    minato._process.child.leave), and is killed if still there past that
    bound. This process's own `child` is reaped, on a thread of its own."""
    wire.shutdown()
    if child:
        _reap_soon(pid)
    elif started is not None:
        with contextlib.suppress(RuntimeError):  # no thread to be had: it leaves by itself
            _thread.start_new_thread(_kill_if_lingering, (pid, started))


def _reap_soon(pid: int) -> None:
    try:
        _thread.start_new_thread(_reap_child, (pid,))
    except RuntimeError:  # no thread to be had (at interpreter exit): left to init
        pass


def _reap_child(pid: int) -> None:
    """Reaps this process's child `pid` (killed once past the exit bound)."""
    with contextlib.suppress(ChildProcessError):  # SIGCHLD ignored: the kernel reaped it
        if _exit_status(pid, _process_child.EXIT_BOUND_S) is None:
            os.kill(pid, signal.SIGKILL)  # not reaped yet: still this child's pid
            os.waitpid(pid, 0)


def _exit_status(pid: int, bound: float) -> int | None:
    """The wait status of this process's child `pid`, reaped once it exited
    within `bound` seconds; None if it still runs. ChildProcessError where
    the kernel reaped it (SIGCHLD ignored)."""
    deadline = time.monotonic() + bound
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _lingers(pid: int, started: int, bound: float) -> bool:
    """Whether process `pid`, started at `started`, is still there (neither
    gone nor a zombie) after up to `bound` seconds."""
    deadline = time.monotonic() + bound
    while _start_time(pid) == started:
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.01)
    return False


def _start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None where
    it is gone or a zombie: with its pid, what tells it from a later one."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in "ZX" else int(fields[19])


def _kill_if_lingering(pid: int, started: int) -> None:
    """Kills a fork server's worker `pid` still there past the exit bound
    (its server, not this process, reaps it)."""
    if _lingers(pid, started, _process_child.EXIT_BOUND_S):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class _Forked:
    """A worker process forked from this process, before a worker thread
    takes it: its pid and this process's end of its socket."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock

    def let_go(self, kill: bool = False) -> None:
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        _reap_soon(self.pid)


class WorkerProcess:
    """One worker process and the socket to it."""

    def __init__(self, workers: ProcessWorkers, worker_id: int, samples: bool) -> None:
        self.worker_id = worker_id
        try:
            self.pid, ours, child = workers.fork_worker()
        except (EOFError, OSError):  # the fork server died: once more, with a new one
            if workers.closed:
                raise
            self.pid, ours, child = workers.fork_worker()
        self.wire = Wire(ours)
        self.owner = os.getpid()
        # The process's ring of sample slots (rust/wire/slots.rs), mapped here.
        self.slots = SlotMap()
        # Whether its samples' payloads stay in their slots for the collate.
        self.keep_leaves = samples and workers.keep_leaves
        # The batch arenas its samples may be written into (a new process
        # has mapped none of them).
        self.arenas = workers.arenas if self.keep_leaves else None
        if self.arenas is not None:
            self.arenas.forget_worker(worker_id)
        # Samples for a user's collate_fn are rebuilt on the collate thread.
        self.defer = samples and not self.keep_leaves
        # Stopped, or collected with its worker thread's runner (the pool
        # shrank): the connection ends and the process leaves; this
        # process's own child is reaped, once (its pid is never signalled
        # after: it may be another's by then).
        self.child = child
        # With its pid, what tells it from a later process (None: gone already).
        self.started = _start_time(self.pid)
        self._let_go = weakref.finalize(
            self, _end, self.wire, self.pid, child, None if child else self.started
        )
        workers.adopt(self)
        identity = _process_child.ProcessIdentity.next_child(workers.start_method)
        _ipc.send(self.wire, (worker_id, samples, identity))
        _ipc.send_payload(self.wire, workers.spec_payload())

    def call(self, message: tuple[Any, ...], limit: float | None) -> Any:
        """Sends a task, with the ring's slots handed back since the last,
        and waits for its answer without the GIL (the engine meanwhile reads
        the process's state to tell a computing sample from a blocked one):
        TimeoutError past `limit`, EOFError/OSError if the process died,
        WireError if it sent something that is not a message."""
        arenas = self.arenas
        if arenas is None:
            payload = _ipc.dumps((*message, self.slots.take_freed(), None, self.defer))
            data, fds = self.wire.call(self.pid, payload.data, payload.fds, limit)
            return _ipc.loads(data, fds, self.slots, self.keep_leaves)
        # Where each sample would go in its batch's arena; `_held` keeps
        # those arenas lent until the answer is read.
        places, _held, announce, forget = arenas.place(self.worker_id, message[1])
        placing = (places, [_ipc.ArenaAnnounce(*arena) for arena in announce], forget)
        try:
            payload = _ipc.dumps((*message, self.slots.take_freed(), placing, False))
        except BaseException:
            arenas.unannounce(self.worker_id, [arena[0] for arena in announce])
            raise
        data, fds = self.wire.call(self.pid, payload.data, payload.fds, limit)
        answer = _ipc.loads(data, fds, self.slots, True, arenas)
        if answer is None:
            return None
        output, leaf_sizes = answer
        if leaf_sizes:
            arenas.offer_layout(leaf_sizes)
        return (output,)

    def stop(self, kill: bool = False) -> None:
        """Ends the connection (the process leaves, its finalizers run first,
        see minato._process.child.leave); `kill` sends SIGKILL first. In a
        fork child the process belongs to the parent: left alone."""
        if os.getpid() != self.owner or not self._let_go.alive:
            return
        if kill:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._let_go()

    def exit_description(self) -> str:
        """How the process ended, as far as can be seen from here: this
        process's own child is reaped here, and its status told as torch
        tells its workers'; the fork server's is seen in /proc only (the
        server is its parent and reaps it). Before the process is stopped."""
        if self.child and os.getpid() == self.owner and self._let_go.alive:
            return self._reaped_description()
        if self.started is not None and _lingers(self.pid, self.started, 1.0):
            return "closed its connection unexpectedly"
        return "exited unexpectedly (killed, or crashed)"

    def _reaped_description(self) -> str:
        try:
            status = _exit_status(self.pid, 1.0)
        except ChildProcessError:  # SIGCHLD ignored: the kernel reaped it
            return "exited unexpectedly (killed, or crashed)"
        if status is None:
            return "closed its connection unexpectedly"
        # Reaped here: never again, nor signalled (its pid may be another's).
        self._let_go.detach()
        self.wire.shutdown()
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            name = signal.strsignal(-code) or f"signal {-code}"
            return f"exited unexpectedly: killed by signal: {name}"
        return f"exited unexpectedly with exit code {code}"


class ProcessWorkers:
    """The worker processes of one engine, and the runners that use them."""

    def __init__(
        self,
        spec: WorkerSpec,
        method: WorkerMethod,
        *,
        collate_fn: Callable[[Any], Any],
        hard_timeout: float | None,
        per_task_switch: bool,
        start_method: str | None = None,
    ) -> None:
        self.spec = spec
        self.method = method
        # The loader's multiprocessing_context's, which its worker processes
        # see as theirs (None: multiprocessing's default).
        self.start_method = start_method
        # The user's collate: a pinned batch cannot be shared between processes.
        self.child_spec = dataclasses.replace(
            spec, collate_fn=collate_fn, take_stream_skip=_no_stream_skip
        )
        self.hard_timeout = hard_timeout
        # Set when the loader's collate stacks samples' payloads from their
        # slots (minato._loader.collate): they arrive as SlotLeafs.
        self.keep_leaves = False
        # Set when samples may also be written into their places in their
        # batches (rust/wire/arena.rs).
        self.arenas: ArenaPool | None = None
        # Whether a map-style loader may move between tasks (otherwise an
        # IterableDataset's worker moves at its epoch's start, a loader that
        # deals in turn when its workers start).
        self.per_task_switch = per_task_switch
        self._lock = threading.Lock()
        self._payload: _ipc.Payload | None = None
        self._modules: list[str] | None = None
        # Set once `prepare` began; then the modules the spec's pickle names
        # once it is pickled, or why it cannot be. (Not under `_lock`, which
        # the pickling holds: the training thread waits for it only within
        # a bound, see `wait_prepared`.)
        self._preparing = False
        self._prepared: list[str] | None = None
        self._prepare_done = threading.Event()
        self.unpicklable: str | None = None
        # Where the engine's worker processes come from, where not from this
        # process's fork server: "inherit", from this process as it is,
        # holding the spec (forked directly, or from a server of its own
        # forked holding it: see `inherit_spec`); "fresh", a fresh
        # interpreter of its own (see `start_fresh`).
        self.own_server: str | None = None
        self.own_zygote: _Zygote | None = None
        # Whether its worker processes are forked from this process, not a
        # fork server (see `inherit_spec`), and those forked as the engine
        # started, not yet taken by a worker thread.
        self.direct = False
        self._spares: list[_Forked] = []
        self._processes: weakref.WeakSet[WorkerProcess] = weakref.WeakSet()
        self.closed = False
        _live.add(self)

    @property
    def forced(self) -> bool:
        """Whether each worker runs on its process from its start, never on
        its thread: worker_method="multiprocessing", or auto's decision for
        an earlier loader of the dataset's type."""
        method = self.method
        return method.processes and (method.requested == "multiprocessing" or method.decided_before)

    def spec_payload(self) -> _ipc.Payload:
        """The spec, pickled once for every process this engine starts."""
        with self._lock:
            if self._payload is None:
                try:
                    # Arrays go as references only to the fork server's memory.
                    payload = _ipc.dumps(self.child_spec, inherit=self.own_server != "fresh")
                except Exception as error:
                    error.add_note(
                        "(minato: worker processes started from a fresh interpreter "
                        "(MINATO_FORK_SERVER=exec) get the dataset, collate_fn and "
                        "worker_init_fn pickled; this one cannot be: leave the fork "
                        'server forked, or use worker_method="thread")'
                    )
                    raise
                # Read before a large pickle goes to shared memory.
                self._modules = _ipc.modules_named(payload)
                self._payload = _ipc.spill(payload)
                # What the pickling copied and freed (a pandas column of
                # pyarrow's), on this thread, which freed it.
                give_back_arrow_memory()
            return self._payload

    def inherit_spec(self, count: int) -> None:
        """Where the fork server is forked (not a fresh interpreter): the
        engine's `count` worker processes start from this process as it is
        now, as torch forks its workers as each epoch starts: they see the
        module globals and process settings the training process has now,
        and take the spec from their memory, unpickled (its open files,
        locks and multiprocessing objects included). For forced worker
        processes, as their engine starts on the training thread.

        Up to `FORKED_DIRECTLY` workers are forked from this process now,
        from the calling thread, and share its pages as torch's do; each
        worker thread takes one as it starts, and a later one (the pool
        grew, a process died) is forked from this process then, by its
        thread. More are forked from a fork server of the engine's own,
        forked now holding the spec: this thread forks once, not once per
        worker, and the server forks the workers while the first ones load."""
        if exec_server_wanted():
            return
        self.own_server = "inherit"
        with self._lock:
            self._payload = _ipc.dumps(_process_child.InheritedSpec())
            self._modules = []  # forked from this process: imported here
        if count > FORKED_DIRECTLY:
            self.zygote()
            return
        self.direct = True
        for _ in range(count):
            spare = self._fork_directly()
            with self._lock:
                if self.closed:
                    spare.let_go(kill=True)
                    return
                self._spares.append(spare)

    def _fork_directly(self) -> _Forked:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = _fork_worker(theirs, ours, self.child_spec)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return _Forked(pid, ours)

    def fork_worker(self) -> tuple[int, socket.socket, bool]:
        """A new worker process: its pid, this process's end of its socket,
        and whether it is this process's child (to be reaped here), not the
        fork server's."""
        if self.direct:
            with self._lock:
                if self.closed:
                    raise EOFError("the loader's worker processes were stopped")
                spare = self._spares.pop(0) if self._spares else None
            if spare is None:
                spare = self._fork_directly()
            return spare.pid, spare.sock, True
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            zygote = self.zygote()
            zygote.preload(self.modules())
            return zygote.fork(theirs), ours, False
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()

    def start_fresh(self) -> None:
        """Has this engine's worker processes start from a fresh interpreter
        of its own (fork+exec, importing torch, minato and the spec's
        modules), never forked from this process: what torch's "spawn" and
        "forkserver" contexts give theirs (a CUDA context this process made
        is none of theirs). Started now, in the background; the spec is
        pickled (a spec that cannot be raises, as torch's would)."""
        self.own_server = "fresh"
        self.zygote()

    def zygote(self) -> _Zygote:
        """The fork server this engine's worker processes come from: its own
        (started now where it has none, or it died), or this process's."""
        if self.own_server is None:
            return _zygote_now()
        with _zygote_lock:
            if self.closed:
                raise EOFError("the loader's worker processes were stopped")
            own = self.own_zygote
            if own is None or own.process.poll() is not None:
                if self.own_server == "fresh":
                    own = _Zygote(fresh=True)
                else:
                    own = _Zygote(inheriting=self.child_spec)
                self.own_zygote = own
            return own

    def modules(self) -> list[str]:
        """The modules the spec's pickle imports from (see _ipc.modules_named)."""
        self.spec_payload()
        assert self._modules is not None
        return self._modules

    def check_picklable(self) -> str | None:
        """Why the spec cannot go to a worker process, or None."""
        try:
            self.spec_payload()
        except Exception as error:  # pickling raises many types
            return f"the dataset or a function it needs cannot be pickled ({error})"
        return None

    def prepare(self) -> None:
        """Pickles the spec, then has the running fork server import the
        modules it names, on a thread of its own (once): the training
        loop's thread, which forks the server, goes on meanwhile (see
        `prepared`)."""
        if self._preparing:  # only ever called from the training thread
            return
        self._preparing = True
        threading.Thread(target=self._prepare, name="minato worker spec", daemon=True).start()

    def _prepare(self) -> None:
        try:
            why = self.check_picklable()
            if why is not None:
                self.unpicklable = why
                return
            modules = self.modules()
            zygote = _the_zygote
            if _zygote_running() and zygote is not None:  # never forked from this thread
                warm_up(modules)
                # Imported before this returns, so that `wait_prepared` finds
                # the server ready for the workers too (a second request for
                # them does nothing).
                with contextlib.suppress(Exception):  # reported when a worker process starts
                    zygote.preload(modules)
            self._prepared = modules
        finally:
            self._prepare_done.set()

    def prepared(self) -> list[str] | None:
        """The modules the spec's pickle names, once `prepare` pickled it
        (None before, and where it cannot be: see `unpicklable`)."""
        self.prepare()
        return self._prepared

    def wait_prepared(self, timeout: float) -> list[str] | None:
        """`prepared`, after waiting up to `timeout` seconds for the spec's
        pickle and the server's imports."""
        self.prepare()
        self._prepare_done.wait(timeout)
        return self._prepared

    def adopt(self, process: WorkerProcess) -> None:
        with self._lock:
            self._processes.add(process)
            closed = self.closed
        if closed:
            process.stop(kill=True)

    def close(self) -> None:
        """Stops every worker process (the engine has stopped)."""
        with self._lock:
            self.closed = True
            processes = list(self._processes)
            spares, self._spares = self._spares, []
            self._payload = None
            own, self.own_zygote = self.own_zygote, None
        for spare in spares:
            spare.let_go(kill=True)
        for process in processes:
            # As torch's workers are stopped: they leave, flushing what the
            # dataset put on its queues, and are killed past the bound.
            process.stop()
        if own is not None:
            # It leaves once the workers it forked have.
            _stop_server(own, aside=True)

    def runner(
        self, worker_id: int, samples: bool, thread_run: Callable[[int, Any], Any] | None
    ) -> Callable[[int, Any], Any]:
        """A worker thread's `run`: its process's, or its own (`thread_run`)
        while the loader is on threads."""
        remote = _Remote(self, worker_id, samples)
        if thread_run is None:
            # Forced processes: started here, as the worker thread starts,
            # not by its first task, whose time would then include the
            # start (and the fork server's, at first) and make its sample
            # look late (see minato._task.seed). A start that fails is
            # tried again, and reported, by that task.
            with contextlib.suppress(Exception):
                remote.start()
            return remote.run
        method = self.method
        if not self.per_task_switch and not self.spec.is_iterable:
            # Deals in turn: the method is fixed for the workers' life.
            return remote.run if method.processes else thread_run
        epoch_on_processes: dict[int, bool] = {}

        def run(epoch: int, task: Any) -> Any:
            if self.per_task_switch:
                on_processes = method.processes
                # Moving: the process starts beside this thread, which runs
                # its tasks itself until the process is up (no task waits
                # for a start); where the GIL runs the threads one at a time,
                # in this task (see WorkerMethod.threads_serialised).
                if on_processes and not method.threads_serialised and not remote.start_beside():
                    return thread_run(epoch, task)
            else:  # a stream moves at its epoch's start only
                on_processes = epoch_on_processes.setdefault(epoch, method.processes)
                if len(epoch_on_processes) > 2:
                    epoch_on_processes.pop(min(epoch_on_processes))
            if on_processes:
                return remote.run(epoch, task)
            remote.stop()  # back on threads (auto's trial): its process goes
            return thread_run(epoch, task)

        return run


_live: weakref.WeakSet[ProcessWorkers] = weakref.WeakSet()


def stop_all() -> None:
    """At interpreter exit: every worker process goes, and the fork server
    (waited for, so that no child outlives the loader's process and Python
    does not warn of a subprocess still running)."""
    for workers in list(_live):
        workers.close()
    _stop_fork_server()


def release_fork_server() -> bool:
    """Stops the fork server once no live loader may take worker processes
    from it (auto decided threads for every one, or each forks its own as
    its engines start, see WorkerMethod.forks_at_start): forked from this
    process, it
    comes to hold its own copy of every page this process writes after the
    fork (at 8 PIL workers on threads its PSS read 244 MB at the epoch's
    end: benchmarks/RESULTS.md). A later loader that may use processes
    starts it again. Not while a worker process it forked lives (a loader
    whose trial went back to threads stops its own as its workers go on,
    and asks again, see `_ThreadDataLoaderIter`): while the server is their
    parent, the kernel reaps them as they exit (it ignores SIGCHLD);
    orphaned, they would be left to this machine's init. Returns whether
    this process has no fork server left."""
    if WorkerMethod.any_may_use_processes():
        return False
    processes_live = True
    with contextlib.suppress(RuntimeError):  # a set changed while read: keep it
        processes_live = any(
            len(workers._processes) for workers in list(_live) if workers.own_server is None
        )
    if processes_live or _server_has_children():
        return False
    # Killed: on the training loop's thread, it must not wait for an
    # import the server may be in.
    _stop_fork_server(kill=True)
    return True


# What this process may let go of the memory it shared with the fork server
# (a CPU model moved to the GPU, a checkpoint dropped, after the loader was
# built) before the server, which keeps its own copy of it, is forked again:
# torch's workers, forked as each epoch starts, never hold such pages.
STALE_SERVER_BYTES = 16 << 20


def _anonymous_resident() -> int | None:
    """This process's anonymous resident bytes (``RssAnon``: a counter the
    kernel keeps, read without walking the page tables, and in Rust with the
    GIL kept: auto forks the server beside worker threads that hold it)."""
    return _own_status_bytes("RssAnon")


def _minor_faults() -> int:
    """This process's minor page faults so far: each page it touched anew
    or copied from one it shared."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _server_stale() -> bool:
    """Whether this process's forked fork server holds at least
    `STALE_SERVER_BYTES` of pages this process has let go or written since
    the fork, and no live loader may still start a worker process from it
    (one that may would race its replacement).

    Read cheaply first: anonymous memory this process holds beyond what it
    held at the fork is all new, so the fall of its ``RssAnon`` since is at
    most what it let go. Otherwise the server's own pages are read (a walk
    of its page tables, benchmarks/RESULTS.md) only where this
    process has faulted in that many pages since the last look (each page
    it wrote in place, each page made anew to stand where freed ones were)
    and the server has no worker left (one still exiting shares its pages,
    and its own would read short)."""
    with contextlib.suppress(RuntimeError):  # a set changed while read: not now
        if any(not workers.closed for workers in list(_live)):
            return False
        zygote = _the_zygote
        if zygote is None or not isinstance(zygote.process, _ForkedServer):
            return False
        server = zygote.process
        then, now = server.anonymous_at_fork, _anonymous_resident()
        if then is not None and now is not None and then - now >= STALE_SERVER_BYTES:
            return True
        faults = _minor_faults()
        if (faults - server.faults_at_look) * mmap.PAGESIZE < STALE_SERVER_BYTES:
            return False
        if _server_has_children():
            return False
        server.faults_at_look = faults
        own = _private_dirty_bytes(server.pid)
        return own is not None and own >= STALE_SERVER_BYTES
    return False


def _server_has_children() -> bool:
    """Whether this process's fork server still has a child: a worker
    process stopped (its connection ended) may take a moment to exit.
    Where Linux does not list children, the loaders' live processes alone
    decide."""
    zygote = _the_zygote
    if zygote is None or zygote.pid != os.getpid():
        return False
    server = zygote.process.pid
    try:
        with open(f"/proc/{server}/task/{server}/children") as children:
            return bool(children.read().split())
    except OSError:
        return False


def _stop_fork_server(kill: bool = False, aside: bool = False) -> None:
    """Stops this process's fork server: waited for (up to a second, then
    killed), or, with `kill` or `aside`, reaped on a thread of its own.
    Unless killed, it leaves once its last worker process has exited (none
    is orphaned to this machine's init)."""
    global _the_zygote, _warming_in
    with _zygote_lock:
        zygote, _the_zygote = _the_zygote, None
    with _zygote_start_lock:
        _warming_in = None  # a later warm-up imports the modules again
    if zygote is not None:
        _stop_server(zygote, kill, aside)


def _stop_server(zygote: _Zygote, kill: bool = False, aside: bool = False) -> None:
    """Stops `zygote` (see `_stop_fork_server`), if this process started it."""
    if zygote.pid != os.getpid():
        return
    # Shut down first: a warm-up thread waiting on the socket wakes.
    with contextlib.suppress(OSError):
        zygote.sock.shutdown(socket.SHUT_RDWR)
    zygote.sock.close()  # the fork server exits when its socket closes
    if kill:
        zygote.process.kill()
    if kill or aside:
        # Its exit tears down an address space as large as this process's:
        # tens of milliseconds on busy cores, which the calling thread (the
        # training loop's) waited for (benchmarks/RESULTS.md, session 30).
        # Reaped on a thread started without waiting for it to run, as
        # ``threading.Thread.start`` would (the GIL handed over, and back).
        try:
            _thread.start_new_thread(_reap, (zygote.process,))
            return
        except RuntimeError:  # no thread to be had: waited for here, as before
            pass
    try:
        zygote.process.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        zygote.process.kill()
        zygote.process.wait()


def _reap(process: _ForkedServer | subprocess.Popen) -> None:
    with contextlib.suppress(Exception):  # reaped elsewhere
        process.wait()


class _Remote:
    """A worker thread's side of its worker process."""

    def __init__(self, workers: ProcessWorkers, worker_id: int, samples: bool) -> None:
        self.workers = workers
        self.worker_id = worker_id
        self.samples = samples
        self.process: WorkerProcess | None = None
        self.epoch: int | None = None
        self.stream_lost: int | None = None
        # A start beside the worker thread (see start_beside): under way, or
        # failed (the next task then starts it, and reports the failure).
        self._starting: threading.Thread | None = None
        self._start_failed = False

    def stop(self) -> None:
        """Its process, if it has one, leaves (its last task has returned)."""
        process, self.process = self.process, None
        if process is not None:
            process.stop()

    def start(self) -> None:
        """Starts its process now, if it has none."""
        self._process()

    def start_beside(self) -> bool:
        """Whether its process is up to take the next task; if not, starts it
        on a thread of its own, once."""
        if self.process is not None or self._start_failed:
            return True
        if self._starting is None:
            self._starting = threading.Thread(
                target=self._start_beside, name="minato-process-start", daemon=True
            )
            self._starting.start()
        return False

    def _start_beside(self) -> None:
        try:
            process = WorkerProcess(self.workers, self.worker_id, self.samples)
        except Exception:  # the next task starts it again, and reports
            self._start_failed = True
        else:
            if self.workers.method.processes:
                self.process = process
            else:  # back on threads meanwhile
                process.stop()
        self._starting = None

    def _process(self) -> WorkerProcess:
        if self.process is None:
            self.process = WorkerProcess(self.workers, self.worker_id, self.samples)
        return self.process

    def run(self, epoch: int, task: Any) -> Any:
        spec = self.workers.spec
        skip = None
        if spec.is_iterable and epoch != self.epoch:
            self.epoch = epoch
            skip = spec.take_stream_skip(self.worker_id)
        if spec.is_iterable and self.stream_lost == epoch:
            return EXHAUSTED  # its process died: this epoch's stream is gone
        count = len(task) if self.samples else 1
        limit = self.workers.hard_timeout
        try:
            process = self._process()
            answer = process.call((epoch, task, skip), None if limit is None else limit * count)
        except TimeoutError:
            assert self.process is not None
            return self._lost(epoch, task, "timed out")
        except WireError as error:  # before OSError, which it is
            assert self.process is not None
            return self._lost(epoch, task, f"sent a malformed message ({error}) and was stopped")
        except (EOFError, OSError) as error:
            if self.process is None:
                raise
            return self._lost(epoch, task, "died", f"{error}")
        return EXHAUSTED if answer is None else answer[0]

    def _lost(self, epoch: int, task: Any, how: str, seen: str = "") -> Any:
        """The process is gone, killed past the hard limit, dead, or stopped
        for a malformed message (`how` says which): its task fails (a run
        of samples is re-run one by one first), and the next task starts a
        new process."""
        process = self.process
        assert process is not None
        self.process = None
        # How it died, read before it is stopped (and reaped).
        died = process.exit_description() if how == "died" else ""
        process.stop(kill=True)
        if self.samples and len(task) > 1:
            return [sample for item in task for sample in self.run(epoch, [item])]
        if self.workers.spec.is_iterable:
            self.stream_lost = epoch
        where = f"DataLoader worker process {self.worker_id} (pid {process.pid})"
        if how == "timed out":
            message = (
                f"{where} was killed: its task ran past sample_hard_timeout="
                f"{self.workers.hard_timeout}s per sample"
            )
        elif how == "died":
            message = f"{where} {died}: {seen}"
        else:
            message = f"{where} {how}"
        return self._failed(task, message)

    def _failed(self, task: Any, message: str) -> Any:
        spec = self.workers.spec
        error = RuntimeError(message)
        if self.samples:
            failed = []
            for tag, index, _ in task:
                if spec.skip_errors:
                    failure = SampleFailure(index, self.worker_id, "RuntimeError", message)
                    failed.append(Skipped(tag, failure))
                else:
                    failed.append((tag, self._wrapper(error, index)))
            return failed
        tag, index = (self.worker_id, None) if spec.is_iterable else task[:2]
        if spec.skip_errors:
            indices = index if spec.auto_collation and index is not None else [index]
            failures = [SampleFailure(i, self.worker_id, "RuntimeError", message) for i in indices]
            return tag, (0, NOTHING_LOADED, failures)
        return tag, self._wrapper(error, index)

    def _wrapper(self, error: RuntimeError, index: Any) -> ExceptionWrapper:
        noun = "sample indices" if isinstance(index, list) else "sample index"
        what = "" if index is None else f" ({noun} {index})"
        return WorkerError(
            exc_info=(RuntimeError, error, None),
            where=f"in DataLoader worker process {self.worker_id}{what}",
        )
