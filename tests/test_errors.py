"""Exceptions reach the consumer as torch delivers them; timeouts are torch's."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data as tud
from helpers import RangeDataset
from torch._utils import ExceptionWrapper

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

    with pytest.raises(
        TypeError,
        match=r"^Caught TypeError in DataLoader worker thread 0 "
        r"\(collating sample indices \[0, 1\]\).\n",
    ):
        list(minato.DataLoader(RangeDataset(4), batch_size=2, num_workers=1, collate_fn=collate))


def test_collate_error_on_the_consumer_thread_names_the_indices() -> None:
    # Reordering single samples, the batch is collated on the consumer's thread.
    def collate(items):
        raise TypeError("cannot collate")

    loader = minato.DataLoader(
        RangeDataset(4), batch_size=2, num_workers=1, shuffle=True, collate_fn=collate
    )
    with pytest.raises(TypeError, match="^cannot collate") as raised:
        list(loader)
    assert any("collating sample indices [" in note for note in raised.value.__notes__)


class WithKeywordOnly(Exception):
    def __init__(self, *, path: str) -> None:
        super().__init__(f"cannot read {path}")


class NotAString(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() fails")


# Every way a loader runs its workers: single samples reordered, whole batches
# in order, a user's batch_sampler, batches out of order.
WORKER_PATHS = {
    "samples": dict(batch_size=4, shuffle=True),
    "in_order": dict(batch_size=4),
    "batch_sampler": dict(batch_sampler=[[0, 1, 2, 3], [4, 5, 6, 7]]),
    "out_of_order": dict(batch_size=4, in_order=False),
    "unbatched": dict(batch_size=None),
}


@pytest.mark.parametrize("path", WORKER_PATHS)
@pytest.mark.parametrize(
    "make_error",
    [
        lambda: ValueError("bad"),
        lambda: KeyError("k"),
        lambda: NeedsTwoArgs(1, 2),
        lambda: WithKeywordOnly(path="/x"),
    ],
    ids=["ValueError", "KeyError", "NeedsTwoArgs", "WithKeywordOnly"],
)
def test_every_worker_path_raises_torchs_type_naming_worker_and_sample(
    path: str, make_error: Any
) -> None:
    error = make_error()
    loader = minato.DataLoader(FailsAt(5, error, n=8), num_workers=1, **WORKER_PATHS[path])
    with pytest.raises(Exception) as caught:
        list(loader)
    # What torch's worker processes raise: its ExceptionWrapper rebuilds the
    # exception from a message, or raises RuntimeError where it cannot.
    try:
        raise make_error()
    except Exception:
        wrapper = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(Exception) as torchs:
        wrapper.reraise()
    assert type(caught.value) is type(torchs.value)
    message = str(caught.value)
    del caught, loader  # the traceback holds the iterator and its threads
    assert f"Caught {type(error).__name__} in DataLoader worker thread 0 (sample index" in message
    assert "sample index 5)" in message or "sample indices [4, 5, 6, 7])" in message


def test_an_exception_whose_str_fails_is_still_reported() -> None:
    # Its message is formatted without str() (torch's ExceptionWrapper), and
    # the rebuilt exception carries it in args, as torch's does.
    loader = minato.DataLoader(FailsAt(1, NotAString(), n=4), batch_size=2, num_workers=1)
    try:
        list(loader)
    except NotAString as error:
        assert "Caught NotAString in DataLoader worker thread 0 (sample index 1)" in error.args[0]
    else:
        raise AssertionError("no exception")


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


class _Cycle:
    """Garbage that runs Python code when collected: a collection that an
    allocation of ast.parse triggers can then hand the GIL to another thread
    mid-parse, as a real program's garbage does."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        pass


class RaisingEverywhere(tud.Dataset):
    def __len__(self) -> int:
        # Small: shuffling 100k indices would start the training thread's
        # OpenMP team, which the thread-leak check would count.
        return 4096

    def __getitem__(self, index: int) -> int:
        garbage = [_Cycle() for _ in range(100)]  # noqa: F841
        table = {"a": 1}
        return table["a"] + table[f"missing {index}"]  # carets: a traceback's parse


@pytest.mark.timeout(120)
def test_the_program_parses_source_beside_workers_that_raise() -> None:
    """Formatting a traceback parses source (CPython <= 3.11.7 races two
    threads that parse at once, gh-106905): worker threads leave it to the
    thread that raises the error, so the program's own ast.parse never fails
    (as beside torch's workers, which format in processes of their own; the
    earlier build failed 18 of 600 parses here on 3.11.7)."""
    source = inspect.getsource(tud.dataloader)
    loader = minato.DataLoader(
        RaisingEverywhere(), batch_size=8, shuffle=True, num_workers=4, prefetch_factor=4
    )
    iterator = iter(loader)
    parse_errors = raised = 0
    for _ in range(200):
        for _ in range(3):
            try:
                ast.parse(source)
            except SystemError:
                parse_errors += 1
        try:
            next(iterator)
        except KeyError as error:
            assert "missing" in str(error) and "table[" in str(error)
            raised += 1
    del iterator
    assert raised == 200
    assert parse_errors == 0


def test_a_worker_error_keeps_type_worker_index_and_traceback_through_a_process() -> None:
    loader = minato.DataLoader(
        RaisingEverywhere(), batch_size=2, num_workers=1, worker_method="multiprocessing"
    )
    with pytest.raises(KeyError) as raised:
        next(iter(loader))
    message = str(raised.value)
    assert "Caught KeyError in DataLoader worker process 0 (sample index 0)" in message
    assert 'table[f"missing {index}"]' in message and "Traceback" in message


class ExitsAt(RangeDataset):
    def __getitem__(self, i: int) -> int:
        if i == 5:
            sys.exit(3)
        return i


def exit_at_start(worker_id: int) -> None:
    sys.exit(3)


def _exiting_loader(loader_type: type, where: str, **options: Any) -> Any:
    if where == "dataset":
        return loader_type(ExitsAt(8), batch_size=4, num_workers=1, **options)
    return loader_type(
        RangeDataset(8), batch_size=4, num_workers=1, worker_init_fn=exit_at_start, **options
    )


@pytest.mark.parametrize("worker_method", ["thread", "multiprocessing"])
@pytest.mark.parametrize("where", ["dataset", "worker_init_fn"])
def test_sys_exit_in_a_worker_raises_runtimeerror_as_torchs_exiting_worker_does(
    worker_method: str, where: str
) -> None:
    """sys.exit() in a worker ends torch's worker process, and its loader
    raises RuntimeError (test_torchs_exiting_worker_fails_its_epoch):
    minato's raises the same, naming the SystemExit, and does not end the
    training process (as re-raising it would)."""
    loader = _exiting_loader(minato.DataLoader, where, worker_method=worker_method)
    with pytest.raises(RuntimeError, match="exited unexpectedly") as caught:
        list(loader)
    message = str(caught.value)
    del caught, loader  # the traceback holds the iterator and its threads
    assert "SystemExit(3)" in message


@pytest.mark.parametrize("where", ["dataset", "worker_init_fn"])
def test_torchs_exiting_worker_fails_its_epoch(tmp_path: Path, where: str) -> None:
    """torch's side, in a process of its own: its SIGCHLD handler raises
    RuntimeError wherever the main thread is when the worker's exit is
    noticed, unless the batch the worker was sending as it exited fails to
    arrive first (ConnectionResetError, EOFError): the epoch fails."""
    program = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import torch.utils.data as tud\n"
        "from test_errors import _exiting_loader\n"
        "try:\n"
        "    list(_exiting_loader(tud.DataLoader, sys.argv[2]))\n"
        "except RuntimeError as error:\n"
        "    print('RuntimeError:', error)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", program, str(Path(__file__).parent), where],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # the installed minato, not the checkout's sources
    )
    assert run.returncode != 0 or "exited unexpectedly" in run.stdout, run.stdout + run.stderr
