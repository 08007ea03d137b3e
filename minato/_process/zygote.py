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

Forced worker processes are forked from the training process as their
engine starts (minato._process.workers); beyond a couple, from a server of
their engine's own, forked then holding their spec
(minato._process.child.inherited_spec), which its workers take from there.

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
from typing import NoReturn

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
            _process_child.run(fds[0])
        os.close(fds[0])
        control.sendall(PID.pack(pid))
