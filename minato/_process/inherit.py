"""A dataset's large arrays (and lists of bytes or strings), taken by worker
processes from the memory the fork server inherited, where the training
process has not changed them.

torch's worker processes are forked from the training process: they share
its pages copy-on-write, a dataset's arrays included. minato's come from its
fork server, itself forked from the training process when the first loader
that may use processes is built (minato._process.workers), and get the
dataset pickled. Its large arrays would be copied into shared memory once
more: the process tree would hold them twice.

So, just before the server is forked, the large numpy arrays and CPU tensors
a loader's dataset holds are registered here (`register`); the server and
every worker forked from it inherit the registry with the rest of the memory.
When the loader later pickles its dataset for its workers, such an array is
sent as its registry key (`key_of`), and the worker takes the inherited
object (`inherited`), if the training process's copy is provably what the
server inherited:

- it is the very object registered (the registry holds a weak reference,
  dropped with the object: a later object at the same address is not
  found);
- the process has not forked since the server was forked (a later fork would
  share pages the server never had, see below);
- every page of its memory is either still shared (present and not
  exclusively mapped: ``/proc/self/pagemap``, bit 56), so never written since
  the fork, which would have copied it, or never touched (neither present nor
  swapped: zero on both sides).

An array with a few pages changed since (written in place, or sharing its
first or last page with other memory of the heap that was written) goes as
its key and those pages' current bytes (`reduction_of`): the worker writes
them into its own copy-on-write view of the inherited array
(`inherited_patched`). Anything else (most of an array changed, memory
swapped out, a kernel without pagemap, a fork server started as a fresh
interpreter) is copied, as before.

A dataset attribute that is a list (or tuple) of bytes, strings or numbers,
large in all (JPEGs held in memory, a million file names), goes the same
way: its items cannot change, so the list is unchanged where it holds the
very items it held when registered (a snapshot of them is kept). Python's
pickler does not consult ``reducer_override`` for a list, so the substitution
happens in the reduction of the object that holds it (`owner_reduction`).
The registry holds such a list strongly (a list takes no weak reference):
its memory is the fork server's too, which keeps it as long.

A pandas DataFrame's columns go the same way: its numpy blocks as arrays,
and the buffers of the columns pyarrow holds (pandas 3's strings). pyarrow
pickles its buffers out of band (minato._process.ipc); one that lies in a
registered column's memory, unchanged, goes as the column's registry key,
the buffer's place among its buffers and an offset (`buffer_key_of`), and
the worker reads it in place through pyarrow's own buffer object
(`inherited_buffer`).
"""

from __future__ import annotations

import copyreg
import itertools
import mmap
import os
import sys
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch

from minato._minato import _same_items, _scalar_items_bytes
from minato._util.fork import ForkSafeLock

# Arrays smaller than this are pickled as before.
MIN_BYTES = 1 << 20
# Objects looked at per dataset while registering (its attributes, the items
# of its lists, tuples and dicts, breadth first): enough to reach the arrays
# a dataset keeps (TensorDataset.tensors, Subset.dataset, self.data), and
# never a walk of a list of a million file names.
WALK_BUDGET = 2000

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy 1
    byte_bounds = np.byte_bounds  # type: ignore[attr-defined]

_PRESENT = np.uint64(1 << 63)
_SWAPPED = np.uint64(1 << 62)
_FILE_OR_SHARED = np.uint64(1 << 61)
_EXCLUSIVE = np.uint64(1 << 56)

_lock = ForkSafeLock()
# id(object) -> (a weak reference to it, forks counted when it was registered).
_registry: dict[int, tuple[weakref.ref[Any], int]] = {}
# id(list) -> (the list, a snapshot of its items, forks counted when
# registered); and the lists whose items were found to be scalars.
_lists: dict[int, tuple[Any, tuple[Any, ...], int]] = {}
_scalar_lists: set[int] = set()
# The registered arrays of Python objects found to hold only scalars, with
# the references on their first and last pages when registered (see
# `reduction_of`).
_scalar_objects: dict[int, tuple[bytes, bytes]] = {}
# The types of the objects that held registered lists (see owner_reduction).
_owner_types: set[type] = set()
# id(pyarrow array) -> (a weak reference to it, forks counted when it was
# registered, the (address, size) of each of its buffers, in order).
_arrow: dict[int, tuple[weakref.ref[Any], int, list[tuple[int, int]]]] = {}

# Lists longer than this are not inherited.
MAX_LIST_ITEMS = 10_000_000
# Lists this long count as large whatever their items.
LONG_LIST = 1 << 14
# Forks of this process, and their count just after the fork server's.
_forks = 0
_server_forked_at: int | None = None


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_parent=_count_fork)


def _memory_of(obj: Any, objects: bool = False) -> tuple[int, int] | None:
    """The address range of a large array's or CPU tensor's memory. Not an
    array of Python objects unless `objects` (its items were found to be
    scalars, see `_scalar_objects`): its memory holds only references, and
    an item changed in place since the fork (a list of boxes, say) would
    reach the workers as the fork server has it, stale."""
    if type(obj) is np.ndarray and obj.nbytes >= MIN_BYTES and (objects or not obj.dtype.hasobject):
        low, high = byte_bounds(obj)
        return int(low), int(high)
    if type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.nbytes >= MIN_BYTES:
        storage = obj.untyped_storage()
        start = storage.data_ptr()
        return start, start + storage.nbytes()
    return None


def _list_bytes(items: Any) -> int:
    """About the bytes a list or tuple of scalars (or of tuples of scalars)
    holds, or -1 where it holds anything else. Checked in Rust, which writes
    no item's reference count: Python's loops would, and once the fork
    server is forked, every page holding an item would be copied into the
    training process (a million file names held twice)."""
    if len(items) > MAX_LIST_ITEMS:
        return -1
    return _scalar_items_bytes(items)


def _large_lists_of(obj: Any) -> dict[str, Any]:
    """The attributes of `obj` that are lists or tuples of scalars, large in
    all: checked now where short, else only when first sent (a long list's
    length makes it large enough; what it holds is checked then, so that a
    loader's construction does not scan a million file names)."""
    found = {}
    for name, value in getattr(obj, "__dict__", {}).items():
        if type(value) not in (list, tuple):
            continue
        if len(value) >= LONG_LIST or _list_bytes(value) >= MIN_BYTES:
            found[name] = value
    return found


def _large_arrays(root: Any, owners: list[tuple[Any, dict[str, Any]]]) -> list[Any]:
    """The large arrays reachable from `root`; the objects holding large
    lists go into `owners`."""
    found: list[Any] = []
    seen: set[int] = set()
    queue = deque([root])
    while queue and len(seen) < WALK_BUDGET:
        obj = queue.popleft()
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
            continue
        seen.add(id(obj))
        if _memory_of(obj, objects=True) is not None:
            found.append(obj)
        elif _is_arrow(obj):
            found.append(obj)
        elif (parts := _pandas_parts(obj)) is not None:
            queue.extend(parts)
        elif isinstance(obj, (list, tuple)):
            queue.extend(itertools.islice(obj, WALK_BUDGET))
        elif isinstance(obj, dict):
            queue.extend(itertools.islice(obj.values(), WALK_BUDGET))
        elif not isinstance(obj, (np.ndarray, torch.Tensor, type)):
            lists = _large_lists_of(obj)
            if lists:
                owners.append((obj, lists))
            queue.extend(getattr(obj, "__dict__", {}).values())
    return found


def _is_arrow(obj: Any) -> bool:
    pyarrow = sys.modules.get("pyarrow")
    return pyarrow is not None and isinstance(obj, (pyarrow.Array, pyarrow.ChunkedArray))


def _pandas_of(obj: Any) -> Any:
    """The pandas module, where `obj` is one of its objects; else None."""
    if type(obj).__module__.partition(".")[0] != "pandas":
        return None
    return sys.modules.get("pandas")


def _pandas_parts(obj: Any) -> list[Any] | None:
    """What a pandas frame or series holds its columns in (its blocks'
    values: numpy arrays, or pandas arrays), and the pyarrow array a pandas
    array of pyarrow's holds; None for anything else."""
    pandas = _pandas_of(obj)
    if pandas is None:
        return None
    try:
        if isinstance(obj, (pandas.DataFrame, pandas.Series)):
            return [block.values for block in obj._mgr.blocks]
        if isinstance(obj, pandas.arrays.ArrowExtensionArray):
            return [obj._pa_array]
    except AttributeError:  # another pandas' internals: copied, as before
        return None
    return None


def _arrow_buffers(array: Any) -> list[Any]:
    """A pyarrow array's buffers in memory, in a fixed order."""
    chunks = array.chunks if hasattr(array, "chunks") else [array]
    return [
        buffer
        for chunk in chunks
        for buffer in chunk.buffers()
        if buffer is not None and buffer.is_cpu
    ]


def register(dataset: Any) -> None:
    """Call just before the fork server is forked: the dataset's large
    arrays become ones its workers may take from inherited memory."""
    owners: list[tuple[Any, dict[str, Any]]] = []
    arrays = _large_arrays(dataset, owners)
    with _lock:
        for array in arrays:
            key = id(array)
            if _is_arrow(array):
                found = _arrow.get(key)
                if found is None or found[0]() is not array:
                    ranges = [(buffer.address, buffer.size) for buffer in _arrow_buffers(array)]
                    if sum(size for _, size in ranges) >= MIN_BYTES:
                        reference = weakref.ref(array, _forgetter(key, _arrow))
                        _arrow[key] = (reference, _forks, ranges)
                continue
            if type(array) is np.ndarray and array.dtype.hasobject:
                # Checked here, before the fork: the loop writes each
                # item's reference count, which after it would copy pages.
                if not _holds_scalars(array):
                    continue
                _scalar_objects[key] = _edges(array)
            else:
                _scalar_objects.pop(key, None)
            entry = _registry.get(key)
            if entry is None or entry[0]() is not array:
                _registry[key] = (weakref.ref(array, _forgetter(key)), _forks)
        for owner, lists in owners:
            _owner_types.add(type(owner))
            for items in lists.values():
                if id(items) not in _lists or _lists[id(items)][0] is not items:
                    _lists[id(items)] = (items, tuple(items), _forks)


# Scalar types whose objects never change: an array of such objects held at
# unchanged addresses holds what it held at the fork.
_SCALARS = (str, bytes, int, float, bool, type(None))


def _holds_scalars(array: np.ndarray) -> bool:
    """Whether an array of Python objects holds only scalars (a column of
    strings as pandas 2 holds it), and is one plain run of references."""
    return array.flags.c_contiguous and all(
        type(item) in _SCALARS for item in array.reshape(-1).tolist()
    )


def _edges(array: np.ndarray) -> tuple[bytes, bytes]:
    """The bytes of `array` on its first and on its last page."""
    raw = memoryview(array.reshape(-1)).cast("B")  # numpy will not view references as bytes
    page = mmap.PAGESIZE
    start = int(array.__array_interface__["data"][0])
    first = page - start % page
    last = (start + len(raw)) % page or page
    return bytes(raw[:first]), bytes(raw[-last:])


def _forgetter(key: int, registry: dict[int, Any] | None = None) -> Any:
    """A weak reference's callback: its registry entry goes with the array."""
    # Held here: at interpreter exit the module's names may be gone first.
    lock = _lock
    if registry is None:
        registry = _registry

    def forget(reference: weakref.ref[Any]) -> None:
        with lock:
            entry = registry.get(key)
            if entry is not None and entry[0] is reference:
                del registry[key]

    return forget


def server_forked() -> None:
    """Call in the training process right after forking the fork server."""
    global _server_forked_at
    _server_forked_at = _forks


def _page_entries(start: int, end: int) -> np.ndarray | None:
    """The page map's entries for the pages of [start, end); None where one
    is swapped out or the map cannot be read."""
    page = mmap.PAGESIZE
    first, last = start // page, (end - 1) // page
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
            pagemap.seek(first * 8)
            data = pagemap.read((last - first + 1) * 8)
    except OSError:
        return None
    if len(data) != (last - first + 1) * 8:
        return None
    entries = np.frombuffer(data, dtype=np.uint64)
    if np.any((entries & _SWAPPED) != 0):
        return None
    return entries


def _written(entries: np.ndarray) -> np.ndarray:
    """The pages this process wrote since its last fork (present and
    exclusively mapped), numbered from the first."""
    return np.flatnonzero(((entries & _PRESENT) != 0) & ((entries & _EXCLUSIVE) != 0))


def _changed_pages(start: int, end: int) -> np.ndarray | None:
    """The pages of [start, end) this process wrote since its last fork;
    None where that cannot be told."""
    entries = _page_entries(start, end)
    return None if entries is None else _written(entries)


def _pages_unchanged(start: int, end: int) -> bool:
    changed = _changed_pages(start, end)
    return changed is not None and len(changed) == 0


def _valid(registered_at: int) -> bool:
    """Whether what was registered when `registered_at` forks were counted
    is in the fork server's memory as the training process has it now."""
    forked_at = _server_forked_at
    return forked_at is not None and _forks == forked_at and registered_at < forked_at


def owner_reduction(obj: Any, protocol: int) -> Any:
    """`obj`'s reduction with its registered lists, where unchanged, as
    references to the fork server's memory; None where it has none. Asked
    of any object of a type that held one when registered: the loader
    sends each worker a copy of the dataset (minato._thread.dataset), a new
    object holding the same lists."""
    if type(obj) not in _owner_types:
        return None
    attributes = getattr(obj, "__dict__", None)
    if not isinstance(attributes, dict) or not any(
        id(value) in _lists for value in attributes.values()
    ):
        return None
    reduced = obj.__reduce_ex__(protocol)
    if not isinstance(reduced, tuple) or len(reduced) < 3 or not isinstance(reduced[2], dict):
        return None
    state = dict(reduced[2])
    changed = False
    for name, value in reduced[2].items():
        key = _list_key_of(value)
        if key is not None:
            state[name] = _InheritedList(key)
            changed = True
    if not changed:
        return None
    return (*reduced[:2], state, *reduced[3:])


def _list_key_of(items: Any) -> int | None:
    entry = _lists.get(id(items))
    if entry is None or entry[0] is not items or not _valid(entry[2]):
        return None
    snapshot = entry[1]
    if not _same_items(items, snapshot):
        return None
    if id(items) not in _scalar_lists:
        if _list_bytes(snapshot) < 0:
            return None
        _scalar_lists.add(id(items))
    return id(items)


class _InheritedList:
    """Pickled as a reference to a registered list in the server's memory."""

    __slots__ = ("key",)

    def __init__(self, key: int) -> None:
        self.key = key

    def __reduce__(self) -> Any:
        return inherited_list, (self.key,)


def inherited_list(key: int) -> Any:
    """In a worker process: the list registered under `key`."""
    entry = _lists.get(key)
    if entry is None:
        raise RuntimeError("minato: a dataset list was not found in the fork server's memory")
    return entry[0]


def _registered_memory(obj: Any) -> tuple[int, int, bool] | None:
    """The memory of `obj` where it is a registered array the fork server
    inherited (no fork since), and whether it holds Python scalars."""
    entry = _registry.get(id(obj))
    if entry is None or entry[0]() is not obj or not _valid(entry[1]):
        return None
    objects = id(obj) in _scalar_objects
    memory = _memory_of(obj, objects)
    return None if memory is None else (*memory, objects)


def key_of(obj: Any) -> int | None:
    """The registry key a worker process finds `obj` under, unchanged, in
    the memory its fork server inherited; None where it must be copied or
    patched (`reduction_of`)."""
    found = _registered_memory(obj)
    if found is None or not _pages_unchanged(*found[:2]):
        return None
    return id(obj)


# An array with more than this share of its pages changed is copied whole.
MAX_CHANGED_SHARE = 0.25


def reduction_of(obj: Any) -> Any:
    """How a registered array goes to a worker process: its key, with the
    bytes of the pages changed since the fork server's fork where there are
    a few; None where it must be copied."""
    found = _registered_memory(obj)
    if found is None:
        return None
    start, end, objects = found
    entries = _page_entries(start, end)
    if entries is None:
        return None
    changed = _written(entries)
    if not len(changed):
        return inherited, (id(obj),)
    if objects:
        # Changed references would point to objects the fork server never
        # had; but a first or last page also holds other memory of the heap,
        # whose writes copy it with the references unchanged.
        edges_only = set(changed.tolist()) <= {0, len(entries) - 1}
        if not edges_only or _edges(obj) != _scalar_objects.get(id(obj)):
            return None
        return inherited, (id(obj),)
    # Writable here as in the worker, which writes the patches, and private
    # memory, which its writes leave its own: a patch written into a file's
    # or shared memory would reach every process that maps it.
    raw = _raw_bytes(obj, writable=True)
    if raw is None or np.any((entries & _FILE_OR_SHARED) != 0):
        return None
    if len(changed) > MAX_CHANGED_SHARE * len(entries):
        return None
    page = mmap.PAGESIZE
    patches = []
    origin = start // page * page
    for run in np.split(changed, np.flatnonzero(np.diff(changed) != 1) + 1):
        low = max(start, origin + int(run[0]) * page)
        high = min(end, origin + (int(run[-1]) + 1) * page)
        patches.append((low - start, raw[low - start : high - start].tobytes()))
    return inherited_patched, (id(obj), patches)


def _raw_bytes(obj: Any, writable: bool = False) -> np.ndarray | None:
    """The bytes `_memory_of(obj)` spans, as a flat uint8 array over them;
    None where they are not one plain run of the object's own memory (a
    strided view), or, with `writable`, cannot be written."""
    if type(obj) is np.ndarray:
        if not obj.flags.c_contiguous or (writable and not obj.flags.writeable):
            return None
        return obj.reshape(-1).view(np.uint8)
    storage = obj.untyped_storage()
    flat = torch.empty((0,), dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),))
    return flat.numpy()


def inherited_patched(key: int, patches: list[tuple[int, bytes]]) -> Any:
    """In a worker process: the object registered under `key`, with the
    bytes the training process changed since written over this process's
    copy of them (copy-on-write: the fork server's and other workers' stay
    as they are)."""
    found = inherited(key)
    raw = _raw_bytes(found, writable=True)
    if raw is None:
        raise RuntimeError("minato: a dataset array in the fork server's memory cannot be updated")
    for offset, data in patches:
        raw[offset : offset + len(data)] = np.frombuffer(data, dtype=np.uint8)
    return found


def inherited(key: int) -> Any:
    """In a worker process: the object registered under `key`."""
    entry = _registry.get(key)
    found = None if entry is None else entry[0]()
    if found is None:
        raise RuntimeError("minato: a dataset array was not found in the fork server's memory")
    return found


def buffer_key_of(view: memoryview) -> tuple[int, int, int] | None:
    """Where a worker process finds `view` unchanged in the memory its fork
    server inherited: the registry key of the pyarrow array whose buffer
    holds it, that buffer's place among the array's, and the view's offset
    in it; None where it must be copied."""
    if not _arrow or view.nbytes == 0:
        return None
    start = int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])
    end = start + view.nbytes
    with _lock:
        entries = list(_arrow.items())
    for key, (reference, registered_at, ranges) in entries:
        for index, (address, size) in enumerate(ranges):
            if address <= start and end <= address + size:
                # An array alive holds the buffers it was registered with
                # (pyarrow's arrays never change).
                if reference() is None or not _valid(registered_at):
                    return None
                if not _pages_unchanged(start, end):
                    return None
                return key, index, start - address
    return None


# A worker process's buffers of each registered array (`inherited_buffer`),
# with the array.
_buffers_of: dict[int, tuple[Any, list[Any]]] = {}


def inherited_buffer(key: int, index: int, offset: int, size: int) -> memoryview:
    """In a worker process: `size` bytes from `offset` of buffer `index` of
    the pyarrow array registered under `key`, read-only, in place."""
    entry = _arrow.get(key)
    array = None if entry is None else entry[0]()
    if array is None:
        raise RuntimeError("minato: a dataset column was not found in the fork server's memory")
    cached = _buffers_of.get(key)
    if cached is None or cached[0] is not array:
        cached = _buffers_of[key] = (array, _arrow_buffers(array))
    return memoryview(cached[1][index])[offset : offset + size].toreadonly()


def arrow_column_reduction(obj: Any) -> Any:
    """A pandas column of pyarrow's reduced as it is held, its chunks
    uncombined (pandas' own ``__getstate__`` combines them into a copy, not
    the memory the fork server inherited); None for anything else."""
    arrays = getattr(_pandas_of(obj), "arrays", None)
    kind = getattr(arrays, "ArrowExtensionArray", None)
    if kind is None or not isinstance(obj, kind) or id(obj._pa_array) not in _arrow:
        return None
    state = dict(obj.__dict__)
    state["_cache"] = {}  # as pandas pickles it: recomputed
    return copyreg.__newobj__, (type(obj),), state
