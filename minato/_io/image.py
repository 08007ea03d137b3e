"""Image decoding for minato.io: JPEG, PNG and WebP decoded in Rust with the GIL released."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from minato import _minato

if TYPE_CHECKING:
    import torch

#: bytes, any C-contiguous buffer of bytes (bytearray, memoryview, mmap, numpy), or a path.
ImageSource = bytes | bytearray | memoryview | str | os.PathLike | Any

_MODES = {"RGB": 3, "L": 1, "RGBA": 4}

#: Default cap on decoded pixels, PIL's decompression-bomb limit.
DEFAULT_MAX_PIXELS: int = _minato.DEFAULT_MAX_PIXELS


def _size(size: int | Sequence[int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, int):
        return (size, size)
    height, width = size
    return (int(height), int(width))


def decode_image(
    data: ImageSource,
    *,
    size: int | Sequence[int] | None = None,
    mode: str = "RGB",
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Decodes one JPEG, PNG or WebP image to a ``(height, width, channels)`` uint8 array.

    ``data`` is the encoded bytes, any C-contiguous buffer of them, or a path
    (read in Rust). The format is recognised from the data's signature.
    ``mode`` is ``"RGB"`` (3 channels; gray and CMYK inputs are converted as
    PIL's ``Image.convert("RGB")`` does), ``"L"`` (1 channel, PIL's luma
    weights) or ``"RGBA"``. ``size=(h, w)`` (or one int for a square) resizes
    with antialiased bilinear filtering, as PIL's and torchvision's
    ``Resize`` do, in the same pass. Images of more than ``max_pixels`` pixels
    are refused before decoding.

    The array owns the decoded buffer: ``torch.from_numpy`` shares it without
    a copy. The GIL is released for the whole decode. Undecodable data raises
    :class:`minato.io.DecodeError` naming the format and the reason.
    """
    return _minato._decode_image(data, size=_size(size), mode=mode, max_pixels=max_pixels)


def decode_images(
    sources: Sequence[ImageSource],
    *,
    size: int | Sequence[int],
    mode: str = "RGB",
    out: np.ndarray | torch.Tensor | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Any:
    """Decodes images in parallel into one ``(B, height, width, channels)`` uint8 batch.

    Each image is decoded and resized (``size`` is required: a batch has one
    shape) directly into its slot of the batch, on Rust threads with the GIL
    released: one copy from decoder to batch, no per-image array. ``out`` is
    where to write, e.g. a pinned ``torch.empty(..., dtype=torch.uint8,
    pin_memory=True)``: a C-contiguous uint8 numpy array or CPU tensor of
    shape ``(B, h, w, c)``. Returns ``out``, or a new numpy array.

    If an image fails, :class:`minato.io.DecodeError` names its index; the
    other slots of ``out`` are then unspecified.
    """
    height, width = _size(size)  # type: ignore[misc]
    if mode not in _MODES:
        raise ValueError(f"mode must be 'RGB', 'L' or 'RGBA', not {mode!r}")
    shape = (len(sources), height, width, _MODES[mode])
    target: Any = out
    if out is None:
        target = out = np.empty(shape, dtype=np.uint8)
    elif not isinstance(out, np.ndarray):
        # A torch tensor: its numpy view shares the memory (pinned or not).
        if out.device.type != "cpu":
            raise ValueError(f"out must be in CPU memory, not on {out.device}")
        target = out.numpy()
    if target.dtype != np.uint8 or tuple(target.shape) != shape:
        raise ValueError(
            f"out must be a uint8 array of shape {shape}, not {target.dtype} {tuple(target.shape)}"
        )
    if not target.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    _minato._decode_images_into(
        list(sources), target, size=(height, width), mode=mode, max_pixels=max_pixels
    )
    return out
