"""minato.io.decode_video: frames of a video, through FFmpeg, without the GIL."""

from __future__ import annotations

import operator
import os
from typing import TYPE_CHECKING

from minato import _minato

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["decode_video"]

#: The default ``max_pixels``: 2**30 pixels over all frames (3 GiB of RGB).
DEFAULT_MAX_VIDEO_PIXELS = 1 << 30


def _count(name: str, value: object, minimum: int) -> int:
    try:
        count = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if count < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {count}")
    return count


def decode_video(
    data: bytes | bytearray | memoryview | str | os.PathLike[str],
    *,
    num_frames: int,
    start: int = 0,
    stride: int = 1,
    size: tuple[int, int] | None = None,
    max_pixels: int = DEFAULT_MAX_VIDEO_PIXELS,
) -> NDArray[np.uint8]:
    """Decodes frames of a video to a ``(T, H, W, 3)`` uint8 RGB array.

    Frames ``start, start + stride, start + 2 * stride, ...``, ``num_frames``
    of them, counted from 0 in presentation order (the order the decoder
    outputs them; for ordinary files, the order they are shown). Every frame
    up to the last one wanted is decoded, since the codecs need the earlier
    frames, but only the wanted ones are converted to RGB. The work runs with
    the GIL released, on FFmpeg (the system's libavformat, libavcodec and
    libswscale), one thread per call: call it from several DataLoader
    workers to decode several videos at once.

    Args:
        data: the encoded video: ``bytes``, any C-contiguous buffer of bytes
            (``bytearray``, ``memoryview``, ``mmap``, a uint8 numpy array),
            read through FFmpeg without a copy, or the path of a regular
            local file, which FFmpeg reads as it decodes (never a URL, and
            a playlist in the file cannot reach the network either). Any
            container and codec that this FFmpeg demuxes and decodes.
        num_frames: how many frames to return, at least 1.
        start: the index of the first frame.
        stride: take every ``stride``-th frame, at least 1.
        size: ``(height, width)`` to resize every frame to, with swscale:
            area averaging when shrinking (both sides at most the video's),
            bilinear otherwise. ``None`` keeps the video's size (subsampled
            chroma is then interpolated bicubically, FFmpeg's default, so the
            frames equal ``ffmpeg -i VIDEO -pix_fmt rgb24``'s); if the stream
            changes resolution midway, the later frames are scaled to the
            first frame's size. Rotation metadata is not applied: frames come
            as stored.
        max_pixels: the largest output allowed, in pixels over all frames
            (``T * H * W``), checked before anything that large is allocated,
            so that a forged header cannot exhaust memory. A single decoded
            frame above it is refused too.

    Returns:
        A C-contiguous ``uint8`` array of shape ``(num_frames, H, W, 3)``
        that owns its memory. YUV video is converted with the matrix and
        range the stream declares (BT.601 when it declares none), to
        full-range RGB.

    Raises:
        minato.io.DecodeError: (a ``ValueError``) the data is truncated,
            corrupt, not a container FFmpeg recognises, has no video stream
            or a codec this FFmpeg cannot decode, the output would exceed
            ``max_pixels``, or the video has fewer frames than ``start``,
            ``stride`` and ``num_frames`` ask for (the message then names
            how many it has). An error in any frame decoded fails the call
            rather than shifting the frame indices. Also raised when this
            build of minato was made without FFmpeg (the ``video`` cargo
            feature), with the way to enable it.
        FileNotFoundError, PermissionError, IsADirectoryError, OSError: the
            path cannot be read, or is not a regular file.
        TypeError, ValueError: an argument of the wrong type or range.
    """
    num_frames = _count("num_frames", num_frames, 1)
    start = _count("start", start, 0)
    stride = _count("stride", stride, 1)
    max_pixels = _count("max_pixels", max_pixels, 0)
    if size is not None:
        if not isinstance(size, tuple | list) or len(size) != 2:
            raise TypeError(f"size must be (height, width) or None, not {size!r}")
        size = (_count("size[0] (height)", size[0], 1), _count("size[1] (width)", size[1], 1))
    return _minato._decode_video(
        data,
        num_frames=num_frames,
        start=start,
        stride=stride,
        size=size,
        max_pixels=max_pixels,
    )
