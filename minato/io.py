"""minato.io: image, array and video loading in Rust, with the GIL released.

Threads only scale when the work releases the GIL. Every function here
extracts its arguments, then decodes or parses in Rust without the GIL, and
hands the result to numpy without a copy (``torch.from_numpy`` shares it):

- :func:`decode_image` / :func:`decode_images`: JPEG, PNG, WebP, optionally
  resized, one image or a batch decoded in parallel into one buffer;
- :func:`load_npy` / :func:`load_npz`: views over the input, no copy for
  uncompressed data; pickled objects are refused;
- :func:`decode_video`: frames through FFmpeg (when built with it).

Bad input raises :class:`DecodeError` (a ``ValueError``) naming the format and
the reason; it never crashes the process.
"""

from minato._io.array import load_npy, load_npz
from minato._io.image import DEFAULT_MAX_PIXELS, decode_image, decode_images
from minato._io.video import decode_video
from minato._minato import DecodeError

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "DecodeError",
    "decode_image",
    "decode_images",
    "decode_video",
    "load_npy",
    "load_npz",
]
