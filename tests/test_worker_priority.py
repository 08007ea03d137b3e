"""Workers yield the CPU to the training loop (worker_nice): threads and
processes run at the loader's process's nice value plus worker_nice, the
loop's thread keeps its own, and the data is torch's."""

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
from minato import _worker_priority

pytestmark = [
    pytest.mark.timeout(120),
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


@pytest.mark.parametrize("method", ["thread", "multiprocessing"])
def test_workers_run_worker_nice_above_the_loop(method: str) -> None:
    base = _own_nice()
    indices, nices = _loaded(worker_method=method)
    assert indices == list(range(24))
    assert nices == {min(19, base + 10)}
    assert _own_nice() == base, "the training loop's thread keeps its priority"


@pytest.mark.parametrize("method", ["thread", "multiprocessing"])
def test_worker_nice_sets_the_increment_and_zero_leaves_workers_as_torch_does(method: str) -> None:
    base = _own_nice()
    assert _loaded(worker_method=method, worker_nice=3)[1] == {min(19, base + 3)}
    assert _loaded(worker_method=method, worker_nice=0)[1] == {base}
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
    expected = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 15 + 10)
    assert run.stdout.splitlines() == [f"thread [{expected}]", f"multiprocessing [{expected}]"]


def test_a_worker_is_set_once_whatever_thread_started_it() -> None:
    # A worker thread started by another worker (already niced) gets the
    # same value, not the increment twice.
    target = _worker_priority.worker_nice_value(4)
    seen: list[int] = []

    def worker(depth: int) -> None:
        _worker_priority.lower_thread_priority(target)
        seen.append(_own_nice())
        if depth:
            child = threading.Thread(target=worker, args=(depth - 1,))
            child.start()
            child.join()

    thread = threading.Thread(target=worker, args=(2,))
    thread.start()
    thread.join()
    assert seen == [target] * 3


@pytest.mark.parametrize(
    "value,error",
    [(-1, ValueError), (20, ValueError), (2.0, TypeError), (True, TypeError), ("5", TypeError)],
)
def test_invalid_worker_nice_is_refused(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="worker_nice"):
        minato.DataLoader(Nice(), num_workers=2, worker_nice=value)
