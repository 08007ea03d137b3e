"""The worker-process wire (rust/wire/, minato._minato.Wire): a worker
process that sends a malformed or truncated frame, or dies mid-frame, fails
its task with an error naming what arrived; the failure policy applies, and
the loader neither crashes nor hangs."""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading

import pytest
from torch.utils.data import Dataset, get_worker_info

import minato
from minato._minato import Wire, WireError

pytestmark = pytest.mark.timeout(120)

# The wire's header: magic, descriptor count, payload length (rust/wire/frame.rs).
_HEADER = struct.Struct("<4sIQ")


class BreaksTheWire(Dataset):
    """Sample 5, loaded in a worker process, writes `how` on the process's
    connection to the loader: garbage, or the start of a frame it then
    leaves unfinished (exiting, or killed)."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> int:
        if index == 5 and get_worker_info() is not None:
            from minato._process import child

            assert child.connection is not None
            fd = child.connection.fileno()
            if self.how == "garbage":
                os.write(fd, b"this is not a frame, not at all")
            else:
                os.write(fd, _HEADER.pack(b"MNW1", 0, 1000) + b"0123456789")
                if self.how == "exits mid-frame":
                    os._exit(0)
                os.kill(os.getpid(), signal.SIGKILL)
        return index


_ERRORS = {
    "garbage": r"sent a malformed message \(a message that is not a minato frame",
    "exits mid-frame": r"closed the socket mid-message \(26 of 1016 bytes\)",
    "killed mid-frame": r"closed the socket mid-message \(26 of 1016 bytes\)",
}


@pytest.mark.parametrize("how", list(_ERRORS))
@pytest.mark.parametrize("in_order", [True, None])
def test_a_broken_frame_fails_its_sample_and_leaves_the_epoch_whole(
    how: str, in_order: bool | None
) -> None:
    loader = minato.DataLoader(
        BreaksTheWire(how),
        batch_size=4,
        num_workers=2,
        worker_method="multiprocessing",
        in_order=in_order,
    )
    with pytest.raises(RuntimeError, match=_ERRORS[how]):
        list(loader)
    skipping = minato.DataLoader(
        BreaksTheWire(how),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        worker_method="multiprocessing",
        on_error="skip",
        in_order=in_order,
    )
    for _epoch in range(2):  # a new process takes over, for the next epoch too
        seen = len(skipping.stats().failures)
        delivered = [int(i) for batch in skipping for i in batch]
        failed = [failure.index for failure in skipping.stats().failures[seen:]]
        # Every sample once, delivered or reported: sample 5's alone where
        # samples go one by one (whole batches fail together).
        assert sorted(delivered + failed) == list(range(24))
        assert 5 in failed and (in_order or failed == [5])


def _pair() -> tuple[Wire, Wire]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return Wire(ours), Wire(theirs)


def test_frames_and_their_descriptors_cross_a_wire() -> None:
    ours, theirs = _pair()
    reader, writer = os.pipe()
    try:
        ours.send(b"payload", [writer])
        data, fds = theirs.receive(timeout=10)
        assert data == b"payload" and len(fds) == 1
        os.write(fds[0], b"!")
        os.close(fds[0])
        assert os.read(reader, 1) == b"!"
    finally:
        os.close(reader)
        os.close(writer)
    big = bytes(range(256)) * 40_000  # more than the socket holds: sent as it is read
    sender = threading.Thread(target=ours.send, args=(big, []))
    sender.start()
    assert theirs.receive(timeout=60)[0] == big
    sender.join()


def test_each_wire_failure_is_its_documented_error() -> None:
    ours, theirs = _pair()
    with pytest.raises(TimeoutError):
        theirs.receive(timeout=0.01)
    os.write(ours.fileno(), b"GARBAGE GARBAGE!")
    with pytest.raises(WireError, match="not a minato frame"):
        theirs.receive(timeout=10)
    assert issubclass(WireError, ConnectionError)
    ours, theirs = _pair()
    os.write(ours.fileno(), _HEADER.pack(b"MNW1", 0, 100) + b"abc")
    ours.shutdown()
    with pytest.raises(EOFError, match="mid-message"):
        theirs.receive(timeout=60)
    ours, theirs = _pair()
    os.write(ours.fileno(), _HEADER.pack(b"MNW1", 3, 0))
    with pytest.raises(WireError, match="announcing 3 file descriptors came with 0"):
        theirs.receive(timeout=10)
    ours, theirs = _pair()
    os.write(ours.fileno(), _HEADER.pack(b"MNW1", 0, 1 << 60))
    with pytest.raises(WireError, match="payload of"):
        theirs.receive(timeout=10)
    ours.shutdown()
    with pytest.raises(EOFError):
        theirs.receive(timeout=60)


def test_a_wire_takes_its_socket_over() -> None:
    sock, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    wire = Wire(sock)
    assert sock.fileno() == -1  # detached: the wire owns the descriptor
    with pytest.raises(ValueError, match="closed"):
        Wire(sock)
    other.close()
    with pytest.raises(EOFError):
        wire.receive(timeout=60)
