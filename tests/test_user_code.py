"""minato's worker threads are held out of the user's code while minato
forks its fork server (minato._util.user_code)."""

from __future__ import annotations

import threading
import time

import pytest

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
