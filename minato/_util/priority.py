"""Worker processes yield the CPU to the training loop: their nice value.

A training step's CPU side (Python, op dispatch, kernel launches) is what
keeps the GPU fed; workers only need to stay ahead of it. Where workers
fill the cores, torch's worker processes share them equally with the
loop, whose steps then run slower (benchmarks/neighbour.py measured
1.02-1.11x with two of torch's workers on two cores). minato's worker
processes run ``worker_nice`` (10 by default) above the loader's process's
nice value: when both want a core the kernel runs the loop first, and the
workers still get every cycle it leaves, so data alone loads as fast.

Worker threads keep the loop's priority: they share its GIL, and a thread
that holds it at a lower priority can be preempted by any other program
while the loop waits for the GIL (measured beside two busy processes: with
niced threads, auto moved a sleeping dataset to processes in 4 runs of 6,
its loop having waited 0.16-3.1 ms a GIL re-take; 1 of 6 without).
Without privilege a nice value cannot be lowered back, so each worker
process is set once, to the loader's process's value plus ``worker_nice``
(capped at 19, the lowest priority).
"""

from __future__ import annotations

import os

DEFAULT_WORKER_NICE = 10
LOWEST_PRIORITY = 19


def check_worker_nice(worker_nice: object) -> None:
    if isinstance(worker_nice, bool) or not isinstance(worker_nice, int):
        raise TypeError(f"worker_nice should be an integer, but got {worker_nice!r}")
    if not 0 <= worker_nice <= LOWEST_PRIORITY:
        raise ValueError(
            f"worker_nice option should be between 0 and {LOWEST_PRIORITY}, "
            f"but got worker_nice={worker_nice}"
        )


def worker_nice_value(worker_nice: int) -> int | None:
    """The nice value the loader's worker processes run at: this process's
    plus `worker_nice`; None to leave them as they are."""
    if worker_nice == 0 or not hasattr(os, "getpriority"):
        return None
    # The process's value is its main thread's (Linux keeps one per thread).
    return min(LOWEST_PRIORITY, os.getpriority(os.PRIO_PROCESS, os.getpid()) + worker_nice)


def lower_process_priority(nice: int | None) -> None:
    """Runs the calling worker process's main thread, and the threads it
    starts after, at `nice` (never raised)."""
    if nice is None or not hasattr(os, "setpriority"):
        return
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) < nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:  # a sandbox that forbids it: the worker keeps its priority
        pass
