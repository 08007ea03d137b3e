"""NPY and NPZ loading for minato.io: numpy.load's results, without copies.

Rust parses and inflates with the GIL released (rust/io/npy.rs, npz.rs);
the arrays are then numpy.frombuffer views over the caller's own buffer, or
over a buffer Rust filled and handed over.
"""

from __future__ import annotations

import math
import mmap
import os
from typing import Any

import numpy as np

from minato import _minato

__all__ = ["DEFAULT_MAX_BYTES", "load_npy", "load_npz"]

#: load_npz's default cap on the bytes that inflating members may allocate: 4 GiB.
DEFAULT_MAX_BYTES = 2**32

# Or any other C-contiguous buffer of bytes.
_Data = bytes | bytearray | memoryview | mmap.mmap | np.ndarray | str | os.PathLike[str]


def _array(buffer: Any, offset: int, header: tuple[str, tuple[int, ...], bool]) -> np.ndarray:
    descr, shape, fortran_order = header
    array = np.frombuffer(buffer, dtype=np.dtype(descr), count=math.prod(shape), offset=offset)
    return array.reshape(shape, order="F" if fortran_order else "C")


def load_npy(data: _Data) -> np.ndarray:
    """Loads an NPY file, as ``numpy.load`` would, without copying its data.

    ``data`` is the file's contents (``bytes``, ``bytearray``, ``memoryview``,
    ``mmap.mmap`` or any C-contiguous buffer of bytes) or a path
    (``str`` or ``os.PathLike``), which is read with the GIL released.

    For a buffer, the result is a view of it: read-only over ``bytes``,
    writable over a ``bytearray`` or a writable ``mmap``, and valid as long as
    the buffer's contents do not change. For a path, the array owns the bytes
    read.

    Reads every numeric dtype (bool, int8-int64, uint8-uint64, float16/32/64,
    complex64/128) in either byte order, C or Fortran order, with NPY format
    version 1.0, 2.0 or 3.0 headers; bytes after the array are ignored, as
    numpy ignores them.

    Raises:
        minato.io.DecodeError: (a ``ValueError``) for truncated or corrupt
            data, an unsupported dtype, or an object array: those hold pickles,
            which minato never loads.
        OSError: when a path cannot be read.
    """
    buffer, offset, header = _minato._load_npy(data)
    return _array(data if buffer is None else buffer, offset, header)


def load_npz(
    data: _Data, *, max_bytes: int = DEFAULT_MAX_BYTES, check_crc: bool = True
) -> dict[str, Any]:
    """Loads an NPZ archive, as ``dict(numpy.load(data))`` would.

    ``data`` is the archive's contents (``bytes``, ``bytearray``,
    ``memoryview``, ``mmap.mmap`` or any C-contiguous buffer of bytes) or a path
    (``str`` or ``os.PathLike``), which is read with the GIL released.

    Reads archives from ``numpy.savez`` and ``numpy.savez_compressed``: the
    keys are the member names without ``.npy``, in the archive's order.
    Members stored without compression are views of ``data`` (read-only over
    ``bytes``); deflated members are inflated with the GIL released into
    arrays that own their memory. A member that is not an NPY file comes back
    as ``bytes``, as numpy gives it.

    Args:
        max_bytes: the most bytes that inflating members may allocate, in
            total; an archive asking for more raises DecodeError before
            anything that large is allocated. Raise it for trusted archives
            with more than 4 GiB of compressed arrays.
        check_crc: check each member's CRC-32, as ``zipfile`` does. Turning it
            off saves a pass over the data (stored members of a memory-mapped
            archive are then not read at all until used).

    Raises:
        minato.io.DecodeError: (a ``ValueError``) for a truncated, corrupt or
            unsupported archive or member, an object array (a pickle, never
            loaded), or more than ``max_bytes`` to inflate.
        OSError: when a path cannot be read.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"max_bytes must be an int, not {type(max_bytes).__name__}")
    if not 0 <= max_bytes < 2**64:
        raise ValueError(f"max_bytes must be between 0 and 2**64 - 1, got {max_bytes}")
    read, members = _minato._load_npz(data, max_bytes, bool(check_crc))
    archive: Any = data if read is None else read
    result: dict[str, Any] = {}
    for key, buffer, offset, length, header in members:
        source = archive if buffer is None else buffer
        if header is None:
            result[key] = np.frombuffer(source, np.uint8, count=length, offset=offset).tobytes()
        else:
            result[key] = _array(source, offset, header)
    return result
