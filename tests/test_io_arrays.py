"""minato.io's load_npy and load_npz: numpy.load's results, zero-copy, and a
DecodeError (never a crash) for anything hostile."""

from __future__ import annotations

import io
import mmap
import pathlib
import pickle
import struct
import zipfile
from typing import Any, Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minato._io.array import DEFAULT_MAX_BYTES, load_npy, load_npz
from minato._minato import DecodeError

NUMERIC = [
    "?",
    "i1",
    "i2",
    "i4",
    "i8",
    "u1",
    "u2",
    "u4",
    "u8",
    "f2",
    "f4",
    "f8",
    "c8",
    "c16",
]
SHAPES = [(), (0,), (5,), (2, 3), (2, 0, 3), (2, 3, 4)]
BYTE_ORDERS: list[Literal["<", ">"]] = ["<", ">"]


def sample(dtype: np.dtype, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Values that exercise every byte of the dtype: negatives, fractions, NaN."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    if dtype.kind == "b":
        values = rng.integers(0, 2, size).astype(bool)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(
            info.min, info.max, size, dtype=dtype.newbyteorder("="), endpoint=True
        )
    elif dtype.kind == "f":
        values = rng.normal(0, 1e3, size)
        values[::7] = np.nan
    else:
        values = rng.normal(0, 1e3, size) + 1j * rng.normal(0, 1e3, size)
    return np.asarray(values).astype(dtype).reshape(shape)


def npy_bytes(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, array, version=version, allow_pickle=True)
    return out.getvalue()


def npz_bytes(compressed: bool, *args: Any, **arrays: Any) -> bytes:
    out = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(out, *args, **arrays)
    return out.getvalue()


def numpy_npz(data: bytes) -> dict[str, Any]:
    with np.load(io.BytesIO(data)) as archive:
        return dict(archive)


def assert_same(actual: Any, expected: Any) -> None:
    if isinstance(expected, bytes):
        assert actual == expected
        return
    assert isinstance(actual, np.ndarray)
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected, strict=True)


def assert_same_dict(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    assert list(actual) == list(expected)
    for key, value in expected.items():
        assert_same(actual[key], value)


# --- load_npy: numpy's results -----------------------------------------------


@pytest.mark.parametrize("code", NUMERIC)
@pytest.mark.parametrize("order", BYTE_ORDERS)
def test_npy_matches_numpy_for_every_numeric_dtype(code: str, order: Literal["<", ">"]) -> None:
    dtype = np.dtype(code).newbyteorder(order)
    for shape in SHAPES:
        for fortran in (False, True):
            array = sample(dtype, shape)
            if fortran:
                array = np.asfortranarray(array)
            for version in [(1, 0), (2, 0), (3, 0)]:
                data = npy_bytes(array, version)
                expected = np.load(io.BytesIO(data))
                loaded = load_npy(data)
                assert_same(loaded, expected)
                assert loaded.flags.c_contiguous == expected.flags.c_contiguous
                assert loaded.flags.f_contiguous == expected.flags.f_contiguous


def test_npy_ignores_trailing_bytes_as_numpy_does() -> None:
    data = npy_bytes(np.arange(6, dtype="<i4")) + b"trailing junk"
    assert_same(load_npy(data), np.load(io.BytesIO(data)))


def test_npy_reads_python2_headers() -> None:
    header = b"{'descr': '<i2', 'fortran_order': False, 'shape': (2L, 3L), }"
    header = header.ljust(128 - 10 - 1) + b"\n"
    data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + bytes(range(12))
    with pytest.warns(UserWarning):
        expected = np.load(io.BytesIO(data))
    assert_same(load_npy(data), expected)


# --- load_npy: inputs, and no copies -----------------------------------------


def test_npy_over_bytes_is_a_read_only_view() -> None:
    data = npy_bytes(np.arange(10.0))
    loaded = load_npy(data)
    assert not loaded.flags.writeable
    assert np.shares_memory(loaded, np.frombuffer(data, np.uint8))


def test_npy_over_a_bytearray_is_a_writable_view() -> None:
    data = bytearray(npy_bytes(np.arange(10, dtype="<i8")))
    loaded = load_npy(data)
    loaded[3] = -1
    assert np.load(io.BytesIO(bytes(data)))[3] == -1


def test_npy_over_memoryview_and_numpy_buffers() -> None:
    array = np.arange(24, dtype=">u2").reshape(4, 6)
    data = npy_bytes(array)
    padded = b"xx" + data
    assert_same(load_npy(memoryview(padded)[2:]), array)
    assert_same(load_npy(np.frombuffer(data, np.uint8)), array)


def test_npy_over_mmap_is_a_view(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a.npy"
    np.save(path, np.zeros(100, dtype="<f4"))
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), 0) as mapped:
        loaded = load_npy(mapped)
        loaded[7] = 2.5
        del loaded
        mapped.flush()
    assert np.load(path)[7] == 2.5


def test_npy_from_a_path(tmp_path: pathlib.Path) -> None:
    array = sample(np.dtype(">c16"), (3, 2))
    path = tmp_path / "a.npy"
    np.save(path, array)
    assert_same(load_npy(path), array)
    assert_same(load_npy(str(path)), array)
    with pytest.raises(FileNotFoundError):
        load_npy(tmp_path / "missing.npy")


# --- load_npy: refusals ------------------------------------------------------


def test_npy_refuses_object_arrays() -> None:
    data = npy_bytes(np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(DecodeError, match="object arrays"):
        load_npy(data)
    data = npy_bytes(np.zeros(2, dtype=[("a", "<i4"), ("b", "O")]))
    with pytest.raises(DecodeError, match="object arrays"):
        load_npy(data)


@pytest.mark.parametrize(
    "array",
    [
        np.array(["ab", "c"]),
        np.array([b"ab"]),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
        np.zeros(2, dtype="M8[ns]"),
        np.zeros(2, dtype=np.longdouble),
    ],
    ids=["unicode", "bytes", "structured", "datetime", "longdouble"],
)
def test_npy_refuses_other_dtypes(array: np.ndarray) -> None:
    with pytest.raises(DecodeError, match="NPY: unsupported"):
        load_npy(npy_bytes(array))


def test_npy_refuses_pickles_and_other_formats() -> None:
    for data in [pickle.dumps(np.arange(3)), npz_bytes(False, a=np.arange(3)), b"", b"\x93NUM"]:
        with pytest.raises(DecodeError, match="^NPY: "):
            load_npy(data)


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(DecodeError, ValueError)
    with pytest.raises(ValueError, match="NPY: truncated data: expected 80 bytes"):
        load_npy(npy_bytes(np.arange(10.0))[:-1])


def test_npy_rejects_other_argument_types() -> None:
    with pytest.raises(TypeError):
        load_npy(12)  # type: ignore[arg-type]


def test_npy_every_truncation_is_a_decode_error() -> None:
    data = npy_bytes(np.arange(6, dtype="<i2").reshape(2, 3))
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            load_npy(data[:cut])


def test_npy_every_flipped_byte_agrees_with_numpy() -> None:
    data = npy_bytes(np.arange(6, dtype="<i2").reshape(2, 3))
    for at in range(len(data)):
        for mask in (0x01, 0x20, 0xFF):
            flipped = bytearray(data)
            flipped[at] ^= mask
            check_npy_against_numpy(bytes(flipped))


def check_npy_against_numpy(data: bytes) -> None:
    """minato refuses with DecodeError, or gives numpy's array."""
    try:
        loaded = load_npy(data)
    except DecodeError:
        return
    try:
        expected = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as err:  # numpy's own failures vary: ValueError, UnicodeError...
        pytest.fail(f"minato loaded what numpy refuses ({err!r}): {data!r}")
    assert_same(loaded, expected)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_npy_random_bytes_never_crash(data: bytes) -> None:
    check_npy_against_numpy(b"\x93NUMPY" + data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hnp.arrays(
        hnp.scalar_dtypes().filter(lambda dtype: dtype.kind in "biufc" and dtype.itemsize <= 16),
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    ),
    st.booleans(),
)
def test_npy_round_trips_any_numeric_array(array: np.ndarray, fortran: bool) -> None:
    if array.dtype.kind == "f" and array.dtype.itemsize > 8 or array.dtype == np.clongdouble:
        return
    if fortran:
        array = np.asfortranarray(array)
    assert_same(load_npy(npy_bytes(array)), array)


# --- load_npz: numpy's results -----------------------------------------------


@pytest.mark.parametrize("compressed", [False, True], ids=["savez", "savez_compressed"])
def test_npz_matches_numpy(compressed: bool) -> None:
    arrays = {
        f"{code}_{order}_{i}": sample(np.dtype(code).newbyteorder(order), shape, seed=i)
        for code in NUMERIC
        for order in BYTE_ORDERS
        for i, shape in enumerate(SHAPES)
    }
    arrays["fortran"] = np.asfortranarray(sample(np.dtype("<f4"), (3, 4, 5)))
    data = npz_bytes(compressed, np.arange(3), np.eye(2), **arrays)
    loaded = load_npz(data)
    assert_same_dict(loaded, numpy_npz(data))
    assert list(loaded)[-2:] == ["arr_0", "arr_1"]
    assert loaded["fortran"].flags.f_contiguous


def test_npz_empty_archive() -> None:
    data = npz_bytes(False)
    assert data.startswith(b"PK\x05\x06")
    assert load_npz(data) == numpy_npz(data) == {}


def test_npz_stored_members_are_views_and_deflated_ones_own_their_memory() -> None:
    stored = npz_bytes(False, a=np.arange(100.0))
    loaded = load_npz(stored)["a"]
    assert np.shares_memory(loaded, np.frombuffer(stored, np.uint8))
    assert not loaded.flags.writeable
    deflated = load_npz(npz_bytes(True, a=np.arange(100.0)))["a"]
    assert deflated.flags.writeable
    deflated[0] = 5.0


def test_npz_inputs(tmp_path: pathlib.Path) -> None:
    arrays: dict[str, Any] = {
        "x": np.arange(12, dtype=">i4").reshape(3, 4),
        "y": np.ones(3, dtype="c8"),
    }
    for compressed in (False, True):
        path = tmp_path / f"a{compressed}.npz"
        (np.savez_compressed if compressed else np.savez)(path, **arrays)
        data = path.read_bytes()
        for source in (data, bytearray(data), memoryview(data), path, str(path)):
            assert_same_dict(load_npz(source), arrays)
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as m:
            loaded = load_npz(m)
            assert_same_dict(loaded, arrays)
            del loaded


def test_npz_unicode_keys_and_other_members() -> None:
    data = npz_bytes(True, **{"é": np.arange(3), "naïve/key": np.ones(2)})
    assert_same_dict(load_npz(data), numpy_npz(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("notes.txt", b"not an array")
        archive.writestr("x.npy", npy_bytes(np.arange(4)))
        archive.writestr("x", npy_bytes(np.arange(2)), compress_type=zipfile.ZIP_DEFLATED)
        archive.writestr("cp437-\xe9.npy", npy_bytes(np.arange(1)))
    data = out.getvalue()
    loaded = load_npz(data)
    assert loaded["notes.txt"] == b"not an array"
    assert_same_dict(loaded, numpy_npz(data))


def test_npz_archive_comments() -> None:
    for comment in [b"a comment", b"PK\x05\x06 looks like an end record", b"x" * 0xFFFF]:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            archive.writestr("a.npy", npy_bytes(np.arange(5)))
            archive.comment = comment
        data = out.getvalue()
        check_npz_against_numpy(data)
        if b"PK" not in comment:
            assert_same_dict(load_npz(data), numpy_npz(data))


def test_npz_refuses_prepended_data_as_numpy_does() -> None:
    data = b"#!/bin/sh\n" + npz_bytes(False, a=np.arange(3))
    with pytest.raises(DecodeError, match="not a ZIP archive"):
        load_npz(data)


def test_npz_data_descriptors() -> None:
    class Unseekable(io.RawIOBase):
        def __init__(self) -> None:
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, chunk: Any) -> int:
            self.data += chunk
            return len(chunk)

    sink = Unseekable()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("a.npy", "w", force_zip64=True) as member:
            member.write(npy_bytes(np.arange(50)))
    data = bytes(sink.data)
    assert struct.unpack("<H", data[6:8])[0] & 0x8, "expected a data descriptor"
    assert_same_dict(load_npz(data), numpy_npz(data))


def test_npz_zip64_records_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    # zipfile writes ZIP64 fields past these limits; lowering them gives a
    # small archive with ZIP64 sizes and offsets in the central directory and
    # a ZIP64 end record.
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 8)
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 1)
    for compressed in (False, True):
        data = npz_bytes(compressed, a=np.arange(40), b=np.eye(3))
        assert b"PK\x06\x06" in data and b"PK\x06\x07" in data
        assert_same_dict(load_npz(data), numpy_npz(data))


# --- load_npz: refusals ------------------------------------------------------


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_refuses_object_arrays(compressed: bool) -> None:
    out = io.BytesIO()
    arrays = {"a": np.arange(3), "b": np.array([1, "x"], dtype=object)}
    (np.savez_compressed if compressed else np.savez)(out, allow_pickle=True, **arrays)
    with pytest.raises(DecodeError, match="object arrays"):
        load_npz(out.getvalue())


def test_npz_refuses_pickles_and_npy() -> None:
    for data in [pickle.dumps({"a": np.arange(3)}), npy_bytes(np.arange(3)), b"", b"PK"]:
        with pytest.raises(DecodeError, match="^NPZ: "):
            load_npz(data)


def test_npz_refuses_other_compression_methods() -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_BZIP2) as archive:
        archive.writestr("a.npy", npy_bytes(np.arange(5)))
    with pytest.raises(DecodeError, match="bzip2"):
        load_npz(out.getvalue())


def test_npz_checks_crcs() -> None:
    data = bytearray(npz_bytes(False, a=np.arange(5, dtype="<i8")))
    at = data.index(np.arange(5, dtype="<i8").tobytes())
    data[at] ^= 1
    with pytest.raises(DecodeError, match="CRC"):
        load_npz(data)
    assert load_npz(data, check_crc=False)["a"][0] == 1


def bomb(size: int, members: int = 1) -> bytes:
    """An archive of deflated zeros, `size` bytes per member: the cap trips
    before any member is parsed, so the zeros need not be an NPY file."""
    out = io.BytesIO()
    chunk = bytes(1 << 20)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for i in range(members):
            with archive.open(f"m{i}.npy", "w", force_zip64=True) as member:
                for _ in range(size >> 20):
                    member.write(chunk)
    return out.getvalue()


def test_npz_caps_the_inflated_bytes() -> None:
    data = bomb(64 << 20, members=2)  # 128 MiB of zeros in about 128 KiB
    assert len(data) < 1 << 20
    with pytest.raises(DecodeError, match=r"exceed the limit of 100000000 \(max_bytes\)"):
        load_npz(data, max_bytes=100_000_000)
    with pytest.raises(DecodeError, match="max_bytes"):
        load_npz(data, max_bytes=0)
    assert DEFAULT_MAX_BYTES == 2**32
    # Stored members are not inflated: the cap leaves them alone.
    stored = npz_bytes(False, a=np.zeros(1000))
    assert load_npz(stored, max_bytes=0)["a"].shape == (1000,)


def test_npz_refuses_declared_sizes_deflate_cannot_reach() -> None:
    data = bytearray(npz_bytes(True, a=np.zeros(100)))
    directory = data.rindex(b"PK\x01\x02")
    data[directory + 24 : directory + 28] = struct.pack("<I", 0xFFFF_FFF0)
    with pytest.raises(DecodeError, match="more than deflate can produce"):
        load_npz(data)


def test_npz_max_bytes_is_checked() -> None:
    data = npz_bytes(True, a=np.zeros(3))
    with pytest.raises(ValueError, match="max_bytes"):
        load_npz(data, max_bytes=-1)
    with pytest.raises(TypeError, match="max_bytes"):
        load_npz(data, max_bytes=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
def test_npz_every_truncation_is_a_decode_error(compressed: bool) -> None:
    data = npz_bytes(compressed, a=np.arange(6, dtype="<i2"), b=np.ones(3))
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            load_npz(data[:cut])


def check_npz_against_numpy(data: bytes) -> None:
    """minato refuses with DecodeError, or gives numpy's arrays."""
    try:
        loaded = load_npz(data)
    except DecodeError:
        return
    try:
        expected = numpy_npz(data)
    except Exception as err:  # zipfile's and numpy's failures vary
        pytest.fail(f"minato loaded what numpy refuses ({err!r}): {data!r}")
    assert_same_dict(loaded, expected)


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
def test_npz_every_flipped_byte_agrees_with_numpy(compressed: bool) -> None:
    data = npz_bytes(compressed, a=np.arange(6, dtype="<i2"), b=np.ones(3))
    for at in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            flipped = bytearray(data)
            flipped[at] ^= mask
            check_npz_against_numpy(bytes(flipped))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_npz_random_corruption_never_crashes(data: st.DataObject) -> None:
    archive = bytearray(npz_bytes(data.draw(st.booleans()), a=np.arange(20), b=np.eye(2)))
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(archive) - 1))
        archive[at] = data.draw(st.integers(0, 255))
    check_npz_against_numpy(bytes(archive))


def test_npz_hostile_central_directory_offsets() -> None:
    base = bytearray(npz_bytes(False, a=np.arange(3)))
    end = base.rindex(b"PK\x05\x06")
    for field, value in [(12, 0xFFFF_FFFF), (16, 0xFFFF_FFFF), (10, 0xFFFF), (20, 0xFFFF)]:
        data = bytearray(base)
        width = 4 if field in (12, 16) else 2
        data[end + field : end + field + width] = value.to_bytes(width, "little")
        check_npz_against_numpy(bytes(data))
    directory = base.rindex(b"PK\x01\x02")
    for value in (0xFFFF_FFFF, 0x7FFF_FFFF, 1):
        data = bytearray(base)
        data[directory + 42 : directory + 46] = struct.pack("<I", value)
        check_npz_against_numpy(bytes(data))


def test_public_module_exports_these_functions() -> None:
    minato_io = pytest.importorskip("minato.io")
    assert minato_io.load_npy is load_npy
    assert minato_io.load_npz is load_npz
    assert minato_io.DecodeError is DecodeError
