"""get_worker_info() in minato's worker threads, composed with torch's own workers."""

from __future__ import annotations

import contextvars
import functools
import threading
import types
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils.data as tud
from helpers import EVERY_WORKER_KIND, RangeDataset
from torch.utils.data._utils import worker as torch_worker

import minato
from minato._thread import torch_threads as _torch_threads
from minato._thread import worker_info as _worker_info
from minato._util import warn_once as _warn_once

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaked_threads")]


class InfoRecordingDataset(tud.Dataset):
    """Item i is what `get_worker_info` (torch's, unless given another) says while loading it."""

    def __init__(self, n: int = 24, get_worker_info: Callable[[], object] | None = None) -> None:
        self.n = n
        self.get_worker_info = get_worker_info

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, object]:
        get_info = self.get_worker_info or tud.get_worker_info
        info = get_info()
        alias = torch_worker.get_worker_info()
        return {
            "index": i,
            "thread": threading.get_ident(),
            "info": info,
            "alias_is_same": alias is info,
        }


def _fixed_pool_loader(dataset: tud.Dataset, **options: object) -> minato.DataLoader:
    # As torch's pool: an adaptive one may add workers, with ids 2, 3, ...
    return minato.DataLoader(dataset, adaptive=False, **options)


def _records(loader: tud.DataLoader) -> list[dict[str, object]]:
    return [record for batch in loader for record in batch]


def _list_collate(batch: list) -> list:
    return batch


def _worker_id(_: int) -> int:
    info = tud.get_worker_info()
    return -1 if info is None else info.id


class WorkerIdDataset(tud.Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        return _worker_id(i)


def test_each_worker_thread_sees_its_own_info_through_torch_and_its_alias() -> None:
    assert tud.get_worker_info() is None
    dataset = InfoRecordingDataset(30)
    generator = torch.Generator().manual_seed(7)
    loader = _fixed_pool_loader(
        dataset, batch_size=3, num_workers=3, collate_fn=_list_collate, generator=generator
    )
    records = _records(loader)
    base_seed = (
        torch.empty((), dtype=torch.int64)
        .random_(generator=torch.Generator().manual_seed(7))
        .item()
    )
    assert sorted(r["index"] for r in records) == list(range(30))
    ids_by_thread: dict[object, set[int]] = {}
    for record in records:
        info = record["info"]
        assert info is not None
        assert record["alias_is_same"]
        assert record["thread"] != threading.get_ident()
        assert info.num_workers == 3
        assert info.seed == base_seed + info.id
        assert type(info.dataset) is InfoRecordingDataset and info.dataset is not dataset
        ids_by_thread.setdefault(record["thread"], set()).add(info.id)
    assert all(len(ids) == 1 for ids in ids_by_thread.values())
    assert len({next(iter(ids)) for ids in ids_by_thread.values()}) == len(ids_by_thread)
    assert tud.get_worker_info() is None
    assert torch_worker.get_worker_info() is None


def test_torch_worker_processes_still_see_their_info_beside_minato() -> None:
    dataset = WorkerIdDataset()
    minato_ids = {
        i
        for batch in _fixed_pool_loader(dataset, batch_size=2, num_workers=2)
        for i in batch.tolist()
    }
    torch_ids = {
        i for batch in tud.DataLoader(dataset, batch_size=2, num_workers=2) for i in batch.tolist()
    }
    assert minato_ids <= {0, 1} and minato_ids
    assert torch_ids == {0, 1}
    assert tud.get_worker_info() is None


def _in_thread(function: Callable[[], object]) -> object:
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(function()))
    thread.start()
    thread.join()
    return result[0]


def test_other_threads_get_torchs_own_answer_from_the_swapped_function(monkeypatch) -> None:
    # torch 2.15 keeps one global, set in each worker process: every thread
    # but minato's gets what torch's own code returns, here a stand-in value
    # (as in a minato loader run inside one of torch's worker processes).
    torch_info = object()
    assert tud.get_worker_info() is None
    monkeypatch.setattr(torch_worker, "_worker_info", torch_info)
    assert _in_thread(tud.get_worker_info) is torch_info
    records = _records(
        _fixed_pool_loader(
            InfoRecordingDataset(8), batch_size=2, num_workers=2, collate_fn=_list_collate
        )
    )
    assert all(r["info"].worker_method == "thread" for r in records)
    assert tud.get_worker_info() is torch_info
    monkeypatch.undo()
    assert tud.get_worker_info() is None


TORCH_MAIN_GET_WORKER_INFO = '''
import threading
_worker_info = None
_thread_local_worker_info = threading.local()

def get_worker_info():
    """Stand-in for torch main's: its thread workers set the thread-local."""
    thread_local_worker_info = getattr(_thread_local_worker_info, "worker_info", None)
    if thread_local_worker_info is not None:
        return thread_local_worker_info
    return _worker_info
'''

CONTEXT_VAR_GET_WORKER_INFO = """
import contextvars
_worker_info = None
_current = contextvars.ContextVar("worker_info", default=None)

def get_worker_info():
    info = _current.get()
    return _worker_info if info is None else info
"""


def _torch_module(source: str) -> types.ModuleType:
    module = types.ModuleType("stand_in_torch_worker")
    exec(source, vars(module))
    return module


def _set_as_torch_thread_worker(module: types.ModuleType, info: object) -> None:
    if isinstance(getattr(module, "_current", None), contextvars.ContextVar):
        module._current.set(info)
    else:
        module._thread_local_worker_info.worker_info = info


@pytest.mark.parametrize("source", [TORCH_MAIN_GET_WORKER_INFO, CONTEXT_VAR_GET_WORKER_INFO])
def test_a_torch_with_per_thread_info_is_left_as_is_and_shared(monkeypatch, source) -> None:
    module = _torch_module(source)
    code = module.get_worker_info.__code__
    monkeypatch.setattr(_worker_info, "_set_torch_thread_info", None)
    _worker_info.install_into(module.get_worker_info)
    assert module.get_worker_info.__code__ is code  # not swapped: minato steps aside
    assert module.get_worker_info() is None  # the probe left the main thread as it was

    # A plain thread standing in for one of torch's own thread workers.
    torch_info = object()

    def torch_thread_worker() -> object:
        _set_as_torch_thread_worker(module, torch_info)
        return module.get_worker_info()

    assert _in_thread(torch_thread_worker) is torch_info

    # minato's worker threads put their WorkerInfo where torch keeps its own.
    records = _records(
        _fixed_pool_loader(
            InfoRecordingDataset(12, module.get_worker_info),
            batch_size=2,
            num_workers=2,
            collate_fn=_list_collate,
        )
    )
    infos = [r["info"] for r in records]
    assert all(info is not None and info.worker_method == "thread" for info in infos)
    assert all(r["alias_is_same"] for r in records)  # the very WorkerInfo torch's gives
    assert {info.id for info in infos} <= {0, 1}
    assert module.get_worker_info() is None


def _changed_get_worker_info() -> object:
    return torch_worker._worker_info or "changed"


@pytest.mark.parametrize(
    "get_worker_info",
    [_changed_get_worker_info, functools.partial(_changed_get_worker_info)],
    ids=["other code", "not a function"],
)
def test_an_unknown_get_worker_info_is_left_alone_with_one_warning(
    monkeypatch, get_worker_info
) -> None:
    code = _changed_get_worker_info.__code__
    monkeypatch.setattr(_warn_once, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _worker_info.install_into(get_worker_info)
        _worker_info.install_into(get_worker_info)
    assert _changed_get_worker_info.__code__ is code
    assert get_worker_info() == "changed"
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "get_worker_info is not the code minato knows" in messages[0]
    assert "_minato_thread_worker_info" not in globals()


def test_installing_again_changes_nothing() -> None:
    get_worker_info = torch_worker.get_worker_info
    code = get_worker_info.__code__
    _torch_threads.install()
    assert get_worker_info.__code__ is code
    assert tud.get_worker_info is get_worker_info
    assert tud.get_worker_info() is None


def collate_seeing_worker_info(samples: list[int]) -> tuple[Any, list[int]]:
    info = tud.get_worker_info()
    seen = None if info is None else (info.num_workers, type(info.dataset).__name__)
    return seen, samples


@EVERY_WORKER_KIND
def test_a_collate_fn_sees_a_worker_info_wherever_it_runs(
    loader_type: type, options: dict[str, Any]
) -> None:
    """torch's collate_fn runs in a worker process: get_worker_info() is
    never None there. minato's collates on a worker thread, or on its
    collate thread (worker processes' samples, shuffled): the same answer."""
    loader = loader_type(
        RangeDataset(16),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        collate_fn=collate_seeing_worker_info,
        **options,
    )
    seen = [info for info, _ in loader]
    assert seen == [(2, "RangeDataset")] * 4
