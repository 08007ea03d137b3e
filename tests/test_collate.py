"""The collate fast path against torch's default_collate, type by type."""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from helpers import assert_same
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch.utils.data import default_collate

import minato
from minato import _minato
from minato._loader.collate import fast_default_collate


class Point(NamedTuple):
    x: torch.Tensor
    label: int


class Record(dict):  # type: ignore[type-arg]
    """A Mapping subclass: default_collate keeps its type."""


TENSOR_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]

NUMPY_DTYPES = [
    np.bool_,
    np.uint8,
    np.int8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=generator, dtype=torch.float64) * 50
    if dtype.is_complex:
        return torch.complex(values, -values).to(dtype)
    return values.to(dtype)


def both(batch: list[Any]) -> tuple[Any, Any]:
    return fast_default_collate(pin=False)(batch), default_collate(batch)


@pytest.mark.parametrize("dtype", TENSOR_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (3,), (2, 5, 4), (0, 3)])
def test_tensors_of_every_dtype(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    batch = [random_tensor(shape, dtype, seed) for seed in range(6)]
    ours, torchs = both(batch)
    assert_same(ours, torchs)
    assert ours.is_contiguous()


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: d.__name__)
def test_numpy_arrays_of_every_dtype(dtype: type) -> None:
    rng = np.random.default_rng(0)
    batch = [(rng.normal(size=(4, 3)) * 50).astype(dtype) for _ in range(5)]
    ours, torchs = both(batch)
    assert_same(ours, torchs)


def test_non_contiguous_and_fortran_samples() -> None:
    tensors = [random_tensor((4, 6), torch.float32, seed).t() for seed in range(4)]
    assert_same(*both(tensors))
    arrays = [np.asfortranarray(np.arange(12.0).reshape(3, 4) + i) for i in range(4)]
    assert_same(*both(arrays))
    sliced = [np.arange(20, dtype=np.int32)[::2] + i for i in range(3)]
    assert_same(*both(sliced))


def test_nesting_keeps_default_collates_types() -> None:
    def sample(i: int) -> Any:
        return {
            "image": random_tensor((3, 4, 4), torch.float32, i),
            "mask": np.full((4, 4), i, dtype=np.uint8),
            "meta": Record(id=i, name=f"s{i}", score=0.5 * i, flag=bool(i % 2)),
            "point": Point(random_tensor((2,), torch.int64, i), i),
            "pair": (torch.tensor(i), [np.float32(i), np.int64(i)]),
            "raw": b"bytes",
            "ordered": collections.OrderedDict(a=torch.ones(2) * i),
        }

    batch = [sample(i) for i in range(4)]
    assert_same(*both(batch))


def test_scalars_strings_and_numpy_scalars_go_through_torch() -> None:
    for batch in (
        [1, 2, 3],
        [1.5, 2.5],
        [True, False],
        ["a", "b"],
        [np.float32(1), np.float32(2)],
        [np.array(3.0), np.array(4.0)],
    ):
        assert_same(*both(batch))


@pytest.mark.parametrize(
    "batch, error",
    [
        ([torch.zeros(2), torch.zeros(3)], RuntimeError),
        ([np.zeros(2), np.zeros(3)], RuntimeError),
        ([np.array(["a"]), np.array(["b"])], TypeError),
        ([np.array([object()]), np.array([object()])], TypeError),
        ([None, None], TypeError),
        ([[1, 2], [1]], RuntimeError),
    ],
)
def test_errors_are_torchs(batch: list[Any], error: type[Exception]) -> None:
    with pytest.raises(error) as torchs:
        default_collate(batch)
    with pytest.raises(error) as ours:
        fast_default_collate(pin=False)(batch)
    assert str(ours.value) == str(torchs.value)


def test_what_the_fast_path_leaves_to_torch_is_still_identical() -> None:
    mixed_dtypes = [torch.zeros(3, dtype=torch.float32), torch.ones(3, dtype=torch.float64)]
    grads = [torch.ones(2, requires_grad=True), torch.zeros(2, requires_grad=True)]
    big_endian = [np.arange(3, dtype=">i4"), np.arange(3, dtype=">i4")]
    conj = [torch.tensor([1 + 2j]).conj(), torch.tensor([3 - 1j]).conj()]
    for batch in (mixed_dtypes, grads, conj):
        ours, torchs = both(batch)
        torch.testing.assert_close(ours, torchs)
        assert ours.dtype == torchs.dtype and ours.requires_grad == torchs.requires_grad
    with pytest.raises(Exception) as torchs_error:
        default_collate(big_endian)
    with pytest.raises(type(torchs_error.value)):
        fast_default_collate(pin=False)(big_endian)


def test_samples_are_copied_not_shared() -> None:
    batch = [torch.zeros(3), torch.ones(3)]
    out = fast_default_collate(pin=False)(batch)
    out[0, 0] = 5
    assert batch[0][0] == 0


@settings(max_examples=60, deadline=None)
@given(
    arrays=st.integers(1, 6).flatmap(
        lambda count: hnp.array_shapes(min_dims=0, max_dims=3, max_side=5).flatmap(
            lambda shape: hnp.arrays(
                st.sampled_from([np.uint8, np.int32, np.float32, np.float64]),
                shape,
            ).flatmap(
                lambda first: st.lists(
                    hnp.arrays(first.dtype, first.shape), min_size=count, max_size=count
                )
            )
        )
    )
)
def test_any_stack_of_equal_arrays_matches_torch(arrays: list[np.ndarray]) -> None:
    ours, torchs = both(arrays)
    torch.testing.assert_close(ours, torchs, equal_nan=True, rtol=0, atol=0)
    assert ours.dtype == torchs.dtype


def test_loaders_deliver_what_torch_delivers() -> None:
    class Images(tud.Dataset):
        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int) -> tuple[torch.Tensor, np.ndarray, int]:
            return random_tensor((3, 8, 8), torch.float32, i), np.full(4, i, np.int16), i

    for workers in (0, 2):
        ours = list(minato.DataLoader(Images(), batch_size=8, num_workers=workers))
        torchs = list(tud.DataLoader(Images(), batch_size=8))
        for a, b in zip(ours, torchs, strict=True):
            assert_same(a, b)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the unpinned case")
@pytest.mark.parametrize("workers", [0, 2])
def test_unpinned_batches_keep_torchs_own_collate(workers: int) -> None:
    # Without page-locked memory the fast path saves no copy, and torch.stack
    # is as fast: the loader keeps default_collate.
    iterator = iter(minato.DataLoader(list(range(8)), batch_size=4, num_workers=workers))
    assert iterator._collate_fn is default_collate


def test_a_users_collate_fn_is_left_alone() -> None:
    calls = []

    def collate(batch: list[int]) -> list[int]:
        calls.append(len(batch))
        return batch

    loader = minato.DataLoader(list(range(10)), batch_size=5, num_workers=2, collate_fn=collate)
    assert [list(b) for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert calls == [5, 5]


# ---------------------------------------------------------------- _stack_into's arguments


def test_stack_into_takes_buffers_and_never_trusts_an_address() -> None:
    """Raw addresses from Python could crash the process (issue 30): it takes
    buffers, and refuses what no stack can be written with."""
    samples = [np.arange(4, dtype=np.uint8), np.arange(4, 8, dtype=np.uint8)]
    out = np.zeros(8, dtype=np.uint8)
    _minato._stack_into(samples, out)
    assert out.tolist() == list(range(8))
    with pytest.raises(TypeError):
        _minato._stack_into([(0, 8)], 0)  # type: ignore[list-item]
    readonly = np.zeros(8, dtype=np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _minato._stack_into(samples, readonly)
    with pytest.raises(ValueError, match="overlap"):
        _minato._stack_into([out[:4], out[4:]], out)
    strided = np.zeros(16, dtype=np.uint8)[::2]
    with pytest.raises(ValueError, match="not C-contiguous"):
        _minato._stack_into([strided], np.zeros(8, dtype=np.uint8))
    with pytest.raises(RuntimeError, match="holds 9 bytes"):
        _minato._stack_into(samples, np.zeros(9, dtype=np.uint8))
