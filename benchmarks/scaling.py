"""Which part of minato keeps 16 workers from scaling: one run, side by side.

The same decode (minato.io.decode_image of generated 300-900 px JPEGs to
224x224, as gpu_train.py's (c); ``--decode pil``: PIL and torchvision's
Resize, as its (b) and (d)) read alone, batch 128, through: a plain
``ThreadPoolExecutor`` (the ceiling for threads), minato with a fixed pool
(``adaptive=False``) in its default sample-level mode, without ``device=``,
in batch-level mode (``in_order=True, sample_timeout=None``), on worker
processes in either mode, and torch's DataLoader on processes. Each loader is read twice
(the first read includes its start).

    python benchmarks/scaling.py [--workers 16] [--images 2048] [--batches 25] [--decode pil]
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.utils.data as tud
from gpu_train import MinatoImages, PilImages, data_alone, generate_in_parallel

import minato
import minato.io


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--batches", type=int, default=25)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument(
        "--decode",
        choices=["minato", "pil"],
        default="minato",
        help="pil: gpu_train.py's (b)/(d) dataset (PIL decode, torchvision Resize)",
    )
    args = parser.parse_args()
    images = generate_in_parallel(args.images, os.cpu_count() or 1)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dataset = MinatoImages(images) if args.decode == "minato" else PilImages(images)
    print(
        f"# scaling: {args.decode} decode, {args.workers} workers, batch {args.batch}, "
        f"{len(images)} JPEGs; "
        f"torch {torch.__version__}; {os.cpu_count()} cores; "
        + (torch.cuda.get_device_name() if cuda else "no GPU")
    )
    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(dataset.__getitem__, range(64)))
        start = time.perf_counter()
        list(pool.map(dataset.__getitem__, range(len(images))))
        rate = len(images) / (time.perf_counter() - start)
    print(f"  {'ThreadPoolExecutor, __getitem__ alone':42} {rate:7.0f}/s")
    common = dict(
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=True,
        drop_last=True,
    )
    fixed = dict(common, adaptive=False)
    cases: list[tuple[str, type, dict]] = [
        (
            "minato, samples, device=cuda" if cuda else "minato, samples",
            minato.DataLoader,
            dict(fixed, device=device if cuda else None),
        ),
        ("minato, samples, no device", minato.DataLoader, fixed),
        (
            "minato, batches (in_order, no timeout)",
            minato.DataLoader,
            dict(fixed, in_order=True, sample_timeout=None),
        ),
        (
            "minato, samples, worker processes",
            minato.DataLoader,
            dict(fixed, worker_method="multiprocessing"),
        ),
        (
            "minato, batches, worker processes",
            minato.DataLoader,
            dict(fixed, worker_method="multiprocessing", in_order=True, sample_timeout=None),
        ),
        ("torch DataLoader, processes", tud.DataLoader, dict(common, pin_memory=cuda)),
    ]
    for name, loader_type, options in cases:
        loader = loader_type(dataset, **options)
        first = data_alone(loader, args.batches, args.batch, device)
        second = data_alone(loader, args.batches, args.batch, device)
        extra = ""
        if isinstance(loader, minato.DataLoader):
            stats = loader.stats()
            extra = f"  workers {stats.workers}, slow samples {stats.slow_samples}"
        print(f"  {name:42} {first:7.0f}/s then {second:7.0f}/s{extra}", flush=True)
        del loader


if __name__ == "__main__":
    main()
