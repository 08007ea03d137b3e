"""The generated JPEGs the image benchmarks decode: smooth patterns with noise,
300-900 px a side, quality 90 (photo-like sizes and entropy, no data set needed)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def generate_jpegs(count: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    images = []
    for i in range(count):
        height, width = rng.integers(300, 901, size=2)
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        pixels = np.stack(
            [
                128 + 100 * np.sin(x / rng.uniform(10, 40) + i),
                128 + 100 * np.cos(y / rng.uniform(10, 40)),
                128 + 60 * np.sin((x + y) / rng.uniform(10, 40)),
            ],
            axis=-1,
        )
        pixels += rng.normal(0, 8, pixels.shape)
        buffer = io.BytesIO()
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
        images.append(buffer.getvalue())
    return images
