"""Sample slots: a worker process writes its large payloads into memory the
loader has already mapped, instead of a fresh shared-memory segment each.

A payload copied into fresh shared memory costs the worker process a page
fault per page, and the loader a mapping, its faults and an unmapping
(benchmarks/sample_slots.py, a 588 KiB image tensor: the worker sends one
in 0.32 ms, 0.09 ms into a slot; the loader receives and stacks 16 in 1.7
ms, 1.0-1.1 ms from slots). torch's workers pay the first cost once per
batch they collate.

Each worker process makes a ring of equal slots, sized by its first large
payload, in shared-memory segments it adds as it needs more slots (a task
of many cheap samples fills many at once), each sent to the loader once.
A tensor or array the loader rebuilds from a slot holds a lease on it: once
nothing views the slot any more (``default_collate`` copied the sample into
its batch), the lease hands the slot back, and the loader returns it to the
process with its next task. The process reuses a slot only once it is back,
so a sample is never overwritten while anything can see it. A payload larger
than a slot, or one that finds the ring full (MAX_RING_BYTES of slots taken:
a ``collate_fn`` that keeps its samples), goes into fresh shared memory as
before.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import torch

# Slots per shared-memory segment, at most...
SEGMENT_SLOTS = 32
# ...and a ring's memory at most, all its segments together: fewer slots
# for larger payloads.
MAX_RING_BYTES = 64 << 20
# A ring of fewer slots than this is not made (payloads that large go the old way).
MIN_SLOTS = 4
_PAGE = 4096

_new_shared = getattr(torch.UntypedStorage, "_new_shared", None)


class SlotRing:
    """The worker process's side: its ring, made at the first payload that
    could use it, and which slots it may write."""

    def __init__(self) -> None:
        self.segments: list[Any] = []
        self.slot_bytes = 0
        self.segment_slots = 0
        self._free: list[int] = []
        # The segments whose descriptors the loader has.
        self.announced: set[int] = set()
        self._unusable = _new_shared is None

    def take(self, nbytes: int) -> int | None:
        """A free slot for a payload of `nbytes` (the most recently freed:
        its pages are warm), or None."""
        if self._unusable or (self.slot_bytes and nbytes > self.slot_bytes):
            return None
        if not self._free and not self._add_segment(nbytes):
            return None
        return self._free.pop()

    def _add_segment(self, nbytes: int) -> bool:
        if not self.segments:
            self.slot_bytes = -(-nbytes // _PAGE) * _PAGE
            self.segment_slots = min(SEGMENT_SLOTS, MAX_RING_BYTES // self.slot_bytes)
            if self.segment_slots < MIN_SLOTS:
                self._unusable = True
                return False
        segment_bytes = self.slot_bytes * self.segment_slots
        if (len(self.segments) + 1) * segment_bytes > MAX_RING_BYTES:
            return False
        assert _new_shared is not None
        first = len(self.segments) * self.segment_slots
        self.segments.append(_new_shared(segment_bytes))
        self._free.extend(range(first + self.segment_slots - 1, first - 1, -1))
        return True

    def segment_of(self, slot: int) -> int:
        return slot // self.segment_slots

    def bytes_of(self, slot: int, nbytes: int) -> torch.Tensor:
        """The first `nbytes` of `slot`, to write the payload into."""
        segment, index = divmod(slot, self.segment_slots)
        storage = self.segments[segment]
        offset = index * self.slot_bytes
        return torch.empty((0,), dtype=torch.uint8).set_(storage, offset, (nbytes,))

    def give_back(self, slots: list[int]) -> None:
        """Slots the loader no longer views."""
        self._free.extend(slots)

    @property
    def free(self) -> int:
        return len(self._free)


class _Lease:
    """One slot's bytes, as numpy sees them (its ``__array_interface__``):
    every array and tensor made from it keeps it, and so the ring's mappings
    (its `SlotLeases`), alive; when the last is gone, the slot goes back to
    its ring."""

    __slots__ = ("__array_interface__", "_leases", "_slot")

    def __init__(self, leases: SlotLeases, slot: int, nbytes: int) -> None:
        self._leases = leases
        self._slot = slot
        segment, index = leases.segment_and_index(slot)
        address = segment.data_ptr() + index * leases.slot_bytes
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
        }

    def __del__(self) -> None:
        # Thread-safe: the last view may die on any thread.
        self._leases.freed.append(self._slot)


class SlotLeases:
    """The loader's side of one worker process's ring: its mapping, and the
    slots handed back since the last task went to the process."""

    def __init__(self) -> None:
        self.segments: dict[int, Any] = {}
        self.slot_bytes = 0
        self.segment_slots = 0
        self.freed: collections.deque[int] = collections.deque()

    def map(self, segment: int, storage: Any, slot_bytes: int) -> None:
        """The process's segment `segment`, mapped from its descriptor."""
        self.segments[segment] = storage
        self.slot_bytes = slot_bytes
        self.segment_slots = storage.nbytes() // slot_bytes

    def segment_and_index(self, slot: int) -> tuple[Any, int]:
        segment, index = divmod(slot, self.segment_slots)
        return self.segments[segment], index

    def bytes_of(self, slot: int, nbytes: int) -> np.ndarray:
        """The first `nbytes` of `slot`, leased until nothing views them."""
        return np.asarray(_Lease(self, slot, nbytes))

    def take_freed(self) -> list[int]:
        """The slots handed back since the last call."""
        freed = []
        while True:
            try:
                freed.append(self.freed.popleft())
            except IndexError:
                return freed
