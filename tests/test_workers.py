"""Worker threads: where code runs, what get_worker_info() says, seeds, collate."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest
import torch
import torch.utils.data as tud
from helpers import RangeDataset, RichDataset, WorkerInfoDataset

import minato

pytestmark = pytest.mark.usefixtures("no_leaked_threads")


class RecordingDataset(RangeDataset):
    """Records, per item, the thread that loaded it and the worker info it saw."""

    def __init__(self, n: int = 40) -> None:
        super().__init__(n)
        self.lock = threading.Lock()
        self.seen: dict[int, tuple[int, object]] = {}

    def __getitem__(self, i: int) -> int:
        with self.lock:
            self.seen[i] = (threading.get_ident(), tud.get_worker_info())
        return i


def test_num_workers_0_loads_in_the_calling_thread() -> None:
    dataset = RecordingDataset()
    list(minato.DataLoader(dataset, batch_size=4))
    assert {ident for ident, _ in dataset.seen.values()} == {threading.get_ident()}
    assert {info for _, info in dataset.seen.values()} == {None}


def _multiprocessings_own(pid: str) -> bool:
    """multiprocessing's resource tracker or fork server, which an earlier
    test that made its objects in those contexts started."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
    except OSError:
        return True  # gone meanwhile
    own = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")
    return any(name in command for name in own)


def test_workers_are_threads_of_this_process_and_no_subprocess_starts() -> None:
    dataset = RecordingDataset()
    children_before = set(os.listdir(f"/proc/{os.getpid()}/task"))
    list(minato.DataLoader(dataset, batch_size=4, num_workers=3, worker_method="thread"))
    threads = {ident for ident, _ in dataset.seen.values()}
    assert threading.get_ident() not in threads
    assert 1 <= len(threads) <= 3
    assert multiprocessing.active_children() == []
    # No process was forked: this process has no child processes but
    # minato's fork server, which an earlier test with worker processes started.
    children = []
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
            children += f.read().split()
    zygote = minato._process.workers._the_zygote
    server = [] if zygote is None else [str(zygote.process.pid)]
    assert [c for c in children if c not in server and not _multiprocessings_own(c)] == []
    assert children_before  # /proc is readable here


def test_get_worker_info_is_per_thread_and_none_elsewhere() -> None:
    dataset = RecordingDataset(60)
    generator = torch.Generator().manual_seed(99)
    list(minato.DataLoader(dataset, batch_size=2, num_workers=3, generator=generator))
    base_seed = (
        torch.empty((), dtype=torch.int64)
        .random_(generator=torch.Generator().manual_seed(99))
        .item()
    )
    by_thread: dict[int, set[int]] = {}
    copies: dict[int, set[int]] = {}
    for ident, info in dataset.seen.values():
        assert info is not None
        assert info.num_workers == 3
        assert info.worker_method == "thread"
        # Each worker's own copy of the dataset, as each worker process has.
        assert info.dataset is not dataset
        assert type(info.dataset) is RecordingDataset
        assert info.dataset.seen is dataset.seen  # the data is shared, not copied
        assert info.seed == base_seed + info.id
        by_thread.setdefault(ident, set()).add(info.id)
        copies.setdefault(ident, set()).add(id(info.dataset))
    # One id and one dataset copy per thread, distinct across threads.
    assert all(len(ids) == 1 for ids in by_thread.values())
    assert all(len(ids) == 1 for ids in copies.values())
    assert len({next(iter(ids)) for ids in copies.values()}) == len(copies)
    assert len({next(iter(ids)) for ids in by_thread.values()}) == len(by_thread)
    assert tud.get_worker_info() is None
    assert torch.utils.data.dataloader.get_worker_info() is None


def test_seeds_come_from_the_generator_exactly_as_in_torch() -> None:
    def seeds(cls):
        loader = cls(
            WorkerInfoDataset(8),
            batch_size=1,
            num_workers=2,
            generator=torch.Generator().manual_seed(5),
            # A fixed pool, as torch's: an adaptive one may add threads, ids 2, 3, ...
            **({"adaptive": False} if cls is minato.DataLoader else {}),
        )
        return {(b["id"].item(), b["seed"].item()) for b in loader}

    # Which threads served depends on timing (one may take every sample);
    # each one's (id, seed) is torch's worker's.
    ours = seeds(minato.DataLoader)
    assert ours and ours <= seeds(tud.DataLoader)


def test_worker_rng_drives_thread_safe_generator() -> None:
    if not hasattr(torch, "thread_safe_generator"):
        pytest.skip("torch.thread_safe_generator needs torch 2.15")

    class Draws(RangeDataset):
        def __getitem__(self, i):
            info = tud.get_worker_info()
            generator = torch.thread_safe_generator()
            assert generator is info.rng.torch_generator
            return info.id, torch.randint(0, 2**30, (1,), generator=generator).item()

    def draws(seed):
        loader = minato.DataLoader(
            Draws(20), batch_size=None, num_workers=2, generator=torch.Generator().manual_seed(seed)
        )
        return sorted((int(w), int(v)) for w, v in loader)

    assert torch.thread_safe_generator() is None
    first = draws(1)
    assert len(set(first)) == 20  # per-worker streams, not one shared stream
    assert isinstance(first[0][1], int)


def test_worker_init_fn_runs_once_in_each_worker_thread() -> None:
    calls = []
    lock = threading.Lock()

    def init(worker_id: int) -> None:
        info = tud.get_worker_info()
        with lock:
            calls.append((worker_id, info.id, threading.get_ident()))

    dataset = RecordingDataset(50)
    loader = minato.DataLoader(
        dataset, batch_size=2, num_workers=4, worker_init_fn=init, adaptive=False
    )
    list(loader)
    assert sorted(worker for worker, _, _ in calls) == [0, 1, 2, 3]
    assert all(worker == info_id for worker, info_id, _ in calls)
    assert len({ident for _, _, ident in calls}) == 4
    # The threads that loaded data are the ones that ran worker_init_fn.
    assert {ident for ident, _ in dataset.seen.values()} <= {ident for _, _, ident in calls}


def test_default_collate_allocates_no_shared_memory_in_worker_threads() -> None:
    seen_info_in_collate = []

    def collate(items):
        seen_info_in_collate.append(tud.get_worker_info())
        return tud.default_collate(items)

    for batch in minato.DataLoader(RichDataset(8), batch_size=4, num_workers=2):
        assert not batch["tensor"].is_shared()
        assert not batch["array"].is_shared()
    for batch in minato.DataLoader(RichDataset(8), batch_size=4, num_workers=2, collate_fn=collate):
        assert not batch["tensor"].is_shared()
    # collate_fn still runs inside the worker, as in torch.
    assert all(info is not None and info.worker_method == "thread" for info in seen_info_in_collate)


def test_torchs_own_loader_is_untouched_by_minato() -> None:
    # Worker processes still see their own info and still collate into shared memory.
    loader = tud.DataLoader(RichDataset(4), batch_size=2, num_workers=1)
    assert all(batch["tensor"].is_shared() for batch in loader)
    infos = [
        b["id"].tolist() for b in tud.DataLoader(WorkerInfoDataset(4), batch_size=2, num_workers=2)
    ]
    assert sorted(x for ids in infos for x in ids) == [0, 0, 1, 1]
