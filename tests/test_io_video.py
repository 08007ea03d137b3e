"""minato.io.decode_video: frame selection, sizes, inputs, and bad data.

The test videos are made here: YUV4MPEG2 (raw frames, written in Python)
for exact values, and, where the ffmpeg command-line tool is installed,
the same frames encoded with real codecs (H.264 with B-frames, MJPEG,
FFV1, VP9). Frame i is a solid gray of a level that encodes i.
"""

from __future__ import annotations

import io
import pathlib
import random
import shutil
import subprocess
import threading
import wave

import numpy as np
import pytest

from minato import _minato
from minato._io.video import DEFAULT_MAX_VIDEO_PIXELS, decode_video

DecodeError = _minato.DecodeError

needs_video = pytest.mark.skipif(
    not _minato._HAS_VIDEO, reason="minato was built without the `video` feature"
)
needs_ffmpeg = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="no ffmpeg command")

WIDTH, HEIGHT = 32, 24
FRAMES = 30


def luma(index: int) -> int:
    """Frame `index`'s luma (limited range, 16..235)."""
    return 16 + 7 * index


def rgb_level(index: int) -> int:
    """What frame `index` decodes to: limited-range luma expanded to 0..255."""
    return min(255, max(0, round((luma(index) - 16) * 255 / 219)))


def y4m(frames: int = FRAMES, width: int = WIDTH, height: int = HEIGHT) -> bytes:
    """A raw 4:4:4 YUV4MPEG2 video whose frame i is a solid gray luma(i)."""
    out = io.BytesIO()
    out.write(f"YUV4MPEG2 W{width} H{height} F25:1 Ip A1:1 C444\n".encode())
    for index in range(frames):
        out.write(b"FRAME\n")
        out.write(bytes([luma(index)]) * (width * height))
        out.write(bytes([128]) * (2 * width * height))
    return out.getvalue()


def levels(video: np.ndarray) -> list[int]:
    """Each frame's mean value, rounded."""
    return [round(float(frame.mean())) for frame in video]


def assert_levels(video: np.ndarray, indices: list[int], tolerance: int) -> None:
    expected = [rgb_level(i) for i in indices]
    assert len(video) == len(expected)
    for frame, level, index in zip(video, expected, indices, strict=True):
        difference = np.abs(frame.astype(np.int16) - level).max()
        assert difference <= tolerance, f"frame {index}: {levels(frame[None])} != {level}"


# --- the feature switch ------------------------------------------------------


@pytest.mark.skipif(_minato._HAS_VIDEO, reason="this build has video")
def test_without_the_feature_decode_video_says_how_to_enable_it() -> None:
    with pytest.raises(DecodeError, match="--features python,video"):
        decode_video(b"whatever", num_frames=1)


def test_public_name() -> None:
    minato_io = pytest.importorskip("minato.io")
    if not hasattr(minato_io, "decode_video"):
        pytest.skip("minato.io does not export decode_video yet")
    assert minato_io.decode_video is decode_video


# --- frame selection -----------------------------------------------------------


@needs_video
@pytest.mark.parametrize(
    ("start", "stride", "num_frames"),
    [(0, 1, FRAMES), (0, 1, 1), (5, 1, 3), (2, 4, 7), (29, 1, 1), (0, 29, 2), (3, 13, 2)],
)
def test_start_stride_and_num_frames_pick_the_frames(
    start: int, stride: int, num_frames: int
) -> None:
    video = decode_video(y4m(), start=start, stride=stride, num_frames=num_frames)
    assert video.shape == (num_frames, HEIGHT, WIDTH, 3)
    assert video.dtype == np.uint8
    assert video.flags.c_contiguous and video.flags.writeable
    assert_levels(video, [start + i * stride for i in range(num_frames)], tolerance=1)


@needs_video
@pytest.mark.parametrize(
    ("start", "stride", "num_frames", "last"),
    [(0, 1, FRAMES + 1, 30), (30, 1, 1, 30), (25, 3, 3, 31)],
)
def test_too_few_frames_raises_naming_the_frame_count(
    start: int, stride: int, num_frames: int, last: int
) -> None:
    message = f"the video has {FRAMES} frames, but frame {last} "
    with pytest.raises(DecodeError, match=message):
        decode_video(y4m(), start=start, stride=stride, num_frames=num_frames)


@needs_video
def test_the_last_frame_can_be_asked_for() -> None:
    video = decode_video(y4m(), start=1, stride=4, num_frames=8)  # frames 1..29
    assert_levels(video, list(range(1, 30, 4)), tolerance=1)


# --- inputs ----------------------------------------------------------------------


@needs_video
def test_bytes_buffers_and_paths_give_the_same_frames(tmp_path: pathlib.Path) -> None:
    data = y4m()
    path = tmp_path / "clip.y4m"
    path.write_bytes(data)
    options = {"start": 3, "stride": 5, "num_frames": 4, "size": (12, 20)}
    expected = decode_video(data, **options)
    for source in [
        bytearray(data),
        memoryview(data),
        memoryview(bytearray(data)),
        np.frombuffer(data, dtype=np.uint8),
        str(path),
        path,
    ]:
        np.testing.assert_array_equal(decode_video(source, **options), expected)


@needs_video
def test_a_path_is_read_as_a_file_not_a_url(tmp_path: pathlib.Path) -> None:
    # "name:rest" would be a protocol to FFmpeg if minato passed it as is.
    path = tmp_path / "weird:name.y4m"
    path.write_bytes(y4m(3))
    assert decode_video(path, num_frames=3).shape == (3, HEIGHT, WIDTH, 3)


@needs_video
def test_missing_path_raises_what_open_raises(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError):
        decode_video(tmp_path / "missing.mp4", num_frames=1)
    with pytest.raises(IsADirectoryError):
        decode_video(tmp_path, num_frames=1)
    # Not a regular file: a device or FIFO could block or never end.
    with pytest.raises(OSError, match="regular files only"):
        decode_video("/dev/zero", num_frames=1)


@needs_video
def test_non_contiguous_buffers_are_refused() -> None:
    data = np.frombuffer(y4m(), dtype=np.uint8)[::2]
    with pytest.raises(TypeError):
        decode_video(data, num_frames=1)


# --- size ------------------------------------------------------------------------


@needs_video
@pytest.mark.parametrize("size", [(12, 16), (5, 7), (48, 64), (24, 64), (1, 1)])
def test_size_resizes_every_frame(size: tuple[int, int]) -> None:
    video = decode_video(y4m(), start=4, stride=6, num_frames=4, size=size)
    assert video.shape == (4, *size, 3)
    assert_levels(video, [4, 10, 16, 22], tolerance=1)


@needs_video
def test_shrinking_averages_areas() -> None:
    # One frame of vertical stripes, 1 pixel wide, black and white: halving the
    # width with area averaging gives an even gray, not every other stripe.
    width, height = 16, 8
    header = f"YUV4MPEG2 W{width} H{height} F25:1 Ip A1:1 C444\n".encode()
    row = bytes([16, 235] * (width // 2))
    frame = b"FRAME\n" + row * height + bytes([128]) * (2 * width * height)
    video = decode_video(header + frame, num_frames=1, size=(height, width // 2))
    assert np.abs(video.astype(int) - 128).max() <= 2


# --- limits and bad data -----------------------------------------------------------


@needs_video
def test_max_pixels_caps_the_output_before_decoding() -> None:
    pixels = 5 * HEIGHT * WIDTH
    with pytest.raises(DecodeError, match=rf"{pixels} pixels exceed the limit of {pixels - 1}"):
        decode_video(y4m(), num_frames=5, max_pixels=pixels - 1)
    assert decode_video(y4m(), num_frames=5, max_pixels=pixels).shape[0] == 5
    # Resized, the output is small, but each decoded frame counts too.
    frame = HEIGHT * WIDTH
    assert decode_video(y4m(), num_frames=5, size=(2, 2), max_pixels=frame).shape == (5, 2, 2, 3)
    with pytest.raises(DecodeError, match=f"{frame} pixels exceed the limit of {frame - 1}"):
        decode_video(y4m(), num_frames=5, size=(2, 2), max_pixels=frame - 1)
    assert DEFAULT_MAX_VIDEO_PIXELS == 1 << 30


@needs_video
def test_a_forged_frame_size_is_refused_before_allocating() -> None:
    header = b"YUV4MPEG2 W60000 H60000 F25:1 Ip A1:1 C444\nFRAME\n"
    with pytest.raises(DecodeError):
        decode_video(header + bytes(1000), num_frames=1)


@needs_video
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "no container"),
        (b"definitely not a video, just some text\n" * 20, "no container"),
        (bytes(range(256)) * 8, ""),
    ],
)
def test_data_that_is_not_a_video_raises(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=f"^video: .*{reason}"):
        decode_video(data, num_frames=1)


@needs_video
def test_audio_without_video_raises_naming_the_streams() -> None:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(8000)
        wav.writeframes(bytes(1600))
    with pytest.raises(
        DecodeError, match=r"video: unsupported: wav: no video stream \(streams: audio\)"
    ):
        decode_video(out.getvalue(), num_frames=1)


@needs_video
def test_truncated_data_raises_once_the_wanted_frames_run_past_it() -> None:
    data = y4m(10)
    frame_bytes = len(b"FRAME\n") + 3 * WIDTH * HEIGHT
    cut = data[: len(data) - 5 * frame_bytes - 100]  # frames 0..3 whole, frame 4 cut
    assert_levels(decode_video(cut, num_frames=4), [0, 1, 2, 3], tolerance=1)
    with pytest.raises(DecodeError, match="^video: "):
        decode_video(cut, num_frames=5)
    with pytest.raises(DecodeError, match="^video: "):
        decode_video(data[:30], num_frames=1)  # inside the header


# --- real codecs, through the ffmpeg command -------------------------------------------

CODECS = {
    # H.264 with B-frames: the decoder outputs frames out of decoding order.
    "h264.mp4": (["-c:v", "libx264", "-bf", "3", "-pix_fmt", "yuv420p"], 3),
    "h264-faststart.mp4": (["-c:v", "libx264", "-movflags", "+faststart"], 3),
    "mjpeg.avi": (["-c:v", "mjpeg", "-q:v", "2"], 3),
    "ffv1.mkv": (["-c:v", "ffv1"], 1),
    "vp9.webm": (["-c:v", "libvpx-vp9", "-lossless", "1"], 2),
}


@pytest.fixture(scope="module")
def encoded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    """The test video in each of CODECS that this ffmpeg can encode."""
    if shutil.which("ffmpeg") is None or not _minato._HAS_VIDEO:
        return {}
    folder = tmp_path_factory.mktemp("videos")
    source = folder / "source.y4m"
    source.write_bytes(y4m())
    videos = {}
    for name, (arguments, _) in CODECS.items():
        target = folder / name
        command = ["ffmpeg", "-v", "error", "-nostdin", "-y", "-i", str(source), *arguments]
        done = subprocess.run([*command, str(target)], capture_output=True, timeout=60)
        if done.returncode == 0:
            videos[name] = target
    return videos


def encoded_video(encoded: dict[str, pathlib.Path], name: str) -> pathlib.Path:
    if name not in encoded:
        pytest.skip(f"this ffmpeg cannot write {name}")
    return encoded[name]


@needs_video
@needs_ffmpeg
@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize(("start", "stride", "num_frames"), [(0, 1, FRAMES), (3, 4, 7), (29, 1, 1)])
def test_codecs_give_the_frames_in_presentation_order(
    encoded: dict[str, pathlib.Path], name: str, start: int, stride: int, num_frames: int
) -> None:
    path = encoded_video(encoded, name)
    tolerance = CODECS[name][1]
    video = decode_video(path, start=start, stride=stride, num_frames=num_frames)
    assert video.shape == (num_frames, HEIGHT, WIDTH, 3)
    assert_levels(video, [start + i * stride for i in range(num_frames)], tolerance)
    np.testing.assert_array_equal(
        decode_video(path.read_bytes(), start=start, stride=stride, num_frames=num_frames), video
    )
    with pytest.raises(DecodeError, match=f"the video has {FRAMES} frames"):
        decode_video(path, start=start, stride=stride + FRAMES, num_frames=num_frames + 1)


@needs_video
@needs_ffmpeg
@pytest.mark.parametrize("pixel_format", ["yuv420p", "yuv420p10le"])
def test_colours_match_the_ffmpeg_command(tmp_path: pathlib.Path, pixel_format: str) -> None:
    # A moving colour pattern, BT.709 and full range, 4:2:0 with B-frames;
    # the ffmpeg command converts with the same libswscale and defaults.
    path = tmp_path / f"{pixel_format}.mkv"
    pattern = ["-f", "lavfi", "-i", "testsrc2=size=96x64:rate=25:duration=1"]
    tags = ["-color_range", "pc", "-colorspace", "bt709", "-color_primaries", "bt709"]
    encode = ["-c:v", "libx264", "-bf", "3", "-pix_fmt", pixel_format, *tags]
    done = subprocess.run(
        ["ffmpeg", "-v", "error", "-nostdin", "-y", *pattern, *encode, str(path)],
        capture_output=True,
        timeout=60,
    )
    if done.returncode != 0:
        pytest.skip(f"this ffmpeg cannot encode {pixel_format} H.264")
    reference = subprocess.run(
        ["ffmpeg", "-v", "error", "-nostdin", "-i", str(path)]
        + ["-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    expected = np.frombuffer(reference, dtype=np.uint8).reshape(25, 64, 96, 3)
    video = decode_video(path, start=2, stride=3, num_frames=8)
    difference = np.abs(video.astype(np.int16) - expected[2::3])
    assert difference.mean() < 0.5 and np.percentile(difference, 99) <= 2


@needs_video
@needs_ffmpeg
@pytest.mark.parametrize("name", CODECS)
def test_codecs_resize(encoded: dict[str, pathlib.Path], name: str) -> None:
    path = encoded_video(encoded, name)
    video = decode_video(path, start=2, stride=9, num_frames=3, size=(10, 15))
    assert video.shape == (3, 10, 15, 3)
    assert_levels(video, [2, 11, 20], CODECS[name][1] + 1)


@needs_video
@needs_ffmpeg
@pytest.mark.parametrize("name", CODECS)
def test_truncated_files_raise(encoded: dict[str, pathlib.Path], name: str) -> None:
    data = encoded_video(encoded, name).read_bytes()
    with pytest.raises(DecodeError, match="^video: "):
        decode_video(data[: len(data) // 2], num_frames=FRAMES)


@needs_video
@needs_ffmpeg
@pytest.mark.parametrize("name", CODECS)
def test_corrupt_files_raise_or_decode_never_crash(
    encoded: dict[str, pathlib.Path], name: str
) -> None:
    data = encoded_video(encoded, name).read_bytes()
    generator = random.Random(name)
    for _ in range(40):
        damaged = bytearray(data)
        start = generator.randrange(len(data))
        length = generator.randrange(1, 200)
        damaged[start : start + length] = generator.randbytes(min(length, len(data) - start))
        try:
            video = decode_video(bytes(damaged), num_frames=FRAMES)
        except DecodeError as error:
            assert str(error).startswith("video: ")
        else:
            assert video.shape == (FRAMES, HEIGHT, WIDTH, 3)


# --- threads -----------------------------------------------------------------------------


@needs_video
def test_threads_decode_at_once() -> None:
    data = y4m()
    expected = decode_video(data, start=1, stride=3, num_frames=9)
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                results.append(decode_video(data, start=1, stride=3, num_frames=9))
            with pytest.raises(DecodeError):
                decode_video(data[:100], num_frames=FRAMES)
        except BaseException as error:  # reported below, on the main thread
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(results) == 160
    for result in results:
        np.testing.assert_array_equal(result, expected)


# --- arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"num_frames": 0}, ValueError),
        ({"num_frames": 1, "stride": 0}, ValueError),
        ({"num_frames": 1, "start": -1}, ValueError),
        ({"num_frames": 1.5}, TypeError),
        ({"num_frames": 1, "size": (0, 4)}, ValueError),
        ({"num_frames": 1, "size": 4}, TypeError),
        ({"num_frames": 1, "size": (1, 2, 3)}, TypeError),
        ({"num_frames": 1, "max_pixels": -1}, ValueError),
    ],
)
def test_bad_arguments_raise_before_decoding(arguments: dict, error: type) -> None:
    with pytest.raises(error):
        decode_video(b"", **arguments)


def test_num_frames_is_required() -> None:
    with pytest.raises(TypeError):
        decode_video(b"")  # type: ignore[call-arg]
