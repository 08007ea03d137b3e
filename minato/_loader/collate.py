"""default_collate with one allocation per batch tensor, filled in Rust.

torch's ``default_collate`` stacks samples into a new tensor, and its
pin-memory thread then copies that batch into page-locked memory: two
copies on the host. Here a batch going to a GPU has each tensor allocated
once, page-locked, and the samples are copied into it by Rust threads with
the GIL released. Unpinned, tensors and arrays are stacked by torch's own
code, as fast. Everything that is not a tensor or numpy array of one shape
and dtype goes through torch's own code, so results (types, dtypes,
nesting, errors) are exactly ``default_collate``'s.

From worker processes, a sample's large tensors and arrays arrive as
``SlotLeaf``s, their bytes still in the process's ring (rust/wire/slots.rs)
or in their place in their batch's arena (rust/wire/arena.rs): a batch
whose samples all kept their places is handed out as it lies there, and
any other is stacked straight from where its leaves lie, no tensor made per
sample; anything else they meet is made of them as the sample had it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils import collate as _collate

from minato import _minato
from minato._minato import SlotLeaf
from minato._process.ipc import slot_value

# From this many bytes a batch is copied by Rust threads, the GIL released
# (rust/collate/stack.rs copies in parallel from 1 MiB).
RUST_FROM_BYTES = 1 << 20


def _stack(samples: Sequence[torch.Tensor], pin: bool) -> torch.Tensor | None:
    """The samples stacked as ``torch.stack`` would, or None if torch must do it."""
    first = samples[0]
    shape, dtype = first.shape, first.dtype
    for sample in samples:
        # Subclasses, autograd, views with lazy conj/neg bits, sparse, nested
        # and device tensors: torch's code handles them (or raises its error).
        if (
            type(sample) is not torch.Tensor
            or sample.shape != shape
            or sample.dtype != dtype
            or sample.device.type != "cpu"
            or sample.layout != torch.strided
            or sample.requires_grad
            or sample.is_conj()
            or sample.is_neg()
        ):
            return None
    contiguous = [sample.contiguous() for sample in samples]
    out = torch.empty((len(samples), *shape), dtype=dtype, pin_memory=pin)
    if out.nbytes < RUST_FROM_BYTES:
        # A small batch: torch's own stack, straight into `out`, costs less
        # than making each sample a buffer for Rust.
        torch.stack(contiguous, out=out)
    else:
        _minato._stack_into([_bytes_of(sample) for sample in contiguous], _bytes_of(out))
    return out


def _bytes_of(tensor: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's bytes, as a buffer (numpy's view of them)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _tensor_fn(pin: bool) -> Callable[..., Any]:
    torch_fn = _collate.default_collate_fn_map[torch.Tensor]

    def collate_tensors(batch: Sequence[torch.Tensor], *, collate_fn_map: Any = None) -> Any:
        stacked = _stack(batch, pin)
        if stacked is None:
            return torch_fn(_values(batch), collate_fn_map=collate_fn_map)
        return stacked

    return collate_tensors


def _ndarray_fn(pin: bool) -> Callable[..., Any]:
    torch_fn = _collate.default_collate_fn_map[np.ndarray]

    def collate_arrays(batch: Sequence[np.ndarray], *, collate_fn_map: Any = None) -> Any:
        first = batch[0]
        if (
            _collate.np_str_obj_array_pattern.search(first.dtype.str) is None
            and first.dtype.isnative
            and all(
                type(array) is np.ndarray
                and array.shape == first.shape
                and array.dtype == first.dtype
                for array in batch
            )
        ):
            # torch.as_tensor shares each array's memory: no copy before the stack.
            stacked = _stack([torch.as_tensor(array) for array in batch], pin)
            if stacked is not None:
                return stacked
        return torch_fn(_values(batch), collate_fn_map=collate_fn_map)

    return collate_arrays


def _with_values(torch_fn: Callable[..., Any]) -> Callable[..., Any]:
    """torch's collate function for a leaf type, for a batch that may mix in
    slot leaves (a sample that found its ring full came as a tensor)."""

    def collate_values(batch: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
        return torch_fn(_values(batch), collate_fn_map=collate_fn_map)

    return collate_values


def _values(batch: Sequence[Any]) -> list[Any]:
    """`batch` with any SlotLeaf made the tensor or array it was."""
    return [slot_value(item) if type(item) is SlotLeaf else item for item in batch]


# The torch dtype numpy arrays of each dtype become (torch.as_tensor's).
_torch_dtypes: dict[Any, torch.dtype] = {}


def _leaf_dtype(leaf: SlotLeaf) -> torch.dtype:
    if not leaf.is_array:
        return leaf.dtype
    dtype = _torch_dtypes.get(leaf.dtype)
    if dtype is None:
        dtype = _torch_dtypes[leaf.dtype] = torch.from_numpy(np.empty(0, leaf.dtype)).dtype
    return dtype


def _slot_leaf_fn(pin: bool) -> Callable[..., Any]:
    def collate_slot_leaves(batch: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
        first = batch[0]
        # Arrays in a byte order torch lacks go through torch's code, and its error.
        native = not first.is_array or first.dtype.isnative
        if native and _minato._uniform_leaves(batch):
            in_place = None if pin else _minato._arena_batch(batch)
            if in_place is not None:
                # Every sample kept its place in the batch's arena: the batch
                # is handed out as it lies there.
                out = torch.frombuffer(in_place, dtype=torch.uint8)
                return out.view(_leaf_dtype(first)).view((len(batch), *first.shape))
            out = torch.empty((len(batch), *first.shape), dtype=_leaf_dtype(first), pin_memory=pin)
            _minato._stack_into(batch, _bytes_of(out))
            return out
        values = _values(batch)
        return _collate.collate(values, collate_fn_map=collate_fn_map)

    return collate_slot_leaves


def fast_default_collate(pin: bool) -> Callable[[list[Any]], Any]:
    """``default_collate``, with tensor and array leaves stacked in Rust (into
    page-locked memory when ``pin``)."""
    collate_fn_map = dict(_collate.default_collate_fn_map)
    if pin:
        collate_fn_map[torch.Tensor] = _tensor_fn(pin)
        collate_fn_map[np.ndarray] = _ndarray_fn(pin)
    else:
        # Unpinned, torch's own stack of tensors and arrays is as fast
        # (benchmarks/collate.py), and on many worker threads collating at
        # once it ran faster (benchmarks/RESULTS.md): only the slot
        # leaves of samples from worker processes take the Rust path.
        collate_fn_map[torch.Tensor] = _with_values(_collate.default_collate_fn_map[torch.Tensor])
        collate_fn_map[np.ndarray] = _with_values(_collate.default_collate_fn_map[np.ndarray])
    collate_fn_map[SlotLeaf] = _slot_leaf_fn(pin)

    def collate(batch: list[Any]) -> Any:
        return _collate.collate(batch, collate_fn_map=collate_fn_map)

    collate.__doc__ = fast_default_collate.__doc__
    collate.draws_no_random = True  # type: ignore[attr-defined]
    # Worker processes may leave samples' payloads in their slots.
    collate.takes_slot_leaves = True  # type: ignore[attr-defined]
    return collate
