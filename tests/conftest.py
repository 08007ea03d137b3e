"""Fixtures shared by the tests."""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator

import pytest
from helpers import os_thread_count, wait_for_thread_count

# A runner that starts pytest in the background (`nohup cmd &` without job
# control, some CI agents) has SIGINT ignored, and Python then raises no
# KeyboardInterrupt: the Ctrl-C tests (and their subprocesses, which inherit
# an ignored signal but not a handler) need Python's own handler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# MINATO_TEST_WORKER_METHOD=multiprocessing runs a suite with worker processes
# (.ci/run does so for the parity, reordering, resume and Lightning suites):
# the default of DataLoader's worker_method changes for this pytest process.
_WORKER_METHOD = os.environ.get("MINATO_TEST_WORKER_METHOD")
if _WORKER_METHOD:
    import minato

    minato.DataLoader.__init__.__kwdefaults__["worker_method"] = _WORKER_METHOD


def pytest_report_header() -> str | None:
    return f"minato worker_method default: {_WORKER_METHOD}" if _WORKER_METHOD else None


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """Fails the test if it leaves OS threads behind."""
    gc.collect()
    before = os_thread_count()
    yield
    assert wait_for_thread_count(before) <= before, "a worker thread outlived its loader"


@pytest.fixture(autouse=True)
def _fresh_automatic_choice() -> None:
    """worker_method="auto" carries a decision to later loaders over the same
    dataset type in the process: each test's loaders decide afresh."""
    from minato._process.method import _decided_for

    _decided_for.clear()
