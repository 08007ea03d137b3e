"""Running the multi-process scripts of tests/ddp from a test: a free port, a
timeout, and a check that no process of the run outlives it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# What a launcher sets for its ranks: a run must not inherit a stale one.
LAUNCHER_VARS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
}


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what a launcher or Lightning set
    (a test may have run seed_everything), plus one thread per process: two
    ranks share two cores."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PL_", "TORCHELASTIC_")) and key not in LAUNCHER_VARS
    }
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **extra}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a foreign process reused the id
        return False
    return True


def run(
    args: Sequence[str], *, env: dict[str, str], timeout: float = 90.0
) -> subprocess.CompletedProcess[str]:
    """Runs `args` in its own process group; fails (after killing the group) when
    it runs past `timeout` or leaves a process behind once it exited."""
    proc = subprocess.Popen(
        list(args),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Its own group: ranks a launcher started can be found, and killed, together.
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{' '.join(args)} ran past {timeout} s:\n{output}") from None
    # The launcher exited: its ranks must have too (allow them a moment to be reaped).
    deadline = time.monotonic() + 10.0
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"{' '.join(args)} left processes behind:\n{output}")
    return subprocess.CompletedProcess(list(args), proc.returncode, output, None)


# torch's gloo process group can abort a process at interpreter exit: one of
# its threads frees a finished collective's tensors, needs the GIL for that
# while Python finalizes, and is unwound through C++ code (torch 2.15; seen
# with torch's own DataLoader too, in about one run of 100 even after
# destroy_process_group). Not minato's doing: such a run is tried again.
GLOO_EXIT_ABORT = "terminate called without an active exception"


def torchrun(port: int, script: Path, *args: str) -> list[str]:
    """A two-process torchrun job of `script` on `port`."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        str(script),
        *args,
    ]


def run_with_port(
    make_args: Callable[[int], Sequence[str]],
    *,
    timeout: float = 90.0,
    attempts: int = 2,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """`run(make_args(port))` with MASTER_PORT=port. Tried again (on a new
    port) when the port was taken in between (another run on the machine) or
    when gloo aborted the process at exit."""
    for attempt in range(attempts):
        port = free_port()
        result = run(make_args(port), env=clean_env(MASTER_PORT=str(port), **env), timeout=timeout)
        output = result.stdout
        taken = "address already in use" in output.lower() or "EADDRINUSE" in output
        if result.returncode == 0 or attempt == attempts - 1:
            return result
        if not (taken or GLOO_EXIT_ABORT in output):
            return result
    raise AssertionError("unreachable")
