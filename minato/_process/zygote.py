"""minato's fork server: the process worker processes are forked from.

The zygote is forked from the loader's process when first wanted (see
minato._process.workers), as torch forks its workers from it (sharing
its pages), or, with ``MINATO_FORK_SERVER=exec``, a fresh interpreter
started by fork+exec that imports torch and minato once (see
minato._process.workers). Either way it is single-threaded, and forks one
worker process per request. It never runs the user's ``__main__`` again
(which, without an ``if __name__ == "__main__"`` guard, would run the
training script again in every worker): the worker's spec is pickled with
cloudpickle, which sends what ``__main__`` defines by value.

Protocol, over a Unix socket: the loader sends a request with one file
descriptor (the worker's end of its own socket); the zygote forks, the
child runs ``minato._process.child.main`` on it, and the zygote answers
the child's pid. The zygote leaves when the loader's end closes, once its
workers still exiting are gone (so that none is orphaned to init).

An engine of forced worker processes forks a zygote of its own as it
starts, holding its spec (``inherited_spec``), as torch forks its workers
at ``iter()``; its workers take the spec from there, never pickled.

A loader also sends the modules its dataset's pickle names (torchvision's
transforms, the user's own package...), once: the zygote imports them, so
that its workers start with them imported instead of each importing them
again when it unpickles the dataset (a second or more with torchvision).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import struct
import sys
from typing import Any, NoReturn

# A worker spec that could not be pickled (its dataset holds an open file,
# a lock, a generator, a multiprocessing object made in the 'fork' context):
# a fork server of the loader's own was forked holding it, as torch's workers
# forked at ``iter()`` hold the dataset, and its workers take it from here.
inherited_spec: Any = None


def _inherited() -> Any:
    if inherited_spec is None:
        raise RuntimeError("minato: this worker process holds no inherited spec")
    return inherited_spec


class InheritedSpec:
    """Pickles as a reference to the spec the receiving process inherited."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _inherited, ()


# The zygote's answer to a request: the worker's pid.
PID = struct.Struct("<q")
# A request to import modules: b"i", then the length of their JSON list.
LENGTH = struct.Struct("<I")


def _leave() -> NoReturn:
    """Exits once every worker forked here has: with SIGCHLD ignored, the
    kernel reaps them, and ``wait`` returns when none is left."""
    with contextlib.suppress(ChildProcessError):
        while True:
            os.wait()
    os._exit(0)


def _recv_exactly(control: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = control.recv(size - len(data))
        if not more:
            _leave()
        data += more
    return data


def _import_all(names: list[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException:  # the worker imports it, or reports why it cannot
            pass


def serve(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the loader handles Ctrl-C
    # Exited workers are reaped by the kernel: none lingers as a zombie.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    control = socket.socket(fileno=fd)
    from minato._process import child as _process_child

    try:
        control.sendall(b"r")  # ready: torch and minato are imported
    except OSError:  # the loader went while a fresh interpreter started
        _leave()
    while True:
        try:
            request, fds, _, _ = socket.recv_fds(control, 1, 1)
        except OSError:
            _leave()
        if request == b"i":
            (size,) = LENGTH.unpack(_recv_exactly(control, LENGTH.size))
            _import_all(json.loads(_recv_exactly(control, size)))
            control.sendall(b"k")
            continue
        if not fds:  # the loader's end closed
            _leave()
        pid = os.fork()
        if pid == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 0
            try:
                _process_child.main(socket.socket(fileno=fds[0]))
            except BaseException:
                code = 1
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(fds[0])
        control.sendall(PID.pack(pid))
