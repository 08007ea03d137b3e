"""Fixtures shared by the tests."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from helpers import os_thread_count, wait_for_thread_count


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """Fails the test if it leaves OS threads behind."""
    gc.collect()
    before = os_thread_count()
    yield
    assert wait_for_thread_count(before) <= before, "a worker thread outlived its loader"
