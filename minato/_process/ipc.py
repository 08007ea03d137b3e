"""Messages between a worker process and the loader, over a Unix socket
whose frames Rust reads and writes (``minato._minato.Wire``, rust/wire/).

A message is pickled, except its large tensors and numpy arrays: those are
put in shared memory once (where they are not there already, as a batch
torch's ``default_collate`` built in a worker process is) and travel as
file descriptors beside the pickle (``SCM_RIGHTS``). The receiver maps the
same pages, so a sample's payload is written once by the worker and copied
at most once more, into its batch; nothing large goes through the socket.
A worker process's results go into its ring of sample slots where they fit
(rust/wire/slots.rs): memory both sides mapped once, not a segment each;
or, where the loader lent the sample's batch an arena, straight into the
sample's place in its batch (rust/wire/arena.rs): a batch whose samples all
kept their places is handed out as it lies, with no copy in the loader.

Shared memory is minato's own: a memfd per payload, mapped with ``mmap``
on both sides and viewed as a tensor with ``torch.frombuffer``. One case
needs torch's: a tensor torch itself already put in shared memory (the user's
``share_memory_()``, a counter a dataset updates in place for its persistent
workers to see) is sent as the same pages, received as a storage torch knows
to be shared (Hugging Face's ``set_epoch`` shares it again in the worker,
which would copy any other), and only torch's private ``_share_fd_cpu_`` and
``_new_shared_fd_cpu`` do that. Where a torch lacks them, or its sharing
strategy is not ``file_descriptor``, such a tensor is copied instead: its
later updates are then not seen.
"""

from __future__ import annotations

import io
import mmap
import multiprocessing.context
import multiprocessing.reduction
import os
import pickle
import pickletools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
import torch
import torch.multiprocessing

from minato._minato import ArenaPool, ArenaWriter, SlotLeaf, SlotMap, SlotRing, Wire
from minato._process import inherit

# Below this, pickling the bytes costs less than a shared-memory mapping.
SHARE_MIN_BYTES = 64 * 1024
# Descriptors per message, as the wire allows (rust/wire/frame.rs); payloads
# past it are pickled.
MAX_FDS = 240

# torch's private methods that tell the descriptor of a storage torch put in
# shared memory (file_descriptor strategy), and map one as such a storage.
_SHARE_FD = "_share_fd_cpu_"
_from_torch_fd = getattr(torch.UntypedStorage, "_new_shared_fd_cpu", None)


def _can_share() -> bool:
    return hasattr(os, "memfd_create")


def _torch_shared_fd(storage: Any) -> tuple[int, int] | None:
    """The descriptor and size of a storage torch shared, or None where this
    torch cannot tell it (then the tensor is copied into memory of minato's)."""
    share_fd = getattr(storage, _SHARE_FD, None)
    if (
        share_fd is None
        or _from_torch_fd is None
        or torch.multiprocessing.get_sharing_strategy() != "file_descriptor"
    ):
        return None
    try:
        fd, size = share_fd()
    except RuntimeError:  # shared another way (file_system)
        return None
    return int(fd), int(size)


class SharedBuffer:
    """Shared memory of minato's own: a memfd, mapped here, viewed as bytes
    (``tensor``). Its descriptor is closed when it is collected; the mapping
    lasts as long as a tensor views it."""

    __slots__ = ("fd", "size", "tensor")

    def __init__(self, nbytes: int) -> None:
        self.size = max(nbytes, 1)  # mmap maps no empty file
        self.fd = os.memfd_create("minato-payload", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.size)
            mapped = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self.tensor = torch.frombuffer(mapped, dtype=torch.uint8)

    # os.close held here: at interpreter exit the module's globals may be gone first.
    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        _close(self.fd)


def _mapped(fd: int, size: int) -> torch.UntypedStorage:
    """The shared memory behind a received descriptor, as a storage of this
    process's own: mapped privately, so that writes to it (a worker's
    bookkeeping in its dataset's array) are copied on write and seen here
    only, as in a forked worker's memory, while reads share the pages."""
    mapped = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE)
    return torch.frombuffer(mapped, dtype=torch.uint8).untyped_storage()


class Payload:
    """A message ready to send: its pickle, its descriptors, and the storages
    that own those descriptors (kept alive until every send is done)."""

    __slots__ = ("data", "fds", "keep")

    def __init__(self, data: bytes, fds: list[int], keep: list[Any]) -> None:
        self.data = data
        self.fds = fds
        self.keep = keep


class Placed:
    """A worker's result for one sample, and the place in its batch's arena
    the loader lent it (arena, generation, place), or None."""

    __slots__ = ("item", "place")

    def __init__(self, item: Any, place: tuple[int, int, int] | None) -> None:
        self.item = item
        self.place = place


class ArenaLeaf:
    """A sample's large leaf a worker process wrote at its sample's place in
    its batch's arena as the sample was loaded (`written_into_arena`), not
    as its run's answer is pickled: a run of samples then holds none of
    them. Pickles as the reduction that makes the leaf there."""

    __slots__ = ("nbytes", "reduction")

    def __init__(self, nbytes: int, reduction: tuple[Any, ...]) -> None:
        self.nbytes, self.reduction = nbytes, reduction


class _NotWritten(Exception):
    """A sample `written_into_arena` leaves to the answer's pickler whole."""


# What a sample may hold beside containers and leaves for its large leaves
# to be written as it is loaded: values whose pickling holds no tensor (and
# numpy's scalars).
_SCALARS = (int, float, bool, str, bytes, type(None))


def _tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's data as contiguous bytes (copied where it is not)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy()


def _array_bytes(array: np.ndarray) -> np.ndarray:
    """An array's data as contiguous bytes (copied where it is not)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _large_numeric(array: np.ndarray) -> bool:
    """Whether an array's data goes in shared memory, not in the pickle."""
    return array.nbytes >= SHARE_MIN_BYTES and array.dtype.kind in "biufc"


def _arena_reduction(
    writer: ArenaWriter,
    place: tuple[int, int, int],
    leaf: int,
    data: np.ndarray,
    dtype: Any,
    shape: tuple,
    is_array: bool,
) -> tuple[Any, ...] | None:
    """`data` (contiguous bytes) written as leaf `leaf` of `place` in its
    batch's arena, as the reduction that makes the leaf there; None where
    the place cannot take it (lost to another sample, another layout)."""
    arena, generation, at = place
    if not writer.place(arena, generation, at, leaf, data):
        return None
    return _rebuild_arena_leaf, (arena, generation, at, leaf, data.nbytes, dtype, shape, is_array)


def written_into_arena(sample: Any, place: tuple[int, int, int], writer: ArenaWriter) -> Any:
    """`sample` with each large plain tensor and numeric array written at
    `place` in its batch's arena, and an `ArenaLeaf` in its stead: the leaves
    numbered in the order the answer's pickler meets them (tuples, lists and
    dicts in order; one object met twice is one leaf, as its memo has it).
    A sample holding anything else (an object of its own, a tensor in
    shared memory, a leaf its place cannot take) is returned as it is: the
    pickler writes it, as before. Builds new containers: the dataset's own
    are never changed."""
    # By the id of each leaf written: `sample` keeps them alive meanwhile.
    written: dict[int, ArenaLeaf] = {}

    def leaf(data: np.ndarray, dtype: Any, shape: tuple, is_array: bool) -> ArenaLeaf:
        reduction = _arena_reduction(writer, place, len(written), data, dtype, shape, is_array)
        if reduction is None:
            raise _NotWritten
        return ArenaLeaf(data.nbytes, reduction)

    def walk(obj: Any) -> Any:
        kind = type(obj)
        if kind in _SCALARS or (isinstance(obj, np.generic) and kind is not np.object_):
            return obj
        if kind is tuple:
            return tuple([walk(item) for item in obj])
        if kind is list:
            return [walk(item) for item in obj]
        if kind is dict:
            if not all(type(key) in _SCALARS for key in obj):
                raise _NotWritten
            return {key: walk(value) for key, value in obj.items()}
        if kind is torch.Tensor:
            if not _plain_tensor(obj) or obj.untyped_storage().is_shared():
                raise _NotWritten
            if obj.nbytes < SHARE_MIN_BYTES:
                return obj
        elif kind is np.ndarray:
            if obj.dtype.hasobject:
                raise _NotWritten
            if not _large_numeric(obj):
                return obj
        else:
            raise _NotWritten
        found = written.get(id(obj))
        if found is None:
            if kind is torch.Tensor:
                found = leaf(_tensor_bytes(obj), obj.dtype, tuple(obj.shape), False)
            else:
                found = leaf(_array_bytes(obj), obj.dtype, obj.shape, True)
            written[id(obj)] = found
        return found

    try:
        settled = walk(sample)
    except _NotWritten:
        return sample
    return settled if written else sample


class LeafSizes:
    """Pickled after a worker's results: the sizes of the first sample's
    large leaves, in order (the loader lays its arenas out by them)."""


class ArenaAnnounce:
    """A batch arena a worker process has not mapped yet, sent with a task:
    its descriptor goes beside the message."""

    __slots__ = ("arena", "fd", "size", "places", "leaf_bytes")

    def __init__(self, arena: int, fd: int, size: int, places: int, leaf_bytes: list[int]) -> None:
        self.arena, self.fd, self.size = arena, fd, size
        self.places, self.leaf_bytes = places, leaf_bytes


class Deferred:
    """A worker's (tag, sample) result whose sample the loader unpickles on
    its collate thread (`DeferredSample`), not on the worker thread that
    receives it: a user's collate_fn gets its samples rebuilt there."""

    __slots__ = ("item",)

    def __init__(self, item: tuple[int, Any]) -> None:
        self.item = item


class DeferredSample:
    """A sample still pickled, with the descriptors its payloads need;
    `open()` makes it (once)."""

    __slots__ = ("data", "fds", "slots", "arenas")

    def __init__(
        self, data: bytes, fds: list[int], slots: SlotMap | None, arenas: ArenaPool | None
    ) -> None:
        self.data, self.fds, self.slots, self.arenas = data, fds, slots, arenas

    def open(self) -> Any:
        fds, self.fds = self.fds, []
        return loads(self.data, fds, self.slots, False, self.arenas)

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        for fd in self.fds:  # never opened
            _close(fd)


def open_samples(samples: list[Any]) -> list[Any]:
    """`samples` with every deferred one made (on the collate thread)."""
    return [sample.open() if type(sample) is DeferredSample else sample for sample in samples]


# A worker process's mapped arenas (set by minato._process.child).
arena_writer: ArenaWriter | None = None


def _weak_in_band(pickler: _SharingPickler) -> Callable[[pickle.PickleBuffer], bool]:
    """`pickler._in_band`, called through a weak reference to `pickler`."""
    owner = weakref.ref(pickler)

    def in_band(buffer: pickle.PickleBuffer) -> bool:
        alive = owner()
        return True if alive is None else alive._in_band(buffer)

    return in_band


class _SharingPickler(cloudpickle.Pickler):
    """cloudpickle (what ``__main__`` defines goes by value: a worker process
    never imports the training script), with large payloads shared."""

    def __init__(
        self,
        file: io.BytesIO,
        ring: SlotRing | None = None,
        writer: ArenaWriter | None = None,
        inherits: bool = False,
        out_of_band: bool = False,
    ) -> None:
        share = _can_share()
        # Buffers an object pickles as `pickle.PickleBuffer` (pyarrow's, as
        # pandas' string columns hold them) go into shared memory, once, and
        # are unpickled over it: in band, they were copied into the pickle
        # and rebuilt in every worker process (benchmarks/RESULTS.md,
        # session 27).
        # Through a weak reference: the bound method itself would make the
        # pickler a cycle (it holds its callback), and its memo would keep
        # every object it pickled (a worker's samples) until Python's cycle
        # collector ran, growing the worker's heap (benchmarks/RESULTS.md,
        # session 28).
        super().__init__(
            file,
            protocol=pickle.HIGHEST_PROTOCOL,
            buffer_callback=_weak_in_band(self) if out_of_band and share else None,
        )
        self.share = share
        # Where each buffer taken out of band went: its descriptor's place
        # among the message's, its size, and whether it was read-only; or,
        # read in place from the fork server's memory, None, then where
        # (minato._process.inherit.buffer_key_of) and its size.
        self.buffers: list[tuple[Any, ...]] = []
        # A spec for worker processes of this process's fork server: arrays
        # they find unchanged in its memory go as keys (minato._process.inherit).
        self.inherits = inherits
        self.fds: list[int] = []
        self.keep: list[Any] = []
        self.slots: dict[int, int] = {}
        self.ring = ring if self.share else None
        # The ring's slots this message fills, and the segments it announces.
        self.ring_slots: list[int] = []
        self.announcing: list[int] = []
        # The arenas the loader lent (a worker's results), the place of the
        # sample being pickled, its large leaves so far, the first's sizes.
        self.writer = writer if self.ring is not None else None
        self.place: tuple[int, int, int] | None = None
        self.leaf = 0
        self.first_sizes: list[int] | None = None
        self.recording = False
        # A deferred sample's own pickler: the message it goes in, and the
        # ring segments it announces there (mapped as the message arrives).
        self.outer: _SharingPickler | None = None
        self.hoisted: list[_Segment] = []

    def _deferred(self, deferred: Deferred) -> Any:
        tag, sample = deferred.item
        buffer = io.BytesIO()
        inner = _SharingPickler(buffer, self.ring, self.writer)
        inner.outer = self
        inner.ring_slots, inner.announcing = self.ring_slots, self.announcing
        slots_before = len(self.ring_slots)
        inner.dump(sample)
        if not inner.fds and not inner.hoisted and len(self.ring_slots) == slots_before:
            # No payload in shared memory: made as the message arrives, as
            # cheaply as anywhere.
            return _inline_sample, (tag, buffer.getvalue())
        first = len(self.fds)
        self.fds.extend(inner.fds)
        self.keep.extend(inner.keep)
        return _deferred_sample, (tag, buffer.getvalue(), first, len(inner.fds), inner.hoisted)

    def _placed(self, placed: Placed) -> Any:
        self.place, self.leaf = placed.place, 0
        self.recording = self.first_sizes is None
        if self.recording:
            self.first_sizes = []
        return _unplaced, (placed.item,)

    def _next_leaf(self, nbytes: int) -> int:
        """The number of the sample's next large leaf (its size recorded for
        the loader's layout where this is the message's first sample)."""
        leaf = self.leaf
        self.leaf += 1
        if self.recording:
            assert self.first_sizes is not None
            self.first_sizes.append(nbytes)
        return leaf

    def _arena_leaf(self, leaf: ArenaLeaf) -> Any:
        """A leaf written as its sample was loaded: counted as `_in_arena`
        counts the leaves it writes."""
        self._next_leaf(leaf.nbytes)
        return leaf.reduction

    def _in_arena(self, data: np.ndarray, dtype: Any, shape: tuple, is_array: bool) -> Any:
        """`data` (contiguous bytes) written at the sample's place in its
        batch's arena, as the reduction that makes its leaf; None where it
        has no place there (or lost it to another sample)."""
        if self.writer is None:
            return None
        leaf = self._next_leaf(data.nbytes)
        if self.place is None:
            return None
        return _arena_reduction(self.writer, self.place, leaf, data, dtype, shape, is_array)

    def _in_ring(self, data: np.ndarray) -> tuple[_Segment | None, int] | None:
        """`data` (contiguous bytes) written into a free slot of the ring, as
        (its segment's descriptor where the loader lacks it, the slot), or
        None where it does not fit."""
        ring = self.ring
        outer = self.outer
        if ring is None or len(self.fds) + (len(outer.fds) if outer else 0) >= MAX_FDS:
            return None
        taken = ring.take(data.nbytes)
        if taken is None:
            return None
        slot, announce = taken
        self.ring_slots.append(slot)
        found = None
        if announce is not None:
            # The segment's first use: its descriptor goes along (the ring
            # keeps it open).
            fd, size, slot_bytes, segment = announce
            self.announcing.append(segment)
            if outer is not None:
                # In a deferred sample: the message maps it as it arrives,
                # before any later sample of the ring's is opened.
                outer.fds.append(fd)
                self.hoisted.append((len(outer.fds) - 1, size, slot_bytes, segment))
            else:
                self.fds.append(fd)
                found = (len(self.fds) - 1, size, slot_bytes, segment)
        ring.write(slot, data)
        return found, slot

    def _in_band(self, buffer: pickle.PickleBuffer) -> bool:
        """Whether `buffer` stays in the pickle: a small one does; a large
        one is copied into shared memory of its own."""
        view = buffer.raw()
        if view.nbytes < SHARE_MIN_BYTES:
            return True
        if self.inherits:
            found = inherit.buffer_key_of(view)
            if found is not None:  # read in place from the fork server's memory
                self.buffers.append((None, *found, view.nbytes))
                return False
        if len(self.fds) >= MAX_FDS:
            return True
        shared = SharedBuffer(view.nbytes)
        shared.tensor.numpy()[:] = np.frombuffer(view, dtype=np.uint8)
        slot = self._slot(id(shared), shared.fd, shared)
        self.buffers.append((slot, view.nbytes, view.readonly))
        return False

    def unwind(self) -> None:
        """The message was not sent: its slots are free again, and the
        segments it announced are not announced."""
        if self.ring is not None:
            self.ring.give_back(self.ring_slots, self.announcing)

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is Placed:
            return self._placed(obj)
        if kind is Deferred:
            return self._deferred(obj)
        if kind is ArenaLeaf:
            return self._arena_leaf(obj)
        if kind is LeafSizes:
            return _unplaced, (self.first_sizes,)
        if kind is ArenaAnnounce:
            self.fds.append(obj.fd)  # the pool keeps it open until sent
            args = (len(self.fds) - 1, obj.arena, obj.size, obj.places, obj.leaf_bytes)
            return _map_arena, args
        if self.inherits and kind in (torch.Tensor, np.ndarray):
            reduced = inherit.reduction_of(obj)
            if reduced is not None:
                return reduced
        # Exact types: subclasses (nn.Parameter, masked arrays) keep their own pickling.
        if type(obj) is torch.Tensor and _plain_tensor(obj):
            # A tensor already in shared memory stays shared, however small:
            # a dataset's epoch counter updated in place (Hugging Face's
            # set_epoch) must reach persistent workers, as torch's.
            small = obj.nbytes < SHARE_MIN_BYTES and not obj.untyped_storage().is_shared()
            if small or not self.share or len(self.fds) >= MAX_FDS:
                return _small_tensor(obj)
            reduced = self._tensor(obj)
            if reduced is not NotImplemented:
                return reduced
        reduce = _multiprocessing_reducer(type(obj))
        if reduce is not None:
            return reduce(obj)
        if self.inherits:
            reduced = inherit.owner_reduction(obj, pickle.HIGHEST_PROTOCOL)
            if reduced is None:
                reduced = inherit.arrow_column_reduction(obj)
            if reduced is not None:
                return reduced
        if self.share and len(self.fds) < MAX_FDS:
            if type(obj) is np.ndarray and _large_numeric(obj):
                return self._array(obj)
        return super().reducer_override(obj)

    def _slot(self, key: int, fd: int, owner: Any) -> int:
        """The message's place for a descriptor of shared memory (one per
        memory, however many tensors view it); `owner` keeps it open."""
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = len(self.fds)
            self.fds.append(fd)
            self.keep.append(owner)
        return slot

    def _tensor(self, tensor: torch.Tensor) -> Any:
        storage = tensor.untyped_storage()
        # A view of a much larger storage is copied alone, not its whole base,
        # where it goes into a worker's ring (a sample); one the loader sends
        # stays a view of what it shares, as in torch.
        copied_alone = storage.nbytes() > 2 * tensor.nbytes and self.ring is not None
        if storage.is_shared() and not copied_alone:
            shared = _torch_shared_fd(storage)
            if shared is not None:
                fd, size = shared
                slot = self._slot(storage.data_ptr(), fd, storage)
                args = (slot, size, tensor.dtype, tensor.storage_offset(), tuple(tensor.shape))
                return _rebuild_tensor, (*args, tuple(tensor.stride()), True)
        data = _tensor_bytes(tensor)
        shape = tuple(tensor.shape)
        in_arena = self._in_arena(data, tensor.dtype, shape, False)
        if in_arena is not None:
            return in_arena
        in_ring = self._in_ring(data)
        if in_ring is not None:
            segment, slot = in_ring
            return _rebuild_slot_tensor, (segment, slot, tensor.nbytes, tensor.dtype, shape)
        buffer = SharedBuffer(tensor.nbytes)
        copy = buffer.tensor[: tensor.nbytes].view(tensor.dtype).view(shape)
        copy.copy_(tensor)
        slot = self._slot(id(buffer), buffer.fd, buffer)
        return _rebuild_tensor, (slot, buffer.size, tensor.dtype, 0, shape, tuple(copy.stride()))

    def _array(self, data: np.ndarray) -> Any:
        raw = _array_bytes(data)
        in_arena = self._in_arena(raw, data.dtype, data.shape, True)
        if in_arena is not None:
            return in_arena
        in_ring = self._in_ring(raw)
        if in_ring is not None:
            segment, slot = in_ring
            return _rebuild_slot_array, (segment, slot, data.nbytes, data.dtype, data.shape)
        buffer = SharedBuffer(data.nbytes)
        target = buffer.tensor[: data.nbytes].numpy()
        np.copyto(target.view(data.dtype).reshape(data.shape), data, casting="no")
        slot = self._slot(id(buffer), buffer.fd, buffer)
        return _rebuild_array, (slot, buffer.size, data.dtype, data.shape, data.nbytes)


# Same-size integer types, for dtypes numpy lacks (bfloat16, float8...).
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _small_tensor(tensor: torch.Tensor) -> Any:
    """A small tensor as its bytes: torch's own pickling of a storage goes
    through ``torch.save``, ten times slower for a sample's few values."""
    data = tensor.detach().contiguous()
    try:
        array = data.numpy()
    except TypeError:
        array = data.view(_BITS[data.element_size()]).numpy()
    return _rebuild_small, (array, tensor.dtype)


def _rebuild_small(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor if tensor.dtype == dtype else tensor.view(dtype)


def _plain_tensor(tensor: torch.Tensor) -> bool:
    return (
        tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and not tensor.requires_grad
        and not tensor.is_conj()
        and not tensor.is_neg()
        and not tensor.is_quantized
    )


_STRING_PUSHES = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
_MEMO_GETS = {"BINGET", "LONG_BINGET", "GET"}
_MEMO_PUTS = {"BINPUT", "LONG_BINPUT", "PUT"}


def modules_named(payload: Payload) -> list[str]:
    """The modules a pickle imports objects from (its GLOBAL and
    STACK_GLOBAL opcodes), in order of first use; builtins and __main__ left
    out. A scan of the opcodes: nothing is unpickled."""
    modules: dict[str, None] = {}
    memo: dict[int, Any] = {}
    pushed: list[Any] = []  # the values of the last pushes, strings or None
    for opcode, arg, _ in pickletools.genops(payload.data):
        name = opcode.name
        if name in _STRING_PUSHES:
            pushed.append(arg)
        elif name in _MEMO_GETS:
            pushed.append(memo.get(arg))
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in _MEMO_PUTS:
            memo[arg] = pushed[-1] if pushed else None
        elif name == "GLOBAL":
            modules[str(arg).split(" ", 1)[0]] = None
            pushed.append(None)
        elif name == "STACK_GLOBAL":
            if len(pushed) >= 2 and isinstance(pushed[-2], str):
                modules[pushed[-2]] = None
            pushed.append(None)
        elif name not in ("FRAME", "PROTO"):
            pushed.append(None)
        del pushed[:-2]
    for unwanted in ("builtins", "__builtin__", "__main__"):
        modules.pop(unwanted, None)
    return list(modules)


class _StartingWorker:
    """What multiprocessing's own objects (``Event``, ``Lock``, ``Value``,
    ``Queue``...) ask for while pickled: they pickle only "while spawning a
    process", and hand their descriptors to the process being started. torch
    pickles a dataset as it starts each worker process; minato pickles it
    once, for worker processes it starts from its fork server, and sends the
    descriptors beside the pickle (a message's own)."""

    def __init__(self, pickler: _SharingPickler) -> None:
        self.pickler = pickler

    def duplicate_for_child(self, fd: int) -> int:
        pickler = self.pickler
        if len(pickler.fds) >= MAX_FDS:
            raise ValueError(f"more than {MAX_FDS} descriptors in one message to a worker process")
        pickler.fds.append(fd)  # owned by the object pickled, which outlives the sends
        return len(pickler.fds) - 1

    @staticmethod
    def DupFd(slot: int) -> _PassedFd:  # noqa: N802  # multiprocessing's name
        return _PassedFd(slot)


class _PassedFd:
    """A descriptor sent beside the pickle (multiprocessing's ``DupFd``)."""

    def __init__(self, slot: int) -> None:
        self.slot = slot

    def __reduce__(self) -> Any:
        return _received_fd, (self.slot,)


class _ReceivedFd:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def detach(self) -> int:
        return self.fd


def _received_fd(slot: int) -> _ReceivedFd:
    # The message's descriptors are closed once it is unpickled: a copy.
    return _ReceivedFd(os.dup(_received.fds[slot]))


_set_spawning_popen = getattr(multiprocessing.context, "set_spawning_popen", None)
# multiprocessing's registry of reductions its objects need (a Value's
# shared ctypes object, the arena of shared memory under it): only
# multiprocessing's pickler consults it. torch registers its tensors there
# too: those keep minato's own pickling.
_forking_reducers: dict[type, Any] = getattr(
    multiprocessing.reduction.ForkingPickler, "_extra_reducers", {}
)


def _multiprocessing_reducer(kind: type) -> Any:
    reduce = _forking_reducers.get(kind)
    if reduce is None or not getattr(reduce, "__module__", "").startswith("multiprocessing."):
        return None
    return reduce


def _fork_context_message(error: RuntimeError) -> str | None:
    """The remedy, for a lock or semaphore created in the 'fork' context."""
    if "fork context" not in str(error):
        return None
    return (
        "minato: the dataset (or collate_fn, worker_init_fn) holds a multiprocessing lock "
        "or semaphore (an Event, Lock, RLock, Semaphore, Condition or Barrier, or a Value "
        "or Array with its lock) made in the 'fork' context, multiprocessing's default on "
        "Linux before Python 3.14. Only a process forked from this one can use it: "
        'minato\'s worker processes inherit it where worker_method="multiprocessing" '
        "is asked for and the fork server is forked (not MINATO_FORK_SERVER=exec). Make it with "
        'multiprocessing.get_context("forkserver") (or "spawn"), e.g. '
        'multiprocessing.get_context("forkserver").Event(), or use worker_method="thread".'
    )


def dumps(
    obj: Any,
    ring: SlotRing | None = None,
    writer: ArenaWriter | None = None,
    inherit: bool = False,
) -> Payload:
    """`obj` pickled, its large payloads shared; into `ring`'s slots where
    they fit, or the places `writer`'s arenas lent them (a worker process's
    results). With `inherit` (a worker's spec), the large arrays the fork
    server's memory holds unchanged go as references to it."""
    buffer = io.BytesIO()
    pickler = _SharingPickler(buffer, ring, writer, inherit, out_of_band=True)
    if _set_spawning_popen is not None:
        _set_spawning_popen(_StartingWorker(pickler))
    try:
        pickler.dump(obj)
    except BaseException as error:
        pickler.unwind()
        message = _fork_context_message(error) if isinstance(error, RuntimeError) else None
        if message is None:
            raise
        raise RuntimeError(message) from error
    finally:
        if _set_spawning_popen is not None:
            _set_spawning_popen(None)
    data = buffer.getvalue()
    if pickler.buffers:
        # The unpickler is handed the buffers taken out of band, in order.
        data = pickle.dumps(_OutOfBand(data, pickler.buffers), protocol=pickle.HIGHEST_PROTOCOL)
    return Payload(data, pickler.fds, pickler.keep)


class _OutOfBand:
    """A pickle whose large buffers lie in the message's shared memory."""

    __slots__ = ("data", "buffers")

    def __init__(self, data: bytes, buffers: list[tuple[Any, ...]]) -> None:
        self.data, self.buffers = data, buffers

    def __reduce__(self) -> Any:
        return _with_buffers, (self.data, self.buffers)


def _with_buffers(data: bytes, buffers: list[tuple[Any, ...]]) -> Any:
    return pickle.loads(
        data,
        buffers=[
            inherit.inherited_buffer(*buffer[1:])
            if buffer[0] is None
            else _received_buffer(*buffer)
            for buffer in buffers
        ],
    )


def _received_buffer(slot: int, size: int, readonly: bool) -> memoryview:
    """A buffer taken out of band, as it was: read-only, or writable with
    this process's writes its own (see `_mapped`)."""
    view = memoryview(_received_bytes(slot, size, size))
    return view.toreadonly() if readonly else view


# The descriptors of the message being unpickled on this thread.
_received = threading.local()


def _storage(slot: int, size: int, torch_shared: bool = False) -> Any:
    storages = _received.storages
    storage = storages.get(slot)
    if storage is None:
        fd = _received.fds[slot]
        if torch_shared and _from_torch_fd is not None:
            storage = _from_torch_fd(fd, size)
        else:
            storage = _mapped(fd, size)
        storages[slot] = storage
    return storage


def _rebuild_tensor(
    slot: int,
    size: int,
    dtype: torch.dtype,
    offset: int,
    shape: tuple,
    stride: tuple,
    torch_shared: bool = False,
) -> torch.Tensor:
    """A tensor over a received descriptor's memory; `torch_shared`: one torch
    had shared, received as shared to torch too."""
    storage = _storage(slot, size, torch_shared)
    return torch.empty((0,), dtype=dtype).set_(storage, offset, shape, stride)


def _received_bytes(slot: int, size: int, nbytes: int) -> np.ndarray:
    """The first `nbytes` of a received descriptor's memory, as bytes."""
    raw = torch.empty((0,), dtype=torch.uint8).set_(_storage(slot, size), 0, (nbytes,))
    return raw.numpy()


def _rebuild_array(slot: int, size: int, dtype: Any, shape: tuple, nbytes: int) -> np.ndarray:
    return _received_bytes(slot, size, nbytes).view(dtype).reshape(shape)


# A ring segment's first use: its descriptor's place among the message's,
# its size, the ring's slot size, and the segment's number.
_Segment = tuple[int, int, int, int]


def _slot_leaf(
    segment: _Segment | None, slot: int, nbytes: int, dtype: Any, shape: tuple, is_array: bool
) -> SlotLeaf:
    """A ring slot's payload; its slot goes back once nothing views it."""
    slots = getattr(_received, "slots", None)
    if slots is None:
        raise pickle.UnpicklingError("a sample slot arrived where no ring is expected")
    if segment is not None:
        fd_slot, size, slot_bytes, number = segment
        slots.map(number, _received.fds[fd_slot], size, slot_bytes)
    return slots.leaf(slot, nbytes, dtype, shape, is_array)


def _unplaced(item: Any) -> Any:
    return item


def _inline_sample(tag: int, data: bytes) -> tuple[int, Any]:
    return tag, pickle.loads(data)


def _deferred_sample(
    tag: int, data: bytes, first: int, count: int, hoisted: list[_Segment]
) -> tuple[int, DeferredSample]:
    """A sample left pickled for the collate thread: the ring segments it
    announces are mapped now, its other descriptors kept open for it."""
    slots = getattr(_received, "slots", None)
    if hoisted and slots is None:
        raise pickle.UnpicklingError("a sample slot arrived where no ring is expected")
    for fd_slot, size, slot_bytes, number in hoisted:
        slots.map(number, _received.fds[fd_slot], size, slot_bytes)
    fds = [os.dup(fd) for fd in _received.fds[first : first + count]]
    return tag, DeferredSample(data, fds, slots, getattr(_received, "arenas", None))


def _map_arena(fd_slot: int, arena: int, size: int, places: int, leaf_bytes: list[int]) -> int:
    """A worker process maps an arena the loader announced."""
    if arena_writer is None:
        raise pickle.UnpicklingError("a batch arena arrived where no worker process maps it")
    arena_writer.map(arena, _received.fds[fd_slot], size, places, leaf_bytes)
    return arena


def _rebuild_arena_leaf(
    arena: int,
    generation: int,
    place: int,
    leaf: int,
    nbytes: int,
    dtype: Any,
    shape: tuple,
    is_array: bool,
) -> Any:
    """A sample's leaf the worker wrote at its place in its batch's arena."""
    arenas = getattr(_received, "arenas", None)
    if arenas is None:
        raise pickle.UnpicklingError("a sample placed in a batch arena arrived where none is lent")
    found = arenas.leaf(arena, generation, place, leaf, nbytes, dtype, shape, is_array)
    if _received.keep_leaves:
        return found
    return slot_value(found)


def _rebuild_slot_tensor(
    segment: _Segment | None, slot: int, nbytes: int, dtype: torch.dtype, shape: tuple
) -> torch.Tensor | SlotLeaf:
    leaf = _slot_leaf(segment, slot, nbytes, dtype, shape, False)
    if _received.keep_leaves:
        return leaf  # stacked from its slot by the collate (minato._loader.collate)
    return slot_tensor(leaf)


def _rebuild_slot_array(
    segment: _Segment | None, slot: int, nbytes: int, dtype: Any, shape: tuple
) -> np.ndarray | SlotLeaf:
    leaf = _slot_leaf(segment, slot, nbytes, dtype, shape, True)
    if _received.keep_leaves:
        return leaf
    return slot_array(leaf)


def slot_tensor(leaf: SlotLeaf) -> torch.Tensor:
    """A tensor leaf as the sample had it, viewing its slot."""
    return torch.frombuffer(leaf, dtype=torch.uint8).view(leaf.dtype).view(leaf.shape)


def slot_array(leaf: SlotLeaf) -> np.ndarray:
    """An array leaf as the sample had it, viewing its slot."""
    return np.frombuffer(leaf, dtype=np.uint8).view(leaf.dtype).reshape(leaf.shape)


def slot_value(leaf: SlotLeaf) -> torch.Tensor | np.ndarray:
    return slot_array(leaf) if leaf.is_array else slot_tensor(leaf)


def loads(
    data: bytes | bytearray,
    fds: list[int],
    slots: SlotMap | None = None,
    keep_leaves: bool = False,
    arenas: ArenaPool | None = None,
) -> Any:
    """Unpickles a message; closes its descriptors (the storages mapped
    from them hold their own). `slots`: the sending process's ring, as
    mapped here; `keep_leaves`: its payloads stay `SlotLeaf`s, for a collate
    that stacks them from their slots; `arenas`: the batch arenas lent to
    its samples."""
    _received.fds, _received.storages = fds, {}
    _received.slots, _received.keep_leaves = slots, keep_leaves
    _received.arenas = arenas
    try:
        return pickle.loads(data)
    finally:
        _received.fds, _received.storages = (), {}
        _received.slots, _received.keep_leaves = None, False
        _received.arenas = None
        for fd in fds:
            os.close(fd)


# A pickle this large goes to worker processes in shared memory, written
# once, instead of through each one's socket (a dataset holding its data
# took each worker process long to receive: benchmarks/RESULTS.md).
SPILL_BYTES = 1 << 20


class Spilled:
    """A message too large for the socket: its pickle in a memfd, and its
    own descriptors. Unpickled with copies of them (the received message's
    are closed); ``load`` unpickles the message itself."""

    def __init__(self, size: int, fds: list[int]) -> None:
        self.size = size
        self.fds = fds

    def __reduce__(self) -> Any:
        return _spilled, (self.size, len(self.fds))

    def load(self) -> Any:
        spill, *fds = self.fds
        try:
            with mmap.mmap(spill, self.size, prot=mmap.PROT_READ) as mapped:
                return loads(mapped, fds)  # (closes `fds`)
        finally:
            os.close(spill)


def _spilled(size: int, count: int) -> Spilled:
    return Spilled(size, [os.dup(fd) for fd in _received.fds[: count + 1]])


def spill(payload: Payload) -> Payload:
    """`payload` as a `Spilled` message where it is large, else itself."""
    if len(payload.data) < SPILL_BYTES:
        return payload
    spill_fd = os.memfd_create("minato-message", os.MFD_CLOEXEC)
    with open(os.dup(spill_fd), "wb") as out:
        out.write(payload.data)
    owner = _OwnedFd(spill_fd)
    header = pickle.dumps(Spilled(len(payload.data), [spill_fd, *payload.fds]))
    return Payload(header, [spill_fd, *payload.fds], [*payload.keep, owner])


class _OwnedFd:
    """Closes its descriptor when collected (the payload's last send done)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        _close(self.fd)


def send(
    wire: Wire, obj: Any, ring: SlotRing | None = None, writer: ArenaWriter | None = None
) -> None:
    send_payload(wire, dumps(obj, ring, writer))


def send_payload(wire: Wire, payload: Payload) -> None:
    wire.send(payload.data, payload.fds)


def recv(wire: Wire) -> Any:
    """The next message (a `Spilled` one read from its shared memory);
    EOFError when the other end is gone."""
    data, fds = wire.receive()
    message = loads(data, fds)
    return message.load() if isinstance(message, Spilled) else message
