"""Exceptions reach the consumer as torch delivers them; timeouts are torch's."""

from __future__ import annotations

import threading

import pytest
import torch.utils.data as tud
from helpers import RangeDataset, UnshardedIterable

import minato

pytestmark = pytest.mark.usefixtures("no_leaked_threads")


class FailsAt(RangeDataset):
    def __init__(self, bad: int, exc: BaseException, n: int = 20) -> None:
        super().__init__(n)
        self.bad, self.exc = bad, exc

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise self.exc
        return i


class NeedsTwoArgs(Exception):
    def __init__(self, a, b) -> None:
        super().__init__(a, b)


def test_worker_exception_keeps_its_type_and_names_thread_and_sample() -> None:
    loader = minato.DataLoader(FailsAt(6, ValueError("bad sample")), batch_size=4, num_workers=1)
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError) as raised:
        next(it)
    message = str(raised.value)
    assert message.startswith(
        "Caught ValueError in DataLoader worker thread 0 (sample index 6).\n"
        "Original Traceback (most recent call last):\n"
    )
    assert "bad sample" in message and "in __getitem__" in message


def test_the_loader_goes_on_after_a_worker_exception_like_torch() -> None:
    def run(cls):
        out = []
        it = iter(cls(FailsAt(5, ValueError("x")), batch_size=4, num_workers=2))
        while True:
            try:
                out.append(next(it).tolist())
            except ValueError:
                out.append("error")
            except StopIteration:
                return out

    assert run(minato.DataLoader) == run(tud.DataLoader)


def test_keyerror_keeps_a_readable_message() -> None:
    loader = minato.DataLoader(FailsAt(2, KeyError("missing")), batch_size=4, num_workers=1)
    with pytest.raises(KeyError) as raised:
        list(loader)
    assert "Caught KeyError in DataLoader worker thread 0 (sample index 2)." in str(raised.value)
    assert "\\n" not in str(raised.value)


def test_exception_that_cannot_take_one_message_becomes_runtimeerror() -> None:
    loader = minato.DataLoader(FailsAt(1, NeedsTwoArgs(1, 2)), batch_size=2, num_workers=1)
    with pytest.raises(RuntimeError, match="Caught NeedsTwoArgs in DataLoader worker thread 0"):
        list(loader)


def test_num_workers_0_raises_the_original_exception_unwrapped() -> None:
    error = ValueError("plain")
    with pytest.raises(ValueError) as raised:
        list(minato.DataLoader(FailsAt(3, error), batch_size=2))
    assert raised.value is error


def test_collate_error_is_wrapped() -> None:
    def collate(items):
        raise TypeError("cannot collate")

    with pytest.raises(TypeError, match="^Caught TypeError in DataLoader worker thread 0.\n"):
        list(minato.DataLoader(RangeDataset(4), batch_size=2, num_workers=1, collate_fn=collate))


def test_worker_init_fn_error_is_reported_like_torch() -> None:
    def init(worker_id):
        raise OSError("no such device")

    with pytest.raises(OSError, match="Caught OSError in DataLoader worker thread 0.\n"):
        list(minato.DataLoader(RangeDataset(4), batch_size=2, num_workers=1, worker_init_fn=init))


def test_iterable_dataset_error_is_wrapped() -> None:
    class Broken(UnshardedIterable):
        def __iter__(self):
            yield 1
            raise RuntimeError("stream broke")

    with pytest.raises(RuntimeError, match="Caught RuntimeError in DataLoader worker thread 0"):
        list(minato.DataLoader(Broken(), batch_size=4, num_workers=1))


def test_timeout_raises_torchs_runtimeerror() -> None:
    release = threading.Event()

    class Stuck(RangeDataset):
        def __getitem__(self, i):
            release.wait(30)
            return i

    loader = minato.DataLoader(Stuck(4), batch_size=2, num_workers=1, timeout=0.2)
    try:
        with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 0\.2 seconds$"):
            next(iter(loader))
    finally:
        release.set()


def test_timeout_with_num_workers_0_fails_like_torch() -> None:
    with pytest.raises(AssertionError) as theirs:
        iter(tud.DataLoader(RangeDataset(), timeout=1))
    with pytest.raises(AssertionError) as ours:
        iter(minato.DataLoader(RangeDataset(), timeout=1))
    assert str(ours.value) == str(theirs.value)
