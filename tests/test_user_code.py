"""minato's worker threads are held out of the user's code while minato
forks its fork server (minato._util.user_code)."""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any

import pytest
import torch.utils.data as tud

from minato._util.user_code import IN_USER_CODE, out_of_user_code

pytestmark = pytest.mark.timeout(60)


def _a_thread_inside(may_leave: threading.Event) -> threading.Thread:
    """A thread that stays inside the user's code until `may_leave` is set."""
    inside = threading.Event()

    def in_users_code() -> None:
        with IN_USER_CODE:
            inside.set()
            may_leave.wait()

    thread = threading.Thread(target=in_users_code)
    thread.start()
    inside.wait()
    return thread


def test_a_fork_waits_for_a_thread_inside_and_holds_new_ones_at_the_door() -> None:
    may_leave = threading.Event()
    first = _a_thread_inside(may_leave)
    order: list[str] = []

    def forker() -> None:
        with out_of_user_code(bound=30) as clear:
            order.append(f"fork clear={clear}")
            time.sleep(0.05)  # a new entrant waits at the door meanwhile
            order.append("fork done")

    def entrant() -> None:
        with IN_USER_CODE:
            order.append("entered")

    forking = threading.Thread(target=forker)
    forking.start()
    time.sleep(0.05)
    assert order == []  # the fork waits for the thread inside
    entering = threading.Thread(target=entrant)
    entering.start()
    may_leave.set()
    for thread in (first, forking, entering):
        thread.join()
    assert order == ["fork clear=True", "fork done", "entered"]


def test_a_fork_waits_no_longer_than_its_bound() -> None:
    may_leave = threading.Event()
    thread = _a_thread_inside(may_leave)
    with out_of_user_code(bound=0.05) as clear:
        assert not clear
    may_leave.set()
    thread.join()
    with out_of_user_code(bound=0.05) as clear:
        assert clear


def test_the_forking_thread_itself_may_be_inside() -> None:
    with IN_USER_CODE, out_of_user_code(bound=5) as clear:
        assert clear


def test_the_door_stays_closed_until_the_last_block_holding_it_ends() -> None:
    # Auto's move holds the threads out across the fork it makes, whose own
    # wait (and any fork's at-fork wait) must not reopen the door early.
    from minato._util import user_code

    entered = threading.Event()

    def entrant() -> None:
        with IN_USER_CODE:
            entered.set()

    with out_of_user_code(bound=5) as clear:
        assert clear
        with out_of_user_code(bound=5):
            pass
        if hasattr(os, "fork"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                # The child starts with the door open and none holding it.
                open_in_child = False
                try:
                    open_in_child = user_code._door.is_set() and not user_code._closers
                finally:
                    os._exit(0 if open_in_child else 1)
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        assert not user_code._door.is_set()
        entering = threading.Thread(target=entrant)
        entering.start()
        assert not entered.wait(0.05)  # held at the door
    entering.join()
    assert entered.is_set() and user_code._door.is_set()


def test_threads_that_left_leave_no_entry_behind() -> None:
    from minato._util import user_code

    def one_call() -> None:
        with IN_USER_CODE, IN_USER_CODE:  # nested, as a dataset calling a collate
            pass

    threads = [threading.Thread(target=one_call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not user_code._depth


def _locking_in_users_code(lock: threading.Lock, stop: threading.Event) -> threading.Thread:
    """A minato-like worker thread: each call into the user's code holds
    `lock` (a lock of the user's, a logging handler's) most of the time."""

    def calls() -> None:
        while not stop.is_set():
            with IN_USER_CODE, lock:
                time.sleep(0.002)

    thread = threading.Thread(target=calls)
    thread.start()
    return thread


@pytest.fixture
def patient_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forks wait for the threads inside however loaded the machine: what
    these tests check is that they wait, not the 0.1 s bound (past it a
    fork goes ahead, by design)."""
    from minato._util import user_code

    monkeypatch.setattr(user_code, "FORK_QUIET_BOUND_S", 30.0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_any_fork_waits_for_the_threads_inside_and_its_child_finds_their_lock_free(
    patient_forks: None,
) -> None:
    # A fork made by the program itself (multiprocessing, a torch
    # DataLoader's workers), not by minato: the child has only the forking
    # thread, so a lock a thread held inside the user's code would be held
    # in it for good.
    lock, stop = threading.Lock(), threading.Event()
    thread = _locking_in_users_code(lock, stop)
    codes = []
    try:
        for _ in range(10):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # a fork beside threads
                pid = os.fork()
            if pid == 0:
                os._exit(0 if lock.acquire(blocking=False) else 1)
            codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    finally:
        stop.set()
        thread.join()
    assert codes == [0] * 10


class _UnderLock(tud.Dataset):
    """Each sample takes `lock` for a moment, as a dataset's shared cache would."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        with self.lock:
            time.sleep(0.002)
        return index


def test_a_torch_loaders_workers_forked_beside_minatos_threads_find_the_lock_free(
    patient_forks: None,
) -> None:
    # minato's loader runs the dataset on threads while torch's DataLoader
    # (an evaluation loader, a library's) forks its workers: they need the
    # same lock, which none of minato's threads holds at the fork.
    import minato

    lock = threading.Lock()
    dataset = _UnderLock(lock)
    stop = threading.Event()
    minato_loader = minato.DataLoader(dataset, batch_size=4, num_workers=4, worker_method="thread")

    def train() -> None:
        while not stop.is_set():
            for _ in minato_loader:
                if stop.is_set():
                    break

    training = threading.Thread(target=train)
    training.start()
    try:
        for _ in range(3):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                # timeout: a worker that inherited the lock held would never answer.
                evaluation = tud.DataLoader(dataset, batch_size=8, num_workers=2, timeout=20)
                assert [int(i) for batch in evaluation for i in batch] == list(range(64))
    finally:
        stop.set()
        training.join()
