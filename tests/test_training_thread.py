"""The training loop's thread only takes finished batches: collate and
pin_memory run elsewhere, as in torch's DataLoader (worker processes collate,
a pin-memory thread pins), and a collate_fn's random draws stay off the
training loop's generators."""

from __future__ import annotations

import random
import sys
import threading
import time

import numpy as np
import pytest
import torch
from helpers import RangeDataset
from torch.utils.data import default_collate

import minato
from minato._loader import collate_stage as _collate_stage
from minato._loader import iterator as _iterator

pytestmark = pytest.mark.usefixtures("no_leaked_threads")


def _start_the_training_threads_openmp_team() -> None:
    """The training thread's OpenMP team starts with its first parallel op
    and stays: started here, before any thread count, it is not taken for a
    thread a loader left behind (the intra-op tests run such ops on it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    torch.ones(1 << 22).add_(1)
    torch.set_num_threads(before)


_start_the_training_threads_openmp_team()


def recording_collate(threads: list[int]):
    def collate(samples):
        threads.append(threading.get_ident())
        return default_collate(samples)

    return collate


@pytest.mark.parametrize("shuffle", [True, False], ids=["sample-level", "batch-level"])
def test_collate_runs_off_the_consumers_thread(shuffle: bool) -> None:
    threads: list[int] = []
    loader = minato.DataLoader(
        RangeDataset(64),
        batch_size=4,
        shuffle=shuffle,
        num_workers=2,
        collate_fn=recording_collate(threads),
    )
    values = sorted(int(v) for batch in loader for v in batch)
    assert values == list(range(64))
    assert len(threads) == 16
    assert threading.get_ident() not in threads


@pytest.mark.parametrize("shuffle", [True, False], ids=["sample-level", "batch-level"])
def test_collate_runs_torch_ops_on_one_intra_op_thread(shuffle: bool) -> None:
    """As in torch's worker processes, which collate on one intra-op thread:
    no team of OpenMP threads spinning beside the workers."""
    counts: list[int] = []

    def collate(samples):
        counts.append(torch.get_num_threads())
        return default_collate(samples)

    before = torch.get_num_threads()
    loader = minato.DataLoader(
        RangeDataset(64), batch_size=4, shuffle=shuffle, num_workers=2, collate_fn=collate
    )
    assert sum(len(batch) for batch in loader) == 64
    assert counts == [1] * 16
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("shuffle", [True, False], ids=["sample-level", "batch-level"])
def test_pin_memory_runs_off_the_consumers_thread(monkeypatch, shuffle: bool) -> None:
    pinned_on: list[int] = []

    def pinned(batch, device):
        pinned_on.append(threading.get_ident())
        return batch

    # Pinning needs an accelerator: stand one in, and record where pinning runs.
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: None)
    monkeypatch.setattr(_collate_stage, "pinned", pinned)
    loader = minato.DataLoader(
        RangeDataset(32),
        batch_size=4,
        shuffle=shuffle,
        num_workers=2,
        pin_memory=True,
        collate_fn=recording_collate([]),
    )
    assert sum(len(batch) for batch in loader) == 32
    assert len(pinned_on) == 8
    assert threading.get_ident() not in pinned_on


def drawing_collate(samples):
    # A MixUp-like collate_fn: draws from every process-wide generator.
    torch.rand(1)
    random.random()
    np.random.rand()
    return default_collate(samples)


def generators_after_an_epoch(collate_fn) -> tuple:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    loader = minato.DataLoader(
        RangeDataset(32), batch_size=4, shuffle=True, num_workers=2, collate_fn=collate_fn
    )
    for _ in loader:
        pass
    return torch.rand(1).item(), random.random(), np.random.rand()


def test_a_collate_fns_random_draws_leave_the_training_loops_generators_alone() -> None:
    # In torch, collate_fn runs in a worker process with generators of its
    # own; the training loop's generators are where they would be without it.
    assert generators_after_an_epoch(drawing_collate) == generators_after_an_epoch(default_collate)


def marked_no_random(collate_fn):
    collate_fn.draws_no_random = True  # as torch's default_collate is known to
    return collate_fn


def test_a_cheap_default_collate_is_left_to_the_waiting_consumer() -> None:
    # Handing a batch of 64 integers to the collate thread costs more (a GIL
    # hand-over) than collating it: the consumer collates it itself.
    threads: list[int] = []
    loader = minato.DataLoader(
        RangeDataset(4096),
        batch_size=64,
        shuffle=True,
        num_workers=2,
        collate_fn=marked_no_random(recording_collate(threads)),
    )
    assert sorted(int(v) for batch in loader for v in batch) == list(range(4096))
    assert threading.get_ident() in threads


def _spend_a_millisecond_of_cpu() -> None:
    """CPU time, as a real collate's."""
    busy_until = time.perf_counter() + 0.001
    while time.perf_counter() < busy_until:
        pass


def test_a_costly_collate_stays_off_the_consumers_thread() -> None:
    threads: list[int] = []
    record = recording_collate(threads)

    def costly(samples):
        _spend_a_millisecond_of_cpu()
        return record(samples)

    loader = minato.DataLoader(
        RangeDataset(512),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        collate_fn=marked_no_random(costly),
    )
    assert sorted(int(v) for batch in loader for v in batch) == list(range(512))
    assert len(threads) == 64
    # Until a batch's cost is known (the batches in flight then: the
    # prefetch bound of 2 x 2, and one or two more that the first ones made
    # room for), the waiting consumer collates; after that, never.
    assert threads.count(threading.get_ident()) <= 8


def _thread_names_collating(collate_fn, **options) -> set[str]:
    """The names of the OS threads that ran `collate_fn` (wrapped to record
    them) over a shuffled epoch of costly batches; the loader's collate
    where `collate_fn` is None (minato's own, wrapped where it is made)."""
    native: list[int] = []

    def recording(collate):
        def costly(samples):
            native.append(threading.get_native_id())
            _spend_a_millisecond_of_cpu()
            return collate(samples)

        for mark in ("draws_no_random", "takes_slot_leaves"):
            if hasattr(collate, mark):
                setattr(costly, mark, getattr(collate, mark))
        return costly

    names: set[str] = set()
    # On threads for good unless told otherwise: a loader that may move to
    # worker processes gets a user's collate_fn its samples from them still
    # pickled, to be made on its collate thread.
    options = {"worker_method": "thread", **options}
    with pytest.MonkeyPatch.context() as patch:
        if collate_fn is None:
            made = _iterator.fast_default_collate
            patch.setattr(_iterator, "fast_default_collate", lambda pin: recording(made(pin)))
        loader = minato.DataLoader(
            RangeDataset(256),
            batch_size=8,
            shuffle=True,
            num_workers=2,
            collate_fn=None if collate_fn is None else recording(collate_fn),
            # No sample is ever late: a batch moved on past a late one is taken
            # (and collated) by the collate thread, whose timer moved it.
            sample_timeout=None,
            **options,
        )
        values = []
        for batch in loader:
            values.extend(int(v) for v in batch)
            # Read while the loader's threads live: a thread's name goes with it.
            for tid in set(native):
                try:
                    with open(f"/proc/self/task/{tid}/comm") as comm:
                        names.add(comm.read().strip())
                except (FileNotFoundError, ProcessLookupError):
                    # The thread ended between the open and the read (a replaced
                    # or retired worker): its name went with it.
                    pass
            native.clear()
    assert sorted(values) == list(range(256))
    return names


def _without_this_thread(names: set[str]) -> set[str]:
    # (The first batch may go to the consumer, which waits for it anyway.)
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as comm:
        return names - {comm.read().strip()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for thread names")
def test_a_collate_that_draws_no_random_numbers_runs_on_the_workers_completing_batches() -> None:
    # As torch's workers each collate their batch: one collate thread among
    # many workers gets a core as seldom as any of them. Which worker collates
    # changes nothing it computes, for a collate that draws no random numbers.
    names = _without_this_thread(
        _thread_names_collating(marked_no_random(lambda samples: default_collate(samples)))
    )
    assert names and all(name.startswith("minato-worker") for name in names), names
    # A user's collate_fn, which may draw random numbers, too: it draws from
    # generators seeded for each batch, whichever thread collates it
    # (tests/test_reproducibility.py).
    names = _without_this_thread(_thread_names_collating(lambda samples: default_collate(samples)))
    assert names and all(name.startswith("minato-worker") for name in names), names
    # Beside worker processes, it runs on the collate thread, where their
    # samples are made.
    names = _thread_names_collating(
        lambda samples: default_collate(samples), worker_method="multiprocessing"
    )
    assert _without_this_thread(names) == {"minato-collate"}, names


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for thread names")
@pytest.mark.parametrize(
    "options",
    [{"worker_method": "auto"}, {"pin_memory": True}],
    ids=["defaults-on-threads", "pinned-threads"],
)
def test_minatos_own_collate_runs_on_the_workers_completing_batches_on_threads(
    monkeypatch, options
) -> None:
    # The defaults' collate (minato's, which can also stack samples from
    # worker processes) and a pinning one: on threads, the workers share the
    # collates, as torch's do, instead of one collate thread among them that
    # got a core as seldom as any (benchmarks/RESULTS.md).
    if options.get("pin_memory"):
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: None)
        monkeypatch.setattr(_collate_stage, "pinned", lambda batch, device: batch)
    names = _without_this_thread(_thread_names_collating(None, **options))
    assert names and all(name.startswith("minato-worker") for name in names), names


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for thread names")
def test_minatos_own_collate_keeps_the_collate_thread_on_worker_processes() -> None:
    # From worker processes it stacks samples from their slots, the GIL
    # released: taking it back among many worker threads slowed them.
    names = _thread_names_collating(None, worker_method="multiprocessing")
    assert _without_this_thread(names) == {"minato-collate"}, names


def _intra_op_threads_after_epochs(loader_type, **options) -> list[int]:
    counts = [torch.get_num_threads()]
    loader = loader_type(RangeDataset(64), batch_size=4, num_workers=2, **options)
    for _ in range(2):
        assert sum(len(batch) for batch in loader) == 64
        counts.append(torch.get_num_threads())
    del loader
    return counts


@pytest.mark.parametrize("method", ["thread", "multiprocessing"])
@pytest.mark.parametrize("shuffle", [True, False], ids=["sample-level", "batch-level"])
@pytest.mark.parametrize("pin", [False, True], ids=["unpinned", "pinned"])
@pytest.mark.parametrize(
    "collate", ["default", "marked-no-random", "custom"], ids=lambda name: f"{name}-collate"
)
def test_the_training_threads_intra_op_threads_are_its_own(
    monkeypatch, method: str, shuffle: bool, pin: bool, collate: str
) -> None:
    """torch limits its worker processes to one intra-op thread, never the
    training loop's: after epochs of minato, on every path (threads or
    processes, batches built by sample or by batch, pinned or not, a cheap
    batch collated by the consumer or not), the loop's thread keeps its count,
    as after torch's."""
    if pin:
        # Pinning needs an accelerator: stand one in, pinning as a no-op.
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: None)
        monkeypatch.setattr(_collate_stage, "pinned", lambda batch, device: batch)
    collate_fn = {
        "default": None,
        "marked-no-random": marked_no_random(lambda samples: default_collate(samples)),
        "custom": lambda samples: default_collate(samples),
    }[collate]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        options = dict(shuffle=shuffle, collate_fn=collate_fn)
        theirs = _intra_op_threads_after_epochs(torch.utils.data.DataLoader, **options)
        ours = _intra_op_threads_after_epochs(
            minato.DataLoader, **options, pin_memory=pin, worker_method=method
        )
    finally:
        torch.set_num_threads(before)
    assert theirs == [2, 2, 2]
    assert ours == theirs


def _minato_calls_per_batch(batch_size: int, batches: int, worker_method: str) -> float:
    """Calls made by minato's own code on this (the training) thread, per
    batch, over an epoch of sample-level batches: Python functions entered
    in minato's modules and C functions (dict methods, the extension's)
    called from them."""
    package = minato.__file__.rsplit("/", 1)[0] + "/"
    calls = 0

    def count(frame, event, arg) -> None:
        nonlocal calls
        if event in ("call", "c_call") and frame.f_code.co_filename.startswith(package):
            calls += 1

    loader = minato.DataLoader(
        RangeDataset(batch_size * batches),
        batch_size=batch_size,
        shuffle=True,
        num_workers=2,
        worker_method=worker_method,
        generator=torch.Generator().manual_seed(0),
    )
    iterator = iter(loader)
    next(iterator)  # the workers' start is not per batch
    seen = 1
    sys.setprofile(count)
    try:
        for _ in iterator:
            seen += 1
    finally:
        sys.setprofile(None)
    assert seen == batches
    return calls / (batches - 1)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("worker_method", ["thread", "multiprocessing"])
def test_the_training_thread_does_no_per_sample_work_in_minato(worker_method: str) -> None:
    # The engine's ledger keeps each sample's position and hands batches in
    # and out whole: eight times the samples per batch must not mean more
    # calls per batch (a per-sample dict operation alone would add 112).
    small = _minato_calls_per_batch(16, 24, worker_method)
    large = _minato_calls_per_batch(128, 24, worker_method)
    assert large < small + 32, (small, large)
