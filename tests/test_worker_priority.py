"""Worker processes yield the CPU to the training loop (worker_nice): they
run at the loader's process's nice value plus worker_nice; worker threads,
which share the loop's GIL, and the loop keep theirs; the data is torch's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.utils.data as tud
from torch.utils.data import Dataset

import minato

pytestmark = [
    pytest.mark.timeout(120),
    # The thread ids read here are Linux's.
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's"),
]


def _own_nice() -> int:
    """The calling thread's nice value (Linux keeps one per thread)."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


class Nice(Dataset):
    """Each sample: its index, and the nice value of the thread that loaded it."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, _own_nice()


def _loaded(**kwargs) -> tuple[list[int], set[int]]:
    loader = minato.DataLoader(Nice(), batch_size=4, shuffle=True, num_workers=2, **kwargs)
    indices, nices = [], set()
    for index, nice in loader:
        indices += index.tolist()
        nices |= set(nice.tolist())
    return sorted(indices), nices


def test_worker_processes_run_worker_nice_above_the_loop() -> None:
    base = _own_nice()
    indices, nices = _loaded(worker_method="multiprocessing")
    assert indices == list(range(24))
    assert nices == {min(19, base + 10)}
    assert _own_nice() == base, "the training loop's thread keeps its priority"


def test_worker_threads_keep_the_loops_priority() -> None:
    # A thread holding the loop's GIL at a lower priority would make the
    # loop wait whenever another program preempted it.
    base = _own_nice()
    indices, nices = _loaded(worker_method="thread")
    assert indices == list(range(24))
    assert nices == {base}


def test_worker_nice_sets_the_increment_and_zero_leaves_workers_as_torch_does() -> None:
    base = _own_nice()
    assert _loaded(worker_method="multiprocessing", worker_nice=3)[1] == {min(19, base + 3)}
    assert _loaded(worker_method="multiprocessing", worker_nice=0)[1] == {base}
    # torch's workers: the loop's priority.
    torch_loader = tud.DataLoader(Nice(), batch_size=4, num_workers=2)
    assert {n for _, nice in torch_loader for n in nice.tolist()} == {base}


def test_the_same_data_as_torch_whatever_the_priority() -> None:
    def batches(loader: tud.DataLoader) -> list[list[int]]:
        return [index.tolist() for index, _ in loader]

    torch.manual_seed(5)
    theirs = batches(tud.DataLoader(Nice(), batch_size=4, shuffle=True, num_workers=2))
    torch.manual_seed(5)
    ours = batches(
        minato.DataLoader(Nice(), batch_size=4, shuffle=True, num_workers=2, in_order=True)
    )
    assert ours == theirs


def test_a_niced_process_caps_its_workers_at_the_lowest_priority(tmp_path: Path) -> None:
    # nice is relative to the loader's process, and never past 19.
    script = textwrap.dedent("""
        import os, threading
        import minato
        from torch.utils.data import Dataset

        class Nice(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, i):
                return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

        os.nice(15)
        for method in ("thread", "multiprocessing"):
            loader = minato.DataLoader(Nice(), batch_size=4, num_workers=2, worker_method=method)
            print(method, sorted({int(n) for batch in loader for n in batch}))
        """)
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=100
    )
    assert run.returncode == 0, run.stderr
    niced = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 15)
    assert run.stdout.splitlines() == [
        f"thread [{niced}]",
        f"multiprocessing [{min(19, niced + 10)}]",
    ]


@pytest.mark.parametrize(
    "value,error",
    [(-1, ValueError), (20, ValueError), (2.0, TypeError), (True, TypeError), ("5", TypeError)],
)
def test_invalid_worker_nice_is_refused(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="worker_nice"):
        minato.DataLoader(Nice(), num_workers=2, worker_nice=value)
