"""A worker process's ring of sample slots (rust/wire/slots.rs): payloads
written into memory both sides mapped once, each slot reused only after
nothing in the loader views it any more.

The unit tests pass messages through minato._process.ipc in one process, as the
worker process and the loader would; the loader tests compare with torch's
DataLoader.
"""

from __future__ import annotations

import gc
import os
import re
import threading
import time

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minato
from minato._minato import SlotMap as SlotLeases
from minato._minato import SlotRing
from minato._process import ipc as _ipc
from minato._process import method as _worker_method
from minato._process import workers as _process_workers

# As rust/wire/slots.rs sets them.
SEGMENT_SLOTS = 32
MAX_RING_BYTES = 64 << 20

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not _ipc._can_share(), reason="no memfd here"),
]

SHAPE = (3, 64, 128)  # 96 KiB in float32: past SHARE_MIN_BYTES


def through(obj, ring: SlotRing, leases: SlotLeases):
    """`obj` sent by a worker process into `ring` and received by the loader."""
    payload = _ipc.dumps(obj, ring)
    return _ipc.loads(payload.data, [os.dup(fd) for fd in payload.fds], leases)


def test_a_sample_arrives_through_a_slot_equal_and_its_slot_comes_back() -> None:
    ring, leases = SlotRing(), SlotLeases()
    sample = torch.arange(np.prod(SHAPE), dtype=torch.float32).reshape(SHAPE)
    received = through({"image": sample, "label": 3}, ring, leases)
    assert torch.equal(received["image"], sample)
    assert received["label"] == 3
    assert ring.free == SEGMENT_SLOTS - 1, "one slot taken"
    assert leases.take_freed() == [], "still viewed"
    view = received["image"][1:]  # a view keeps the slot too
    del received
    gc.collect()
    assert leases.take_freed() == []
    del view
    gc.collect()
    freed = leases.take_freed()
    assert len(freed) == 1
    ring.give_back(freed)
    assert ring.free == SEGMENT_SLOTS


def test_a_task_of_many_samples_adds_segments_announced_once() -> None:
    ring, leases = SlotRing(), SlotLeases()
    run = [torch.full(SHAPE, float(i)) for i in range(SEGMENT_SLOTS + 8)]
    received = through(run, ring, leases)
    assert ring.segments == 2
    for i, tensor in enumerate(received):
        assert torch.all(tensor == float(i)), i
    # A later message into the second segment sends no descriptor again.
    payload = _ipc.dumps(torch.zeros(SHAPE), ring)
    assert payload.fds == []


BIG = (2, 1024, 1024)  # 8 MiB: the ring holds MAX_RING_BYTES // 8 MiB of them


def test_a_slot_still_viewed_is_never_written() -> None:
    ring, leases = SlotRing(), SlotLeases()
    capacity = MAX_RING_BYTES // (8 << 20)
    kept = [through(torch.full(BIG, float(i)), ring, leases) for i in range(capacity)]
    assert ring.free == 0
    # Every slot is taken: the next sample goes into fresh shared memory.
    extra = through(torch.full(BIG, -1.0), ring, leases)
    assert torch.all(extra == -1.0)
    for i, tensor in enumerate(kept):
        assert torch.all(tensor == float(i)), i
    # Half of them handed back (a batch collated): reused for new samples,
    # while the other half keep their values.
    del kept[::2]
    gc.collect()
    ring.give_back(leases.take_freed())
    assert ring.free == capacity // 2
    fresh = [through(torch.full(BIG, 100.0 + i), ring, leases) for i in range(capacity // 2)]
    assert ring.free == 0
    for i, tensor in zip(range(1, capacity, 2), kept, strict=True):
        assert torch.all(tensor == float(i)), i
    for i, tensor in enumerate(fresh):
        assert torch.all(tensor == 100.0 + i)


def test_dtypes_layouts_and_arrays_round_trip() -> None:
    ring, leases = SlotRing(), SlotLeases()
    base = torch.randn(SHAPE)
    half = torch.randn((3, 32, 128))
    # Each 96 KiB, a slot's size: every one takes a slot.
    samples = {
        "float": base,
        "bfloat16": torch.randn((6, 64, 128)).to(torch.bfloat16),
        "bool": torch.randn((12, 64, 128)) > 0,
        "complex": torch.complex(half, -half),
        "transposed": base.transpose(1, 2),  # not contiguous: arrives contiguous, equal
        "array": half.numpy().astype(np.float64),
        "int_array": np.arange(np.prod(SHAPE), dtype=np.int32).reshape(SHAPE),
    }
    received = through(samples, ring, leases)
    for key, value in samples.items():
        got = received[key]
        if isinstance(value, np.ndarray):
            assert isinstance(got, np.ndarray)
            assert got.dtype == value.dtype and got.shape == value.shape
            np.testing.assert_array_equal(got, value)
        else:
            assert got.dtype == value.dtype and got.shape == value.shape
            assert torch.equal(got, value), key
    assert ring.free == SEGMENT_SLOTS - len(samples)


def test_a_payload_larger_than_a_slot_goes_the_old_way() -> None:
    ring, leases = SlotRing(), SlotLeases()
    through(torch.zeros(SHAPE), ring, leases)  # sizes the ring's slots
    larger = torch.ones((4, 64, 128))
    assert torch.equal(through(larger, ring, leases), larger)
    assert ring.free == SEGMENT_SLOTS - 1, "only the first took a slot"


def test_a_ring_is_bounded_and_not_made_for_huge_payloads() -> None:
    ring = SlotRing()
    ring.take(MAX_RING_BYTES // 8)
    assert ring.free * ring.slot_bytes <= MAX_RING_BYTES
    huge = SlotRing()
    assert huge.take(MAX_RING_BYTES // 2) is None
    assert huge.segments == 0


def test_a_message_that_fails_to_pickle_gives_its_slots_back() -> None:
    class Unpicklable:
        def __reduce__(self):
            raise TypeError("no pickling")

    ring, leases = SlotRing(), SlotLeases()
    with pytest.raises(TypeError, match="no pickling"):
        _ipc.dumps([torch.zeros(SHAPE), Unpicklable()], ring)
    assert ring.free == SEGMENT_SLOTS
    # The ring is announced by the next message that uses it.
    assert torch.equal(through(torch.ones(SHAPE), ring, leases), torch.ones(SHAPE))


def test_a_slot_without_a_ring_expected_is_refused() -> None:
    ring = SlotRing()  # kept: its segment's descriptor closes with it
    payload = _ipc.dumps(torch.zeros(SHAPE), ring)
    with pytest.raises(Exception, match="no ring is expected"):
        _ipc.loads(payload.data, [os.dup(fd) for fd in payload.fds])


class Images(tud.Dataset):
    def __len__(self) -> int:
        return 160

    def __getitem__(self, index: int):
        return torch.full(SHAPE, float(index)), np.full((100, 96), index, dtype=np.float64)


def _count_slot_rebuilds(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the tensors rebuilt from slots, and the segments mapped."""
    # The fork server first: forked after the patches below, it would hand
    # them to its worker processes, which must send what they always send.
    # Kept for the test (what this process let go since would fork another).
    _process_workers.warm_up()
    monkeypatch.setattr(_process_workers, "_server_stale", lambda: False)
    counts = {"slot": 0, "segments": 0, "tensors": 0, "arena": 0, "threads": set()}
    rebuild, leaf, tensor = _ipc._rebuild_slot_tensor, _ipc._slot_leaf, _ipc.slot_tensor
    arena_leaf, deferred = _ipc._rebuild_arena_leaf, _ipc._deferred_sample

    def counting_deferred(tag, data, first, count, hoisted):
        counts["segments"] += len(hoisted)
        return deferred(tag, data, first, count, hoisted)

    def counting_arena_leaf(*args):
        counts["arena"] += not args[-1]  # tensors, not arrays
        return arena_leaf(*args)

    def counting_tensor(*args):
        counts["tensors"] += 1
        counts["threads"].add(threading.get_ident())
        return tensor(*args)

    def counting(*args):
        counts["slot"] += 1
        return rebuild(*args)

    def counting_leaf(segment, *args):
        counts["segments"] += segment is not None
        return leaf(segment, *args)

    monkeypatch.setattr(_ipc, "_rebuild_slot_tensor", counting)
    monkeypatch.setattr(_ipc, "_slot_leaf", counting_leaf)
    monkeypatch.setattr(_ipc, "slot_tensor", counting_tensor)
    monkeypatch.setattr(_ipc, "_rebuild_arena_leaf", counting_arena_leaf)
    monkeypatch.setattr(_ipc, "_deferred_sample", counting_deferred)
    return counts


@pytest.mark.parametrize("keep_samples", [False, True])
def test_process_workers_deliver_torchs_batches_through_their_rings(
    monkeypatch: pytest.MonkeyPatch, keep_samples: bool
) -> None:
    counts = _count_slot_rebuilds(monkeypatch)
    # A collate_fn that keeps its samples holds every slot it got: none is
    # overwritten, the ring grows instead.
    collate_threads = set()

    def keep(samples):
        collate_threads.add(threading.get_ident())
        return samples

    collate = {"collate_fn": keep} if keep_samples else {}

    def epoch(cls, **kwargs):
        generator = torch.Generator().manual_seed(7)
        loader = cls(
            Images(),
            batch_size=8,
            shuffle=True,
            generator=generator,
            num_workers=2,
            **collate,
            **kwargs,
        )
        return list(loader)

    theirs = epoch(tud.DataLoader)
    # Auto, on processes from an earlier decision, kept off the forks at each
    # engine's start (as when it moves within an epoch): its workers come
    # from the shared fork server, forked before the patches (workers forked
    # as the epoch starts would take them along).
    monkeypatch.setattr(_worker_method, "DECIDED_PROCESSES_FORKED_AT_START", False)
    monkeypatch.setitem(
        _worker_method._decided_for, Images, (True, "auto: decided for the test", True)
    )
    ours = epoch(minato.DataLoader)
    assert len(ours) == len(theirs)
    if keep_samples:
        # Samples move between batches (sample-level batches): compare sets.
        def indices(batches):
            return sorted(int(image[0, 0, 0]) for batch in batches for image, _ in batch)

        assert indices(ours) == indices(theirs) == list(range(160))
        for batch in ours:
            for image, array in batch:
                index = int(image[0, 0, 0])
                assert torch.all(image == index) and np.all(array == index)
        assert counts["slot"] == 160
        # The user's collate gets each sample's tensor as it was made,
        # rebuilt on the loader's collate thread (where the collate_fn runs),
        # not on the worker threads that received them.
        assert counts["tensors"] == 160
        assert counts["threads"] == collate_threads and len(collate_threads) == 1
        # 320 payloads held: at least five segments of 32 slots per worker.
        assert counts["segments"] >= 10
    else:
        seen = []
        for images, arrays in ours:
            for image, array in zip(images, arrays, strict=True):
                index = int(image[0, 0, 0])
                seen.append(index)
                assert torch.all(image == index) and torch.all(array == index)
        assert sorted(seen) == list(range(160))
        # Every sample came through a slot, or (once the first samples told
        # the loader their layout) its place in its batch's arena
        # (tests/test_batch_arenas.py); slots were reused: each worker's
        # ring stayed within a few segments.
        assert counts["slot"] + counts["arena"] == 160
        assert counts["arena"] > 0
        assert counts["segments"] <= 6
        # default_collate's batches were stacked from the slots: no tensor
        # was made of a sample on the way.
        assert counts["tensors"] == 0


# Operations on one worker process's ring: ("send", size in 16 KiB units
# past the 64 KiB floor), ("drop", which held sample), ("task",) = the
# loader hands the freed slots back with a task; and threads dropping
# samples: ("drop_on_thread", which).
_operations = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 4)),
        st.tuples(st.just("drop"), st.integers(0, 1_000)),
        st.tuples(st.just("drop_on_thread"), st.integers(0, 1_000)),
        st.tuples(st.just("task")),
    ),
    max_size=60,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_operations)
def test_held_samples_keep_their_values_and_every_slot_comes_back(operations) -> None:
    ring, leases = SlotRing(), SlotLeases()
    held: list[tuple[float, torch.Tensor]] = []
    value = 0.0
    for operation in operations:
        if operation[0] == "send":
            value += 1.0
            elements = (64 + 16 * operation[1]) * 1024 // 4
            held.append((value, through(torch.full((elements,), value), ring, leases)))
        elif operation[0] in ("drop", "drop_on_thread") and held:
            _, tensor = held.pop(operation[1] % len(held))
            if operation[0] == "drop_on_thread":
                dropper = threading.Thread(target=lambda t=[tensor]: t.clear())
                del tensor
                dropper.start()
                dropper.join()
            else:
                del tensor
        elif operation[0] == "task":
            # As a worker process does as each task arrives: an idle ring
            # whose slots are all back gives its pages back.
            ring.give_back(leases.take_freed())
            ring.task_begins()
        # Whatever the order, a sample still held keeps its value: its slot
        # was never handed out again, nor its pages given back.
        assert all(torch.all(tensor == expected) for expected, tensor in held)
        assert ring.segments * ring.segment_slots * ring.slot_bytes <= MAX_RING_BYTES
    held.clear()
    gc.collect()
    ring.give_back(leases.take_freed())
    # Every slot taken came back (exactly once: the ring would not hand a
    # slot out twice, test_a_ring_is_bounded_and_slots_are_never_handed_out_twice).
    assert ring.free == ring.segments * ring.segment_slots


def _rings_mapped_here() -> tuple[int, int]:
    """How many worker processes' ring segments this process maps, and how
    many kB of them are resident here."""
    mappings = resident = 0
    ring = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                ring = "minato-slots" in line
                mappings += ring
            elif ring and line.startswith("Rss:"):
                resident += int(line.split()[1])
    return mappings, resident


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="no /proc here")
def test_a_ring_left_idle_once_arenas_carry_the_samples_gives_its_pages_back() -> None:
    # The first samples go through the rings (the loader learns their
    # layout from them), the rest into their batches' arenas: the rings'
    # pages, read here as the first batches were stacked, go back.
    loader = minato.DataLoader(
        Images(),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        worker_method="multiprocessing",
        persistent_workers=True,
    )
    deadline = time.monotonic() + 60
    while True:
        seen = sorted(int(image[0, 0, 0]) for images, _ in loader for image in images)
        assert seen == list(range(160)), "every sample, whole, each epoch"
        mappings, resident = _rings_mapped_here()
        assert mappings > 0, "the first samples came through the rings"
        if resident == 0:
            break
        assert time.monotonic() < deadline, f"{resident} kB of the rings still resident"


def test_a_batch_stacked_from_slots_is_default_collates() -> None:
    from torch.utils.data import default_collate

    from minato._loader.collate import fast_default_collate

    ring, slots = SlotRing(), SlotLeases()

    def received(samples):
        payload = _ipc.dumps(samples, ring)
        fds = [os.dup(fd) for fd in payload.fds]
        return _ipc.loads(payload.data, fds, slots, keep_leaves=True)

    samples = [
        {
            "image": torch.randn(SHAPE),
            "mask": np.random.rand(100, 96) > 0.5,
            "depth": np.random.rand(100, 96).astype(np.float16),
            "label": i,
        }
        for i in range(6)
    ]
    leaves = received(samples)
    assert all(type(sample["image"]) is _ipc.SlotLeaf for sample in leaves)
    for pin in (False, True) if torch.cuda.is_available() else (False,):
        ours, theirs = fast_default_collate(pin)(leaves), default_collate(samples)
        assert ours.keys() == theirs.keys()
        for key in theirs:
            assert type(ours[key]) is type(theirs[key])
            assert ours[key].dtype == theirs[key].dtype, key
            assert torch.equal(ours[key], theirs[key]), key
    # A batch mixing slot leaves and tensors (a sample that found the ring
    # full) is default_collate's too.
    mixed = [samples[0]["image"], *[sample["image"] for sample in leaves[1:]]]
    expected = torch.stack([sample["image"] for sample in samples])
    assert torch.equal(fast_default_collate(False)(mixed), expected)
    assert torch.equal(fast_default_collate(False)(mixed[::-1]), expected.flip(0))
    # Arrays in a byte order torch lacks fail as default_collate fails.
    swapped = [np.arange(20_000, dtype=">f4") for _ in range(2)]
    with pytest.raises(Exception) as theirs_error:
        default_collate(swapped)
    with pytest.raises(type(theirs_error.value)):
        fast_default_collate(False)(received(swapped))
    # Leaves that do not fit together fail as torch's stack does.
    odd = received([torch.zeros(SHAPE), torch.zeros((3, 64, 100))])
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        fast_default_collate(False)(odd)
    del leaves, mixed, odd
    gc.collect()
    ring.give_back(slots.take_freed())
    assert ring.free == ring.segments * ring.segment_slots


class Huge(tud.Dataset):
    """Samples too large for any ring (fresh shared memory each), and
    small ones beside them."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        return torch.full((5, 1024, 1024), float(index)), torch.full((8,), index)


def test_samples_left_pickled_for_a_collate_fn_keep_their_shared_memory() -> None:
    # A user's collate_fn gets its samples rebuilt on the collate thread;
    # payloads that went into fresh shared memory (not a ring's slot) keep
    # their descriptors open until then.
    def keep(samples):
        return samples

    loader = minato.DataLoader(
        Huge(),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        worker_method="multiprocessing",
        collate_fn=keep,
    )
    seen = []
    for _ in range(2):
        for batch in loader:
            for big, small in batch:
                index = int(small[0])
                assert torch.all(big == index) and torch.all(small == index)
                seen.append(index)
    assert sorted(seen) == sorted(list(range(12)) * 2)
