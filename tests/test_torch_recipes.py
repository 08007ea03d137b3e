"""torch's documented DataLoader recipes, run through torch's DataLoader and
minato's side by side, asserting the same outcome.

torch's worker *processes* each have their own dataset object and their own
``random``, numpy and torch generators; minato's worker threads must give a
program the same (see minato/_thread/dataset.py, minato/_thread/generators.py).
The recipes are those of torch's ``IterableDataset`` docstring (sharding in
``__iter__`` and in ``worker_init_fn``), its reproducibility notes
(``seed_worker`` with ``generator=``), and the per-worker file-handle pattern
that h5py/LMDB/sqlite users follow.
"""

from __future__ import annotations

import math
import random
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
import torch.utils.data as tud

import minato

pytestmark = pytest.mark.timeout(60)

LOADERS = [
    pytest.param(tud.DataLoader, id="torch"),
    pytest.param(minato.DataLoader, id="minato"),
]


def fixed_pool(loader_type: Any) -> dict[str, Any]:
    """Options for comparing worker ids with torch: minato's adaptive pool
    would add threads (with new ids) on a loop waiting for data, and so would
    replacements for samples flagged slow on a loaded machine."""
    if loader_type is minato.DataLoader:
        return {"adaptive": False, "max_slow_samples": 0}
    return {}


def as_ints(batches: Any) -> list[int]:
    out: list[int] = []
    for batch in batches:
        out.extend(torch.as_tensor(batch).reshape(-1).tolist())
    return out


# ---------------------------------------------------------------- IterableDataset sharding


class RangeIterable(tud.IterableDataset):
    """torch's docstring example: an iterable over range(start, end)."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__()
        assert end > start
        self.start = start
        self.end = end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))


class ShardedInIter(RangeIterable):
    """torch's docstring, example 1: each worker takes its share in __iter__."""

    def __iter__(self) -> Iterator[int]:
        worker_info = tud.get_worker_info()
        if worker_info is None:
            iter_start, iter_end = self.start, self.end
        else:
            per_worker = int(math.ceil((self.end - self.start) / float(worker_info.num_workers)))
            iter_start = self.start + worker_info.id * per_worker
            iter_end = min(iter_start + per_worker, self.end)
        return iter(range(iter_start, iter_end))


def shard_in_worker_init_fn(worker_id: int) -> None:
    """torch's docstring, example 2: worker_init_fn edits the worker's dataset."""
    worker_info = tud.get_worker_info()
    dataset = worker_info.dataset  # the dataset copy in this worker process
    overall_start = dataset.start
    overall_end = dataset.end
    per_worker = int(math.ceil((overall_end - overall_start) / float(worker_info.num_workers)))
    worker_id = worker_info.id
    dataset.start = overall_start + worker_id * per_worker
    dataset.end = min(dataset.start + per_worker, overall_end)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_sharding_in_worker_init_fn_gives_torch_epochs(workers: int, persistent: bool) -> None:
    outcomes = []
    for loader_type in (tud.DataLoader, minato.DataLoader):
        dataset = RangeIterable(3, 17)
        loader = loader_type(
            dataset,
            num_workers=workers,
            worker_init_fn=shard_in_worker_init_fn,
            persistent_workers=persistent,
        )
        epochs = [sorted(as_ints(loader)) for _ in range(3)]
        # The caller's dataset is never changed by iterating.
        assert (dataset.start, dataset.end) == (3, 17)
        outcomes.append(epochs)
    assert outcomes[0] == outcomes[1] == [list(range(3, 17))] * 3


@pytest.mark.parametrize("loader_type", LOADERS)
def test_sharding_in_iter_gives_each_sample_once(loader_type: Any) -> None:
    # The docstring's own assertions, torch's and minato's alike.
    dataset = ShardedInIter(3, 7)
    assert sorted(as_ints(loader_type(dataset, num_workers=2))) == [3, 4, 5, 6]
    assert sorted(as_ints(loader_type(dataset, num_workers=12))) == [3, 4, 5, 6]


# ---------------------------------------------------------------- per-worker handles


class SqliteRows(tud.Dataset):
    """Opens its connection lazily, in the worker that uses it, as users do
    with h5py/LMDB/sqlite handles that cannot cross processes. sqlite's
    connection refuses to be used from a thread other than its creator's."""

    def __init__(self, path: Path, n: int) -> None:
        self.path = path
        self.n = n
        self.connection: sqlite3.Connection | None = None
        self.opened = Counter()  # shared by every copy: who opened a connection

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if self.connection is None:
            self.connection = sqlite3.connect(self.path)
            self.opened[threading.get_ident()] += 1
        (value,) = self.connection.execute("SELECT v FROM t WHERE k = ?", (i,)).fetchone()
        return value


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "rows.sqlite"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER)")
        connection.executemany("INSERT INTO t VALUES (?, ?)", [(i, i * 10) for i in range(64)])
    connection.close()
    return path


def wrapped(kind: str, dataset: tud.Dataset) -> tuple[tud.Dataset, list[int]]:
    """`dataset` under one of torch's wrappers, and the values it holds."""
    if kind == "plain":
        return dataset, [i * 10 for i in range(64)]
    if kind == "subset":
        indices = list(range(0, 64, 2))
        return tud.Subset(dataset, indices), [i * 10 for i in indices]
    if kind == "random_split":
        first, _ = tud.random_split(dataset, [48, 16], generator=torch.Generator().manual_seed(0))
        return first, [i * 10 for i in first.indices]
    assert kind == "concat"
    return tud.ConcatDataset([dataset, dataset]), [i * 10 for i in range(64)] * 2


@pytest.mark.parametrize("kind", ["plain", "subset", "random_split", "concat"])
@pytest.mark.parametrize("loader_type", LOADERS)
def test_a_lazily_opened_handle_is_per_worker(database: Path, loader_type: Any, kind: str) -> None:
    rows = SqliteRows(database, 64)
    dataset, expected = wrapped(kind, rows)
    loader = loader_type(
        dataset, batch_size=4, shuffle=True, num_workers=3, **fixed_pool(loader_type)
    )
    for _ in range(2):
        rows.opened.clear()
        # A connection used from another thread than its creator's raises.
        assert sorted(as_ints(loader)) == sorted(expected)
        # One connection per worker (a process's count stays in the process).
        assert all(count == 1 for count in rows.opened.values())
        assert len(rows.opened) <= 3
    # The caller's dataset opened none.
    assert rows.connection is None


# ---------------------------------------------------------------- seed_worker and generator=


def seed_worker(worker_id: int) -> None:
    """torch's reproducibility recipe (docs: Randomness in multi-process data loading)."""
    worker_seed = torch.initial_seed() % 2**32
    numpy.random.seed(worker_seed)
    random.seed(worker_seed)


class Augmenting(tud.Dataset):
    """Draws from every process-wide generator, as augmentations do."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = tud.get_worker_info()
        return {
            "index": i,
            "worker": info.id,
            "seed": info.seed,
            "initial_seed": torch.initial_seed(),
            "random": random.random(),
            "numpy": float(numpy.random.rand()),
            "torch": float(torch.rand(())),
        }


def loop_draws() -> tuple[float, float, float]:
    return random.random(), float(numpy.random.rand()), float(torch.rand(()))


def run_seeded(loader_type: Any, epochs: int, **options: Any) -> tuple[list[list[dict]], bool]:
    """Runs a seed_worker loader; returns its samples per epoch and whether
    the training loop's own generators were left alone meanwhile."""
    g = torch.Generator()
    g.manual_seed(0)
    random.seed(1)
    numpy.random.seed(1)
    torch.manual_seed(1)
    loader = loader_type(
        Augmenting(),
        batch_size=None,
        num_workers=2,
        worker_init_fn=seed_worker,
        generator=g,
        **options,
        **fixed_pool(loader_type),
    )
    runs = [list(loader) for _ in range(epochs)]
    after = loop_draws()
    random.seed(1)
    numpy.random.seed(1)
    torch.manual_seed(1)
    return runs, after == loop_draws()


def worker_streams(epoch: list[dict]) -> dict[int, list[tuple[float, float, float]]]:
    """Each worker's draws, in the order it made them."""
    streams: dict[int, list[tuple[float, float, float]]] = {}
    for sample in epoch:
        streams.setdefault(sample["worker"], []).append(
            (sample["random"], sample["numpy"], sample["torch"])
        )
    return streams


def expected_stream(seed: int, count: int) -> list[tuple[float, float, float]]:
    """What a worker process seeded by seed_worker draws (torch seeds its
    global generator with the worker's seed; seed_worker the other two)."""
    python = random.Random(seed % 2**32)
    legacy = numpy.random.RandomState(seed % 2**32)
    generator = torch.Generator().manual_seed(seed)
    return [
        (python.random(), float(legacy.rand()), float(torch.rand((), generator=generator)))
        for _ in range(count)
    ]


@pytest.mark.parametrize("persistent", [False, True])
def test_seed_worker_gives_each_worker_its_process_streams(persistent: bool) -> None:
    for loader_type in (tud.DataLoader, minato.DataLoader):
        epochs, loop_untouched = run_seeded(loader_type, 3, persistent_workers=persistent)
        # The training loop's random, numpy and torch streams are untouched.
        assert loop_untouched, loader_type
        seeds = []
        for epoch in epochs:
            assert sorted(sample["index"] for sample in epoch) == list(range(16))
            for sample in epoch:
                # torch.initial_seed() in a worker is that worker's seed.
                assert sample["initial_seed"] == sample["seed"], loader_type
            seeds.append({sample["worker"]: sample["seed"] for sample in epoch})
        # torch: a persistent worker's streams go on from one epoch to the
        # next. minato seeds each sample's draws from the epoch's seed and
        # its position instead (see test_reproducibility.py): which worker
        # loads it does not matter.
        runs, run_seeds = epochs, seeds
        if persistent:
            runs = [[sample for epoch in epochs for sample in epoch]]
            run_seeds = [{w: seed for epoch_seeds in seeds for w, seed in epoch_seeds.items()}]
        for run, epoch_seeds in zip(runs, run_seeds, strict=True):
            if loader_type is minato.DataLoader:
                break
            for worker, stream in worker_streams(run).items():
                assert stream == expected_stream(epoch_seeds[worker], len(stream)), loader_type
        for epoch_seeds in seeds:
            assert len(set(epoch_seeds.values())) == len(epoch_seeds)  # distinct per worker
        if persistent:  # a worker keeps its seed, as a persistent process does
            # (On a loaded machine one worker may load every sample of an
            # epoch while the other starts: each is judged where it loaded.)
            for worker in set().union(*seeds):
                assert len({epoch[worker] for epoch in seeds if worker in epoch}) == 1
        else:  # a new base seed each epoch
            assert len({s for epoch_seeds in seeds for s in epoch_seeds.values()}) == sum(
                len(epoch_seeds) for epoch_seeds in seeds
            )


def test_seed_worker_augmentations_differ_between_workers_and_epochs() -> None:
    epochs, _ = run_seeded(minato.DataLoader, 3)
    values = [sample["random"] for epoch in epochs for sample in epoch]
    assert len(set(values)) == len(values) == 48


def draws_by_index(epochs: list[list[dict]]) -> list[dict[int, tuple]]:
    return [{s["index"]: (s["random"], s["numpy"], s["torch"]) for s in epoch} for epoch in epochs]


@pytest.mark.parametrize("persistent", [False, True])
def test_seed_worker_runs_repeat_whatever_the_pool(persistent: bool) -> None:
    """With seed_worker in worker_init_fn and a seeded generator, each
    sample draws the same numbers run after run, whichever worker loads it
    and however many workers there are."""
    first, _ = run_seeded(minato.DataLoader, 3, persistent_workers=persistent)
    again, _ = run_seeded(minato.DataLoader, 3, persistent_workers=persistent)
    assert draws_by_index(first) == draws_by_index(again)


def test_same_generator_same_base_seeds_as_torch() -> None:
    torch_epochs, _ = run_seeded(tud.DataLoader, 2)
    minato_epochs, _ = run_seeded(minato.DataLoader, 2)
    for torch_epoch, minato_epoch in zip(torch_epochs, minato_epochs, strict=True):
        # One base seed per epoch, the same; worker w's seed is base + w.
        # (Which workers served depends on timing; their seeds do not.)
        base_seeds = [
            {s["seed"] - s["worker"] for s in epoch} for epoch in (torch_epoch, minato_epoch)
        ]
        assert len(base_seeds[0]) == 1
        assert base_seeds[0] == base_seeds[1]


def reseeding_init_fn(worker_id: int) -> None:
    torch.manual_seed(1234 + worker_id)
    random.seed(1234 + worker_id)
    numpy.random.seed(1234 + worker_id)


@pytest.mark.parametrize("loader_type", LOADERS)
def test_worker_init_fn_reseeding_stays_in_the_worker(loader_type: Any) -> None:
    torch.manual_seed(7)
    random.seed(7)
    numpy.random.seed(7)
    initial = torch.initial_seed()
    loader = loader_type(
        Augmenting(),
        batch_size=None,
        num_workers=2,
        worker_init_fn=reseeding_init_fn,
        generator=torch.Generator().manual_seed(0),  # the base seed is not drawn from the loop's
        **fixed_pool(loader_type),
    )
    samples = list(loader)
    assert torch.initial_seed() == initial == 7
    assert {s["initial_seed"] for s in samples} <= {1234, 1235}
    after = loop_draws()
    torch.manual_seed(7)
    random.seed(7)
    numpy.random.seed(7)
    assert after == loop_draws()


# ---------------------------------------------------------------- determinism


@pytest.fixture
def deterministic() -> Iterator[None]:
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def test_deterministic_mode_repeats_torch_exactly(deterministic: None) -> None:
    """With deterministic algorithms on (Lightning's deterministic=True), a
    seeded, shuffled loader gives torch's batches, augmentations included."""

    def run(loader_type: Any) -> list[Any]:
        runs, _ = run_seeded(loader_type, 2)
        return runs

    expected = run(tud.DataLoader)
    assert run(minato.DataLoader) == expected
    assert run(minato.DataLoader) == expected


def test_deterministic_mode_keeps_the_order_of_a_shuffled_loader(deterministic: None) -> None:
    def order(loader_type: Any) -> list[int]:
        loader = loader_type(
            range(64),
            batch_size=4,
            shuffle=True,
            num_workers=3,
            generator=torch.Generator().manual_seed(3),
        )
        return as_ints(loader)

    assert order(minato.DataLoader) == order(tud.DataLoader)


# ---------------------------------------------------------------- typing


def test_dataloader_is_generic_like_torchs() -> None:
    alias = minato.DataLoader[int]
    assert alias.__origin__ is minato.DataLoader
    assert tud.DataLoader[int].__origin__ is tud.DataLoader

    def annotated() -> minato.DataLoader[tuple[torch.Tensor, int]]:
        return minato.DataLoader(range(4))

    assert isinstance(annotated(), tud.DataLoader)
