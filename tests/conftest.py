"""Fixtures shared by the tests."""

from __future__ import annotations

import gc
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


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """Fails the test if it leaves OS threads behind."""
    gc.collect()
    before = os_thread_count()
    yield
    assert wait_for_thread_count(before) <= before, "a worker thread outlived its loader"
