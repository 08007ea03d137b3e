"""minato.io's image decoders against PIL: pixels, resize, modes, inputs, batches, bad data."""

from __future__ import annotations

import io
import mmap
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from minato.io import DecodeError, decode_image, decode_images

# Resizing matches PIL's antialiased bilinear filter to within rounding:
# documented in minato/_io/image.py and the README.
RESIZE_MEAN_ABS_ERROR = 0.5
RESIZE_MAX_ABS_ERROR = 2


def photo(height: int, width: int, seed: int = 0) -> Image.Image:
    """A smooth picture with some texture: what JPEG is made for."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.stack(
        [
            128 + 100 * np.sin(x / 23 + seed),
            128 + 100 * np.cos(y / 17),
            128 + 60 * np.sin((x + y) / 31),
        ],
        axis=-1,
    )
    pixels += rng.normal(0, 6, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def pil_decode(data: bytes, mode: str = "RGB") -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert(mode))


def assert_close(ours: np.ndarray, theirs: np.ndarray, tolerance: int = 2) -> None:
    """Every value within ``tolerance`` of PIL's, but for one in a thousand a unit more.

    libjpeg-turbo (PIL) and zune-jpeg round chroma upsampling differently:
    on subsampled JPEGs (4:2:0, PIL's default) a few values in ten thousand
    differ by 3. Exact formats (PNG, lossless WebP) match exactly.
    """
    if theirs.ndim == 2:
        theirs = theirs[..., None]
    assert ours.shape == theirs.shape
    assert ours.dtype == np.uint8
    diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    report = f"max diff {diff.max()}, mean {diff.mean():.3f}, {(diff > tolerance).sum()} over"
    assert diff.max() <= tolerance + 1, report
    assert (diff > tolerance).mean() <= 0.001, report


CASES = {
    "jpeg 4:2:0": lambda: encode(photo(61, 83), "JPEG", quality=90),
    "jpeg 4:4:4": lambda: encode(photo(64, 48), "JPEG", quality=95, subsampling=0),
    "jpeg progressive": lambda: encode(photo(50, 70), "JPEG", quality=85, progressive=True),
    "jpeg gray": lambda: encode(photo(40, 30).convert("L"), "JPEG", quality=90),
    "jpeg cmyk": lambda: encode(photo(33, 47).convert("CMYK"), "JPEG", quality=95),
    "png rgb": lambda: encode(photo(37, 29), "PNG"),
    "png rgba": lambda: encode(photo(20, 30).convert("RGBA"), "PNG"),
    "png gray": lambda: encode(photo(20, 30).convert("L"), "PNG"),
    "png palette": lambda: encode(photo(20, 30).convert("P"), "PNG"),
    "webp lossless": lambda: encode(photo(30, 40), "WEBP", lossless=True),
    "webp lossy": lambda: encode(photo(30, 40), "WEBP", quality=90),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_pixels_match_pil(case: str, mode: str) -> None:
    data = CASES[case]()
    ours = decode_image(data, mode=mode)
    theirs = pil_decode(data, mode)
    if case.startswith(("png", "webp")):
        np.testing.assert_array_equal(ours, theirs.reshape(ours.shape))
    else:
        assert_close(ours, theirs)


@pytest.mark.parametrize("case", ["jpeg 4:2:0", "png rgb", "png gray", "webp lossless"])
@pytest.mark.parametrize("size", [(24, 24), (30, 17), (8, 40), (100, 120)])
def test_resize_matches_pil_bilinear_antialias(case: str, size: tuple[int, int]) -> None:
    data = CASES[case]()
    ours = decode_image(data, size=size)
    height, width = size
    theirs = np.asarray(
        Image.open(io.BytesIO(data)).convert("RGB").resize((width, height), Image.BILINEAR)
    )
    assert ours.shape == (height, width, 3)
    diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    # JPEG decoders themselves differ by up to 2 before the resize.
    mean_bound = RESIZE_MEAN_ABS_ERROR + (1.0 if case.startswith("jpeg") else 0.0)
    assert diff.mean() <= mean_bound, f"mean diff {diff.mean():.3f}"
    assert diff.max() <= RESIZE_MAX_ABS_ERROR + (2 if case.startswith("jpeg") else 0)


def test_resize_matches_torchvision_resize() -> None:
    transforms = pytest.importorskip("torchvision.transforms")
    data = encode(photo(300, 400), "PNG")
    ours = decode_image(data, size=(224, 224))
    theirs = np.asarray(
        transforms.Resize((224, 224), antialias=True)(Image.open(io.BytesIO(data)).convert("RGB"))
    )
    diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    assert diff.mean() <= RESIZE_MEAN_ABS_ERROR and diff.max() <= RESIZE_MAX_ABS_ERROR


def test_an_int_size_is_square_and_the_own_size_is_a_copy() -> None:
    data = CASES["png rgb"]()
    assert decode_image(data, size=16).shape == (16, 16, 3)
    np.testing.assert_array_equal(decode_image(data, size=(37, 29)), decode_image(data))


def test_every_input_kind_gives_the_same_pixels(tmp_path: Path) -> None:
    data = CASES["jpeg 4:2:0"]()
    path = tmp_path / "image.jpg"
    path.write_bytes(data)
    expected = decode_image(data)
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        via_mmap = decode_image(mapped)
    for source in (
        bytearray(data),
        memoryview(data),
        np.frombuffer(data, np.uint8),
        str(path),
        path,
    ):
        np.testing.assert_array_equal(decode_image(source), expected)
    np.testing.assert_array_equal(via_mmap, expected)


def test_the_array_owns_its_buffer_and_torch_shares_it() -> None:
    array = decode_image(CASES["png rgb"]())
    assert array.flags.writeable and array.flags.c_contiguous
    tensor = torch.from_numpy(array)
    tensor[0, 0, 0] = 7
    assert array[0, 0, 0] == 7


def test_decode_images_fills_a_batch_equal_to_single_decodes() -> None:
    sources = [CASES[name]() for name in ("jpeg 4:2:0", "png rgba", "webp lossless", "jpeg gray")]
    batch = decode_images(sources, size=(32, 24))
    assert batch.shape == (4, 32, 24, 3) and batch.dtype == np.uint8
    for image, data in zip(batch, sources, strict=True):
        np.testing.assert_array_equal(image, decode_image(data, size=(32, 24)))


def test_decode_images_writes_into_a_given_tensor_or_array() -> None:
    sources = [CASES["jpeg 4:4:4"](), CASES["png gray"]()]
    tensor = torch.full((2, 16, 16, 1), 3, dtype=torch.uint8)
    assert decode_images(sources, size=16, mode="L", out=tensor) is tensor
    array = np.zeros((2, 16, 16, 1), np.uint8)
    assert decode_images(sources, size=16, mode="L", out=array) is array
    np.testing.assert_array_equal(tensor.numpy(), array)
    np.testing.assert_array_equal(array[1], decode_image(sources[1], size=16, mode="L"))


@pytest.mark.parametrize(
    "out",
    [
        np.zeros((2, 16, 16, 3), np.float32),
        np.zeros((3, 16, 16, 3), np.uint8),
        np.zeros((2, 16, 16, 3), np.uint8)[:, ::-1],
        torch.zeros((2, 16, 16, 3), dtype=torch.int16),
    ],
)
def test_decode_images_refuses_an_unfit_out(out: object) -> None:
    with pytest.raises(ValueError, match="out must"):
        decode_images([CASES["png rgb"]()] * 2, size=16, out=out)  # type: ignore[arg-type]


def test_a_bad_image_in_a_batch_is_named_by_index() -> None:
    good = CASES["png rgb"]()
    with pytest.raises(DecodeError, match="image 2 of the batch: unknown format"):
        decode_images([good, good, b"not an image", good], size=8)


def test_a_missing_file_raises_what_open_would(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing.jpg"):
        decode_image(tmp_path / "nothing.jpg")
    with pytest.raises(FileNotFoundError):
        decode_images([CASES["png rgb"](), str(tmp_path / "nothing.jpg")], size=8)


def test_bad_arguments_raise_value_error() -> None:
    data = CASES["png rgb"]()
    with pytest.raises(ValueError, match="mode must be"):
        decode_image(data, mode="CMYK")
    with pytest.raises(ValueError, match="size must be positive"):
        decode_image(data, size=(0, 4))
    with pytest.raises(TypeError):
        decode_image(12345)  # type: ignore[arg-type]


def test_decode_error_is_a_value_error_naming_format_and_reason() -> None:
    assert issubclass(DecodeError, ValueError)
    assert DecodeError.__module__ == "minato.io"
    with pytest.raises(DecodeError, match="unknown format"):
        decode_image(b"GIF89a" + bytes(100))


def test_the_pixel_cap_refuses_before_decoding() -> None:
    data = encode(photo(100, 100), "PNG")
    with pytest.raises(DecodeError, match="PNG: 10000 pixels exceed the limit of 9999"):
        decode_image(data, max_pixels=9999)
    assert decode_image(data, max_pixels=10000).shape == (100, 100, 3)
    jpeg = CASES["jpeg 4:2:0"]()
    with pytest.raises(DecodeError, match="JPEG: .* max_pixels"):
        decode_image(jpeg, max_pixels=100)


def test_a_header_claiming_a_huge_image_is_refused_not_allocated() -> None:
    # A PNG header claiming 60000 x 60000 pixels, with no data behind it.
    data = bytearray(encode(photo(4, 4), "PNG"))
    data[16:24] = (60000).to_bytes(4, "big") * 2
    with pytest.raises(DecodeError, match="PNG"):
        decode_image(bytes(data))


@pytest.mark.parametrize("case", ["jpeg 4:2:0", "jpeg progressive", "png rgb", "webp lossless"])
def test_truncated_data_raises_decode_error_at_every_cut(case: str) -> None:
    data = CASES[case]()
    fmt = case.split()[0].upper().replace("WEBP", "WebP")
    for cut in range(0, len(data) - 2, max(1, len(data) // 150)):
        with pytest.raises(DecodeError, match=f"^({fmt}|unknown format)"):
            decode_image(data[:cut])


@settings(max_examples=150, deadline=None)
@given(
    case=st.sampled_from(sorted(CASES)),
    flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_corrupted_bytes_decode_or_raise_never_crash(
    case: str, flips: list[tuple[float, int]]
) -> None:
    data = bytearray(CASES[case]())
    for where, value in flips:
        data[min(int(where * len(data)), len(data) - 1)] = value
    try:
        image = decode_image(bytes(data), size=(16, 16))
    except DecodeError:
        return
    assert image.shape == (16, 16, 3)


def test_the_gil_is_released_while_reading_and_decoding(tmp_path: Path) -> None:
    # decode_image reads a FIFO that only this (Python) thread writes to. If
    # the decoder held the GIL while reading, the writer could never run and
    # the test would hang until its timeout.
    fifo = tmp_path / "image.fifo"
    os.mkfifo(fifo)
    data = CASES["jpeg 4:2:0"]()
    result: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: result.append(decode_image(fifo)))
    reader.start()
    with open(fifo, "wb") as pipe:
        pipe.write(data)
    reader.join(timeout=30)
    assert not reader.is_alive()
    np.testing.assert_array_equal(result[0], decode_image(data))


def test_a_batch_reads_its_files_in_parallel(tmp_path: Path) -> None:
    # Two FIFOs, written in the opposite order to the batch's: the batch can
    # only finish if its reads run concurrently, with the GIL released.
    data = [CASES["png rgb"](), CASES["jpeg gray"]()]
    fifos = [tmp_path / f"{i}.fifo" for i in range(2)]
    for fifo in fifos:
        os.mkfifo(fifo)
    result: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: result.append(decode_images(fifos, size=12)))
    reader.start()
    for fifo, payload in reversed(list(zip(fifos, data, strict=True))):
        with open(fifo, "wb") as pipe:
            pipe.write(payload)
    reader.join(timeout=30)
    assert not reader.is_alive()
    np.testing.assert_array_equal(result[0], decode_images(data, size=12))
