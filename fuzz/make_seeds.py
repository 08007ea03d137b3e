"""Writes seed corpora for the npy and npz fuzz targets: small files from numpy.

Run from the repository root: .venv/bin/python fuzz/make_seeds.py
"""

from __future__ import annotations

import io
import pathlib
import zipfile

import numpy as np

CORPUS = pathlib.Path(__file__).parent / "corpus"


def npy(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, array, version=version, allow_pickle=True)
    return out.getvalue()


def arrays() -> dict[str, np.ndarray]:
    found = {}
    for code in ["?", "i1", "u2", "i4", "u8", "f2", "f4", "f8", "c8", "c16"]:
        for order in "<>":
            dtype = np.dtype(code).newbyteorder(order)
            found[f"{code}{order}"] = np.arange(6).astype(dtype).reshape(2, 3)
    found["scalar"] = np.array(1.5)
    found["empty"] = np.zeros((0, 3), dtype="<i2")
    found["fortran"] = np.asfortranarray(np.arange(12, dtype="<i4").reshape(3, 4))
    found["object"] = np.array([1, None], dtype=object)
    found["structured"] = np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])
    return found


def main() -> None:
    (CORPUS / "npy").mkdir(parents=True, exist_ok=True)
    (CORPUS / "npz").mkdir(parents=True, exist_ok=True)
    for name, array in arrays().items():
        safe = name.replace("<", "le").replace(">", "be").replace("?", "bool")
        for version in [(1, 0), (2, 0), (3, 0)]:
            path = CORPUS / "npy" / f"{safe}-v{version[0]}.npy"
            path.write_bytes(npy(array, version))
    small = {k: v for k, v in arrays().items() if k in ("f8<", "i1>", "scalar", "empty", "fortran")}
    for compressed in (False, True):
        out = io.BytesIO()
        (np.savez_compressed if compressed else np.savez)(out, **small)
        (CORPUS / "npz" / f"savez-{compressed}.npz").write_bytes(out.getvalue())
        out = io.BytesIO()
        (np.savez_compressed if compressed else np.savez)(out, a=np.arange(5))
        (CORPUS / "npz" / f"one-{compressed}.npz").write_bytes(out.getvalue())
    out = io.BytesIO()
    np.savez(out, allow_pickle=True, o=arrays()["object"])
    (CORPUS / "npz" / "object.npz").write_bytes(out.getvalue())
    out = io.BytesIO()
    np.savez(out)
    (CORPUS / "npz" / "empty.npz").write_bytes(out.getvalue())
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("notes.txt", b"not an array")
        archive.writestr("x.npy", npy(np.arange(3)))
        archive.comment = b"a comment"
    (CORPUS / "npz" / "mixed.npz").write_bytes(out.getvalue())
    image_seeds()


def image_seeds() -> None:
    """Small images of every kind decode_image reads: fuzz/corpus/image."""
    from PIL import Image

    (CORPUS / "image").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (12, 17, 3), dtype=np.uint8))
    variants = {
        "baseline.jpg": (rgb, "JPEG", {"quality": 80}),
        "444.jpg": (rgb, "JPEG", {"quality": 90, "subsampling": 0}),
        "progressive.jpg": (rgb, "JPEG", {"progressive": True}),
        "restart.jpg": (rgb, "JPEG", {"restart_marker_blocks": 1}),
        "gray.jpg": (rgb.convert("L"), "JPEG", {}),
        "cmyk.jpg": (rgb.convert("CMYK"), "JPEG", {}),
        "rgb.png": (rgb, "PNG", {}),
        "rgba.png": (rgb.convert("RGBA"), "PNG", {}),
        "gray.png": (rgb.convert("L"), "PNG", {}),
        "palette.png": (rgb.convert("P"), "PNG", {}),
        "interlaced.png": (rgb, "PNG", {"interlace": 1}),
        "lossless.webp": (rgb, "WEBP", {"lossless": True}),
        "lossy.webp": (rgb, "WEBP", {"quality": 50}),
        "alpha.webp": (rgb.convert("RGBA"), "WEBP", {}),
    }
    for name, (image, fmt, options) in variants.items():
        out = io.BytesIO()
        image.save(out, fmt, **options)
        (CORPUS / "image" / name).write_bytes(out.getvalue())


if __name__ == "__main__":
    main()
