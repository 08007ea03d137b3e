"""Batch arenas (rust/wire/arena.rs, arena_pool.rs): worker processes write
each sample's large leaves into its place in its batch's shared memory, and
a batch whose samples all kept their places is handed out as it lies there.

What must hold whatever the order of events: a batch or leaf the loader
handed out keeps its values (no place is written twice in a generation, an
arena is reused only once nothing refers to it), every sample arrives once,
and batches are default_collate's.
"""

from __future__ import annotations

import collections
import gc
import os
import signal
import time
import weakref

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from helpers import DeclaredShuffle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minato
from minato import _minato
from minato._minato import ArenaPool, ArenaWriter
from minato._process import ipc as _ipc

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not _ipc._can_share(), reason="no memfd here"),
]

IMAGE = (3, 64, 96)  # 72 KiB of float32: past SHARE_MIN_BYTES


class Samples(tud.Dataset):
    """Each sample's leaves hold its index: a tensor, an array, a label."""

    def __init__(self, size: int = 192, slow: int | None = None) -> None:
        self.size, self.slow = size, slow

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        if index == self.slow and tud.get_worker_info() is not None:
            time.sleep(1.0)
        image = torch.full(IMAGE, float(index))
        depth = np.full((100, 96), index, dtype=np.float64)
        return {"image": image, "depth": depth, "label": index}


def _check(batches: list) -> list[int]:
    """Every sample's leaves hold its index; the indices seen."""
    seen = []
    for batch in batches:
        for image, depth, label in zip(batch["image"], batch["depth"], batch["label"], strict=True):
            index = int(label)
            seen.append(index)
            assert torch.all(image == index) and torch.all(depth == index), index
    return seen


def _count_in_place(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts = {"in place": 0, "stacked": 0}
    arena_batch = _minato._arena_batch

    def counting(batch):
        found = arena_batch(batch)
        counts["in place" if found is not None else "stacked"] += 1
        return found

    monkeypatch.setattr(_minato, "_arena_batch", counting)
    return counts


@pytest.mark.parametrize("persistent", [False, True])
def test_batches_handed_out_in_place_keep_their_values_across_epochs(
    monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    counts = _count_in_place(monkeypatch)
    loader = minato.DataLoader(
        Samples(),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        worker_method="multiprocessing",
        persistent_workers=persistent,
        generator=torch.Generator().manual_seed(3),
    )
    held = []  # every batch of both epochs stays alive: no arena is reused under it
    for _ in range(2):
        epoch = list(loader)
        assert sorted(_check(epoch)) == list(range(192))
        held.extend(epoch)
    # Batches of the first epoch still hold their samples after the second.
    assert sorted(_check(held)) == sorted(list(range(192)) * 2)
    # Once the first samples told the loader their layout, batches were
    # handed out as they lay (both leaves: image and depth).
    assert counts["in place"] >= 2 * (192 // 8 - 4)
    images = held[-1]["image"]
    assert images.is_contiguous() and images.shape == (8, *IMAGE)


def _epochs_beside_torchs(dataset: tud.Dataset, seed: int) -> tuple[list, list]:
    """One shuffled epoch of `dataset` on minato's worker processes, and
    torch's, in the same order."""

    def epoch(cls, **options):
        loader = cls(
            dataset,
            batch_size=8,
            shuffle=True,
            num_workers=2,
            generator=torch.Generator().manual_seed(seed),
            **options,
        )
        return list(loader)

    return epoch(minato.DataLoader, worker_method="multiprocessing"), epoch(tud.DataLoader)


def test_the_same_batches_as_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = _count_in_place(monkeypatch)
    ours, theirs = _epochs_beside_torchs(Samples(96), 11)
    assert counts["in place"] > 0
    assert len(ours) == len(theirs)
    for mine, torchs in zip(ours, theirs, strict=True):
        assert torch.equal(mine["label"], torchs["label"])
        assert torch.equal(mine["image"], torchs["image"])
        assert torch.equal(mine["depth"], torchs["depth"])
        assert mine["depth"].dtype == torchs["depth"].dtype == torch.float64


def test_a_sample_that_leaves_its_batch_is_stacked_and_no_place_is_lost() -> None:
    # Sample 0 (and the run it went in) runs late and joins later batches;
    # the batches they left take other samples in their places, so those are
    # stacked from where their leaves lie, and the late samples' leaves stay
    # where they wrote them.
    loader = minato.DataLoader(
        Samples(slow=0),
        batch_size=8,
        sampler=DeclaredShuffle(192),
        num_workers=2,
        worker_method="multiprocessing",
        sample_timeout=0.2,
    )
    batches = list(loader)
    assert sorted(_check(batches)) == list(range(192))
    assert loader.stats().moved_samples >= 1


class Tracked(tud.Dataset):
    """Each sample tells how many of the large tensors this copy of the
    dataset returned before are still alive as it begins."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.returned: list[weakref.ref] = []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        alive = sum(reference() is not None for reference in self.returned)
        image = torch.full(IMAGE, float(index))
        self.returned.append(weakref.ref(image))
        return {"image": image, "alive": alive}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_process_holds_no_earlier_samples_leaves_while_it_loads(workers: int) -> None:
    # A run of samples writes each sample's large leaves into its place as
    # the sample is loaded, and the last run's samples are let go once
    # sent: a worker's heap holds one sample's tensors, not two runs' (the
    # first run of each worker has no places yet: its layout is unknown).
    loader = minato.DataLoader(
        Tracked(96),
        batch_size=8,
        shuffle=True,
        num_workers=workers,
        worker_method="multiprocessing",
    )
    alive = [int(count) for batch in loader for count in batch["alive"]]
    assert len(alive) == 96
    assert alive.count(0) >= 48, sorted(alive)


Point = collections.namedtuple("Point", ["image", "label"])


class Structured(tud.Dataset):
    """Samples of one structure each: containers the worker walks, and
    those it leaves to the pickler whole."""

    def __init__(self, structure: str) -> None:
        self.structure = structure

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int):
        image = torch.arange(48 * 1024, dtype=torch.float32) + index
        wide = torch.full((64, 1024), index, dtype=torch.bfloat16)
        depth = np.full((100, 96), index, dtype=np.float64)
        if self.structure == "containers":
            # One tensor met twice; a small tensor, a view, nested containers.
            return {
                "image": image,
                "again": image,
                "depth": depth,
                "small": torch.tensor([index]),
                "label": np.int64(index),
                "nested": [(wide.t(), index), {"scale": index / 2, "name": f"s{index}"}],
            }
        if self.structure == "namedtuple":
            return Point(image, index), depth
        if self.structure == "shared":
            return image.share_memory_(), depth
        return image[::2], index  # a strided view of a larger tensor


@pytest.mark.parametrize("structure", ["containers", "namedtuple", "shared", "view"])
def test_samples_of_every_structure_arrive_as_torchs(structure: str) -> None:
    ours, theirs = _epochs_beside_torchs(Structured(structure), 5)
    leaves_theirs = torch.utils._pytree.tree_leaves(theirs)
    leaves_ours = torch.utils._pytree.tree_leaves(ours)
    assert len(leaves_ours) == len(leaves_theirs)
    for mine, torchs in zip(leaves_ours, leaves_theirs, strict=True):
        if isinstance(torchs, torch.Tensor):
            assert mine.dtype == torchs.dtype and torch.equal(mine, torchs)
        else:
            assert mine == torchs


def test_batches_of_whichever_samples_finish_first_stop_the_lending() -> None:
    loader = minato.DataLoader(
        Samples(),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        worker_method="multiprocessing",
        in_order=False,
    )
    assert sorted(_check(list(loader))) == list(range(192))


# --- The protocol, in one process: the loader's pool and a worker's writer ---

NBYTES = 64 * 1024
PLACES = 4


class Loader:
    """The loader's side and one worker process's, over one pool."""

    def __init__(self) -> None:
        self.pool, self.writer = ArenaPool(PLACES), ArenaWriter()
        self.pool.offer_layout([NBYTES])
        self.next_position = 0

    def submit(self) -> list[int]:
        first = self.next_position
        self.pool.expect(first, 0, PLACES)
        self.next_position += PLACES
        return list(range(first, first + PLACES))

    def load(self, position: int, value: float):
        """The sample at `position`, as its worker writes and the loader reads it."""
        places, held, announce, forget = self.pool.place(0, [(position, None, None)])
        for arena, fd, size, places_, leaf_bytes in announce:
            self.writer.map(arena, fd, size, places_, leaf_bytes)
        self.writer.forget(forget)
        data = np.full(NBYTES // 8, value, dtype=np.float64)
        place = places[0]
        if place is None or not self.writer.place(*place, 0, data.view(np.uint8)):
            return ("copy", value, torch.from_numpy(data.copy()))
        leaf = self.pool.leaf(*place, 0, NBYTES, torch.float64, (NBYTES // 8,), False)
        del held
        return ("leaf", value, leaf)


def _values_held(held: list) -> None:
    for kind, value, thing in held:
        if kind == "batch":
            assert torch.all(thing == torch.tensor(value).unsqueeze(1)), value
        elif kind == "leaf":
            assert np.all(np.frombuffer(thing, dtype=np.float64) == value), value
        else:
            assert torch.all(thing == value), value


def _collate(batch: list[tuple], reverse: bool) -> list[tuple]:
    """What the user holds of a batch: the batch as it lay in its arena, or
    (stacked by copying, or kept by the collate_fn) its samples."""
    if reverse:
        batch = batch[::-1]
    leaves = [thing for kind, _, thing in batch if kind == "leaf"]
    in_place = _minato._arena_batch(leaves) if len(leaves) == PLACES else None
    if in_place is None:
        return batch
    stacked = torch.frombuffer(in_place, dtype=torch.uint8).view(torch.float64)
    return [("batch", [value for _, value, _ in batch], stacked.view(PLACES, -1))]


_operations = st.lists(
    st.one_of(
        st.tuples(st.just("submit")),
        st.tuples(st.just("load"), st.integers(0, 1_000)),
        st.tuples(st.just("collate"), st.booleans()),
        st.tuples(st.just("drop"), st.integers(0, 1_000)),
    ),
    max_size=50,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_operations)
def test_whatever_the_order_what_is_held_keeps_its_values_and_arenas_come_back(
    operations,
) -> None:
    loader = Loader()
    pending: list[int] = []  # submitted, not loaded
    arrived: list[tuple] = []  # loaded, not collated
    held: list[tuple] = []  # what the user (or a sample) holds
    value = 0.0
    for operation in operations:
        if operation[0] == "submit":
            pending.extend(loader.submit())
        elif operation[0] == "load" and pending:
            position = pending.pop(operation[1] % len(pending))
            value += 1.0
            arrived.append(loader.load(position, value))
        elif operation[0] == "collate" and len(arrived) >= PLACES:
            # A batch of the first samples to arrive, in their order or
            # reversed (a sample moved): in place only if each kept its place.
            held.extend(_collate(arrived[:PLACES], reverse=operation[1]))
            arrived = arrived[PLACES:]
        elif operation[0] == "drop" and held:
            held.pop(operation[1] % len(held))
        _values_held(held)
        _values_held(arrived)
    held.clear()
    arrived.clear()
    loader.pool.new_epoch()  # samples never loaded give their batches' arenas back
    gc.collect()
    # Nothing refers to an arena any more: every one came back.
    assert loader.pool.lent_arenas == 0


class DiesOnce(tud.Dataset):
    """Sample 150, loaded in a worker process, kills its process, once
    (a file marks that it did), after the loader has learned the layout:
    arenas are lent to its batch and to the runs in flight."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __len__(self) -> int:
        return 192

    def __getitem__(self, index: int):
        if index == 150 and tud.get_worker_info() is not None and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full(IMAGE, float(index)), index


def test_a_worker_process_killed_mid_run_leaves_every_other_sample_whole(tmp_path) -> None:
    loader = minato.DataLoader(
        DiesOnce(str(tmp_path / "died")),
        batch_size=8,
        sampler=DeclaredShuffle(192),
        num_workers=2,
        worker_method="multiprocessing",
        on_error="skip",
    )
    held = []
    for _ in range(2):
        seen = len(loader.stats().failures)
        batches = list(loader)
        held.extend(batches)
        delivered = [int(index) for _, indices in batches for index in indices]
        failed = [failure.index for failure in loader.stats().failures[seen:]]
        assert sorted(delivered + failed) == list(range(192))
        # The killed process's run is run again one sample at a time, on
        # a new process: sample 150 no longer kills it.
        assert set(failed) <= {150}
    assert (tmp_path / "died").exists()
    for images, indices in held:
        for image, index in zip(images, indices, strict=True):
            assert torch.all(image == int(index))


def test_arenas_a_loop_once_held_are_given_back_once_it_no_longer_needs_them() -> None:
    # A persistent loader whose loop once kept a whole epoch's batches (a
    # list(loader)): once let go, the arenas they lay in are kept only as far
    # as later batches need them, as torch's shared memory goes with its
    # batches.
    loader = minato.DataLoader(
        Samples(),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        worker_method="multiprocessing",
        persistent_workers=True,
    )
    held = list(loader)
    pool = loader._iterator._processes.arenas
    assert pool is not None and pool.lent_arenas >= 20
    assert sorted(_check(held)) == list(range(192))
    del held
    gc.collect()
    assert pool.free_arenas >= 20
    for _ in range(2):  # one batch at a time, each let go before the next
        assert sorted(_check(batch for batch in loader)) == list(range(192))
    in_flight = 2 * loader.num_workers * loader.prefetch_factor
    assert pool.free_arenas + pool.lent_arenas <= in_flight + 2
