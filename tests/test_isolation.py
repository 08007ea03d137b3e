"""What each worker thread has of its own, as a worker process would: its
dataset copy and its process-wide generators (minato/_thread/dataset.py,
minato/_thread/generators.py), and the scheduling that keeps one stuck stream
from starving the others."""

from __future__ import annotations

import copy
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
import torch.nn.functional as F
import torch.utils.data as tud
from helpers import EVERY_WORKER_KIND
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minato
from minato._thread.dataset import worker_dataset
from minato._util import warn_once as _warn_once

pytestmark = pytest.mark.timeout(60)

ATTRIBUTES = ("a", "b", "c")


class Writing(tud.Dataset):
    """Item i sets the attributes `writes[i]` names on the dataset it runs on,
    after logging what that object's attributes were."""

    def __init__(self, writes: list[list[tuple[str, int]]]) -> None:
        self.writes = writes
        self.a = self.b = self.c = -1
        self.log: list[tuple[int, int, dict[str, int], list[tuple[str, int]]]] = []
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.writes)

    def __getitem__(self, i: int) -> int:
        seen = {name: getattr(self, name) for name in ATTRIBUTES}
        for name, value in self.writes[i]:
            setattr(self, name, value)
        with self.lock:
            self.log.append((id(self), i, seen, self.writes[i]))
        return i


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    writes=st.lists(
        st.lists(st.tuples(st.sampled_from(ATTRIBUTES), st.integers(0, 1000)), max_size=3),
        min_size=1,
        max_size=40,
    ),
    workers=st.integers(1, 4),
    batch_size=st.integers(1, 5),
    shuffle=st.booleans(),
    persistent=st.booleans(),
)
def test_worker_writes_stay_in_their_own_copy(
    writes: list[list[tuple[str, int]]],
    workers: int,
    batch_size: int,
    shuffle: bool,
    persistent: bool,
) -> None:
    dataset = Writing(writes)
    loader = minato.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=workers,
        persistent_workers=persistent,
        generator=torch.Generator().manual_seed(len(writes)),
        adaptive=False,  # no retired thread's copy whose id a new one could reuse
    )
    state: dict[int, dict[str, int]] = {}
    for _ in range(2):
        dataset.log.clear()
        if not persistent:
            state.clear()  # new workers, new copies
        delivered = [int(i) for batch in loader for i in batch]
        # Every index exactly once.
        assert Counter(delivered) == Counter(range(len(writes)))
        # The caller's dataset never changes.
        assert (dataset.a, dataset.b, dataset.c) == (-1, -1, -1)
        # Each copy sees its own writes only: replaying each copy's log in
        # its order, what it read is what it last wrote itself (a persistent
        # worker's copy keeps its writes from one epoch to the next).
        for copy_id, _, seen, written in dataset.log:
            assert copy_id != id(dataset)
            expected = state.setdefault(copy_id, dict.fromkeys(ATTRIBUTES, -1))
            assert seen == expected
            expected.update(written)


# ---------------------------------------------------------------- the copies


class Holder(tud.Dataset):
    def __init__(self, inner: tud.Dataset) -> None:
        self.inner = inner
        self.paths = [f"/data/{i}.jpg" for i in range(1000)]

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        return self.inner[i]


class Leaf(tud.Dataset):
    def __init__(self) -> None:
        self.handle: object | None = None

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


def test_copies_share_the_data_and_copy_wrapped_datasets() -> None:
    leaf = Leaf()
    concat = tud.ConcatDataset([tud.Subset(leaf, [0, 1]), leaf])
    outer = Holder(concat)
    copied = worker_dataset(outer)
    assert copied is not outer and copied.paths is outer.paths
    assert copied.inner is not concat
    subset, second = copied.inner.datasets
    assert subset is not concat.datasets[0] and subset.indices is concat.datasets[0].indices
    # One copy of a dataset referenced twice, as one object in a process.
    assert subset.dataset is second and second is not leaf
    assert copied.inner.cumulative_sizes is concat.cumulative_sizes


def test_plain_containers_and_tensors_are_used_as_they_are() -> None:
    for data in ([1, 2], (1, 2), torch.arange(3), numpy.arange(3), range(3)):
        assert worker_dataset(data) is data


def test_a_dataset_that_cannot_be_copied_is_shared_with_one_warning() -> None:
    class Uncopyable(tud.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> int:
            return i

        def __copy__(self) -> Uncopyable:
            raise TypeError("cannot copy a live stream")

    dataset = Uncopyable()
    with pytest.warns(UserWarning, match=r"Uncopyable\) cannot be copied .*live stream") as caught:
        assert sorted(int(i) for i in minato.DataLoader(dataset, num_workers=2)) == list(range(8))
        assert sorted(int(i) for i in minato.DataLoader(dataset, num_workers=2)) == list(range(8))
    assert len([w for w in caught if "cannot be copied" in str(w.message)]) == 1


def test_getstate_decides_what_a_copy_holds() -> None:
    """A dataset written for worker processes drops its handle in __getstate__;
    each worker's copy then opens its own."""

    class DropsHandle(Leaf):
        def __getstate__(self) -> dict[str, Any]:
            return {**self.__dict__, "handle": None}

    dataset = DropsHandle()
    dataset.handle = object()
    assert worker_dataset(dataset).handle is None
    assert copy.copy(dataset).handle is None


def test_persistent_workers_keep_their_copy_across_epochs() -> None:
    class Counting(tud.Dataset):
        def __init__(self) -> None:
            self.calls = 0
            self.seen: list[int] = []

        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> int:
            self.calls += 1
            self.seen.append(self.calls)
            return i

    dataset = Counting()
    loader = minato.DataLoader(dataset, num_workers=1, persistent_workers=True, adaptive=False)
    list(loader)
    list(loader)
    # One copy, counting on over both epochs; the caller's count untouched.
    assert dataset.seen == list(range(1, 17))
    assert dataset.calls == 0


# ---------------------------------------------------------------- the generators


def test_thread_safe_generator_is_the_workers_global_torch_generator() -> None:
    class Draws(tud.Dataset):
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> tuple[float, float]:
            generator = tud.get_worker_info().rng.torch_generator
            if hasattr(torch, "thread_safe_generator"):  # torch >= 2.15
                assert torch.thread_safe_generator() is generator
            state = generator.get_state()
            implicit = float(torch.rand(()))
            generator.set_state(state)
            return implicit, float(torch.rand((), generator=generator))

    for implicit, explicit in minato.DataLoader(Draws(), batch_size=None, num_workers=2):
        assert implicit == explicit


def test_legacy_numpy_and_random_functions_are_per_thread() -> None:
    class Seeds(tud.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> list[float]:
            numpy.random.seed(i)
            random.seed(i)
            torch.manual_seed(i)
            return [
                float(numpy.random.random_sample()),
                float(numpy.random.mtrand.rand()),
                float(numpy.random.ranf()),
                random.random(),
                float(torch.rand(())),
                torch.initial_seed(),
            ]

    numpy.random.seed(0)
    random.seed(0)
    torch.manual_seed(0)
    loaded = list(minato.DataLoader(Seeds(), batch_size=None, num_workers=2))
    for i, values in enumerate(loaded):
        reference = numpy.random.RandomState(i)
        assert values[:3] == [reference.random_sample() for _ in range(3)]
        assert values[3] == random.Random(i).random()
        assert values[4] == float(torch.rand((), generator=torch.Generator().manual_seed(i)))
        assert values[5] == i
    # The loop's generators were not reseeded.
    assert torch.initial_seed() == 0


def test_a_random_function_without_a_generator_warns_once() -> None:
    class Drops(tud.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> torch.Tensor:
            return F.dropout(torch.ones(4), p=0.5)

    _warn_once._warned.discard("torch.nn.functional.dropout")  # as in a new process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(minato.DataLoader(Drops(), batch_size=2, num_workers=2))
        list(minato.DataLoader(Drops(), batch_size=2, num_workers=2))
    messages = [str(w.message) for w in caught if "dropout" in str(w.message)]
    assert len(messages) == 1
    assert "generator=torch.thread_safe_generator()" in messages[0]
    # In the loop itself nothing is said.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        F.dropout(torch.ones(4), p=0.5)
    assert not caught


def test_generators_outside_workers_are_the_shared_ones() -> None:
    torch.manual_seed(3)
    random.seed(3)
    numpy.random.seed(3)
    values = (float(torch.rand(())), random.random(), float(numpy.random.rand()))
    torch.manual_seed(3)
    assert torch.initial_seed() == 3
    assert float(torch.rand(())) == values[0]
    assert random.Random(3).random() == values[1]
    assert numpy.random.RandomState(3).rand() == values[2]


# ---------------------------------------------------------------- iterable streams


class OneStuckStream(tud.IterableDataset):
    """Worker 0's stream waits until the consumer has all of worker 1's."""

    def __init__(self, release: Any) -> None:
        self.release = release

    def __iter__(self):
        info = tud.get_worker_info()
        if info.id == 0:
            self.release.wait(20)
            yield from range(1000, 1004)
        else:
            yield from range(40)


@pytest.mark.parametrize(
    "loader_type", [tud.DataLoader, minato.DataLoader], ids=["torch", "minato"]
)
def test_a_stuck_stream_does_not_starve_the_others(loader_type: Any) -> None:
    release = multiprocessing.get_context("fork").Event()
    loader = loader_type(OneStuckStream(release), batch_size=None, num_workers=2, in_order=False)
    fast_before_release = 0
    items = []
    for item in loader:
        items.append(int(item))
        if int(item) < 1000 and not release.is_set():
            fast_before_release += 1
            if fast_before_release == 40:
                release.set()
    assert fast_before_release == 40
    assert sorted(items) == list(range(40)) + list(range(1000, 1004))


class IntraOpThreads(tud.Dataset):
    """Each sample: the intra-op thread count its worker sees."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return torch.get_num_threads()


@pytest.mark.parametrize("loader_type", [tud.DataLoader, minato.DataLoader])
def test_a_worker_runs_torch_ops_on_one_intra_op_thread(loader_type: type) -> None:
    """torch sets one intra-op thread in each worker process; a worker thread
    has one of its own too, and the training loop keeps its count."""
    before = torch.get_num_threads()
    loaded = list(loader_type(IntraOpThreads(), batch_size=None, num_workers=2))
    assert loaded == [1] * 8
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("loader_type", [tud.DataLoader, minato.DataLoader])
def test_set_num_threads_in_a_worker_sets_that_worker_alone(loader_type: type) -> None:
    """A worker_init_fn's torch.set_num_threads(n) (a common recipe) sets that
    worker's count, as in a worker process; the training loop keeps its."""
    before = torch.get_num_threads()

    def init(worker_id: int) -> None:
        torch.set_num_threads(3)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "ignored" warning either
        loaded = list(
            loader_type(IntraOpThreads(), batch_size=None, num_workers=2, worker_init_fn=init)
        )
    assert loaded == [3] * 8
    assert torch.get_num_threads() == before


# ------------------------ torch's test_ind_worker_queue and test_dataset_not_reset


class IndividualWorkerQueue(tud.Dataset):
    """torch's TestIndividualWorkerQueue: worker_init_fn is a method of the dataset."""

    def __init__(self, data: list[int]) -> None:
        self.data = data
        self.worker_id: int | None = None

    def worker_init_fn(self, worker_id: int) -> None:
        self.worker_id = worker_id

    def __getitem__(self, item: int) -> tuple[int, int]:
        if self.worker_id is None:
            raise RuntimeError("no handle: worker_init_fn set up another object")
        return self.worker_id, self.data[item]

    def __len__(self) -> int:
        return len(self.data)


@pytest.mark.parametrize("method", ["thread", "multiprocessing"])
@pytest.mark.parametrize("num_workers", [1, 3])
def test_a_bound_method_worker_init_fn_sets_up_the_workers_own_copy(
    method: str, num_workers: int
) -> None:
    batch_size = 8
    dataset = IndividualWorkerQueue(list(range(batch_size * 12)))
    results = {}
    for loader_type, options in (
        (tud.DataLoader, {}),
        (minato.DataLoader, {"worker_method": method}),
    ):
        loader = loader_type(
            dataset,
            batch_size=batch_size,
            shuffle=False,
            num_workers=num_workers,
            timeout=5,
            worker_init_fn=dataset.worker_init_fn,
            **options,
        )
        results[loader_type] = [(ids.tolist(), sample.tolist()) for ids, sample in loader]
    # Threads the adaptive pool adds (a loaded machine starves the loop), and
    # those that stand in for a slow sample, take new worker ids from
    # num_workers upwards.
    stats = loader.stats()
    only_the_first = len(stats.worker_history) == 1 and stats.slow_samples == 0
    bound = num_workers if only_the_first else float("inf")
    for ours, theirs in zip(results[minato.DataLoader], results[tud.DataLoader], strict=True):
        ids, sample = ours
        assert sample == theirs[1]
        # A whole batch from one worker, set up by its own worker_init_fn.
        assert len(set(ids)) == 1 and 0 <= ids[0] < bound
    assert dataset.worker_id is None  # the caller's dataset was never set up


def test_a_bound_method_worker_init_fn_with_batches_dealt_in_turn_is_torchs() -> None:
    """In deterministic mode batches go to the workers in turn, as torch
    deals them: the worker ids are torch's test_ind_worker_queue's exactly."""
    dataset = IndividualWorkerQueue(list(range(64)))
    torch.use_deterministic_algorithms(True)
    try:
        got = {
            loader_type: [
                ids.tolist()
                for ids, _ in loader_type(
                    dataset,
                    batch_size=8,
                    num_workers=3,
                    worker_init_fn=dataset.worker_init_fn,
                )
            ]
            for loader_type in (tud.DataLoader, minato.DataLoader)
        }
    finally:
        torch.use_deterministic_algorithms(False)
    assert got[minato.DataLoader] == got[tud.DataLoader]
    assert [ids[0] for ids in got[tud.DataLoader]] == [i % 3 for i in range(8)]


class NotReset(tud.Dataset):
    """torch's DummyDataset in test_dataset_not_reset: persistent workers
    keep the dataset as it was when they started, whatever the caller sets
    later. Samples divisible by 20 are slow, so that the pool gets
    replacement workers in later epochs: slow enough for one in any run
    of a batch's samples (4 x the 0.01 s timeout) to pass the replacement's
    bar (4 times that, rust/engine/pool.rs), whatever the run lengths a
    loaded machine's timings give."""

    def __init__(self) -> None:
        self.data = list(range(40))
        self.start = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx: int) -> tuple[int, int]:
        if idx % 20 == 0:
            time.sleep(0.25)
        return self.start, self.data[idx]


@pytest.mark.parametrize("loader_type", [tud.DataLoader, minato.DataLoader])
def test_persistent_workers_added_later_copy_the_dataset_of_the_start(loader_type: type) -> None:
    dataset = NotReset()
    options = {} if loader_type is tud.DataLoader else {"sample_timeout": 0.01}
    loader = loader_type(
        dataset, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True, **options
    )
    seen: set[int] = set()
    for epoch in range(4):
        delivered = []
        for starts, data in loader:
            seen.update(starts.tolist())
            delivered.extend(data.tolist())
        assert sorted(delivered) == dataset.data
        dataset.start = epoch + 1
    assert seen == {0}
    if loader_type is minato.DataLoader:
        stats = loader.stats()
        # Slow samples got replacement workers: copies made after epoch 0.
        assert stats.slow_samples > 0
        assert max(count for _, count in stats.worker_history) > 2


def test_a_fresh_loaders_workers_copy_the_dataset_of_their_epoch() -> None:
    dataset = NotReset()
    loader = minato.DataLoader(dataset, batch_size=4, num_workers=2)
    for epoch in range(2):
        dataset.start = epoch
        assert {int(s) for starts, _ in loader for s in starts} == {epoch}


# ------------------------------------------------------ a worker's signals


class SigintDisposition(tud.Dataset):
    """Each item: whether the worker running it sees SIGINT ignored."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> bool:
        return signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def ignore_sigint(worker_id: int) -> None:
    # The recipe: Ctrl-C is the training process's to handle, not the workers'.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@EVERY_WORKER_KIND
def test_a_worker_ignoring_sigint_keeps_that_to_itself_as_torchs_do(
    loader_type: type, options: dict[str, Any]
) -> None:
    """signal.signal(SIGINT, SIG_IGN) in worker_init_fn runs in a worker
    thread as in a worker process: that worker sees its disposition, and the
    training process keeps its handler (Ctrl-C still stops the loop)."""
    before = signal.getsignal(signal.SIGINT)
    loader = loader_type(
        SigintDisposition(), batch_size=None, num_workers=2, worker_init_fn=ignore_sigint, **options
    )
    assert list(loader) == [True] * 8
    assert signal.getsignal(signal.SIGINT) is before


def test_a_worker_threads_signal_calls_answer_as_cpythons_would() -> None:
    """In a worker thread: the previous disposition is returned, as CPython
    returns it, and a bad argument raises CPython's exception."""
    seen: dict[int, Any] = {}

    def init(worker_id: int) -> None:
        first = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        second = signal.signal(signal.SIGTERM, signal.SIG_DFL)
        errors = []
        for call in (
            lambda: signal.signal(signal.SIGKILL, signal.SIG_IGN),
            lambda: signal.signal(signal.SIGTERM, "ignore"),
            lambda: signal.signal(10_000, signal.SIG_IGN),
        ):
            try:
                call()
            except Exception as error:
                errors.append(type(error))
        seen[worker_id] = (first, second, signal.getsignal(signal.SIGTERM), errors)

    loader = minato.DataLoader(
        SigintDisposition(), batch_size=None, num_workers=2, worker_init_fn=init
    )
    list(loader)
    assert seen == {
        worker: (
            signal.getsignal(signal.SIGTERM),
            signal.SIG_IGN,
            signal.SIG_DFL,
            [OSError, TypeError, ValueError],
        )
        for worker in (0, 1)
    }


def set_an_alarm_handler(worker_id: int) -> None:
    signal.signal(signal.SIGALRM, lambda signum, frame: None)


class AlarmHandled(SigintDisposition):
    """Each item: whether the worker running it has a handler for SIGALRM."""

    def __getitem__(self, i: int) -> bool:
        return callable(signal.getsignal(signal.SIGALRM))


def test_a_handler_function_needs_a_worker_process_and_says_so() -> None:
    """A handler cannot run in a thread: the error names worker processes,
    where it works as in torch's."""
    with pytest.raises(ValueError, match="worker_method='multiprocessing'"):
        list(
            minato.DataLoader(
                AlarmHandled(),
                batch_size=None,
                num_workers=1,
                worker_init_fn=set_an_alarm_handler,
                worker_method="thread",
            )
        )
    options = dict(batch_size=None, num_workers=1, worker_init_fn=set_an_alarm_handler)
    torchs = list(tud.DataLoader(AlarmHandled(), **options))
    ours = list(minato.DataLoader(AlarmHandled(), worker_method="multiprocessing", **options))
    assert ours == torchs == [True] * 8


# ------------------------------------------- a worker silencing its output

SILENCING = """
import os, sys, torch.utils.data as tud
import minato

class Quiet(tud.Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, index):
        return index

def silence(worker_id):
    # A recipe: no worker output at all, Python's or a library's.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = open(os.devnull, "w")
    sys.stderr = open(os.devnull, "w")

loader_type = tud.DataLoader if sys.argv[1] == "torch" else minato.DataLoader
loaded = [int(i) for batch in loader_type(
    Quiet(), batch_size=4, num_workers=2, worker_init_fn=silence) for i in batch]
print("loop", loaded)
print("loop's error output", file=sys.stderr)
os.write(1, b"loop's descriptor 1\\n")
"""


def test_a_worker_silencing_itself_leaves_the_training_process_its_output(
    tmp_path: Path,
) -> None:
    """What a worker process redirects is its own: in a worker thread it is
    put back (one warning says so), and the loop's output still shows."""
    outputs = {}
    for which in ("torch", "minato"):
        run = subprocess.run(
            [sys.executable, "-c", SILENCING, which],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,  # the installed minato, not the checkout's sources
        )
        assert run.returncode == 0, run.stderr
        outputs[which] = run
    for run in outputs.values():
        assert run.stdout.splitlines()[-2:] == [
            "loop [0, 1, 2, 3, 4, 5, 6, 7]",
            "loop's descriptor 1",
        ]
        assert "loop's error output" in run.stderr
    assert "put back" in outputs["minato"].stderr


def test_a_worker_changing_the_working_directory_is_warned_of(tmp_path: Path) -> None:
    before = os.getcwd()

    def move(worker_id: int) -> None:
        os.chdir(tmp_path)

    try:
        with pytest.warns(UserWarning, match="working directory"):
            list(
                minato.DataLoader(
                    SigintDisposition(), batch_size=None, num_workers=1, worker_init_fn=move
                )
            )
    finally:
        os.chdir(before)
