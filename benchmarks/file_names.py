"""A dataset that holds a million file names, as torchvision's ImageFolder
holds its ``samples`` (a list of (path, class) tuples), or as a pandas
DataFrame of paths and labels (``--frame``: its string column in pyarrow's
buffers, pandas 3's default where pyarrow is installed; ``--frame objects``:
Python strings in an object column, as pandas 2 holds them): the process tree's
peak PSS over its base while loading.

Each sample reads its name and returns a small tensor (no file is opened),
2 workers, batch 64, shuffled, the first 300 batches. torch's workers are
forked from the training process and share the list's pages; each page a
worker touches (a sample's reference count) is copied into it. minato's
worker processes take the list from the fork server's memory
(minato._process.inherit): the training process must not touch the items
after that fork either, or every page of them is held twice. PSS is read
as in first_epoch.py (its sampler, a process of its own); each system runs
in a fresh interpreter.

    python benchmarks/file_names.py [--names 1000000] [--repeats 2] [--frame [objects]]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.utils.data as tud
from first_epoch import TreePeak
from tree_memory import run_fresh

BATCHES = 300

SYSTEMS = {
    "torch's DataLoader": None,
    "minato processes": "multiprocessing",
    "minato defaults": "auto",
    "minato threads": "thread",
}


class FileNames(tud.Dataset):
    def __init__(self, count: int) -> None:
        self.samples = [
            (f"/datasets/imagenet/train/n{i % 1000:08d}/n{i % 1000:08d}_{i}.JPEG", i % 1000)
            for i in range(count)
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, target = self.samples[index]
        return torch.full((3, 32, 32), len(path), dtype=torch.uint8), target


class FileFrame(tud.Dataset):
    def __init__(self, count: int, objects: bool = False) -> None:
        import pandas

        samples = FileNames(count).samples
        self.frame = pandas.DataFrame(samples, columns=["path", "label"])
        if objects:  # the strings as Python objects, as pandas 2 holds them
            self.frame["path"] = self.frame["path"].astype(object)

    def __len__(self) -> int:
        return len(self.frame)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        row = self.frame.iloc[index]
        return torch.full((3, 32, 32), len(row["path"]), dtype=torch.uint8), int(row["label"])


def run_one(method: str | None, names: int, frame: str | None) -> None:
    import minato

    dataset = FileFrame(names, frame == "objects") if frame else FileNames(names)
    peak = TreePeak(0.05)
    started = time.perf_counter()
    if method is None:
        loader = tud.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2)
    else:
        loader = minato.DataLoader(
            dataset, batch_size=64, shuffle=True, num_workers=2, worker_method=method
        )
    for count, _ in enumerate(loader, 1):
        if count == BATCHES:
            break
    elapsed = time.perf_counter() - started
    pss, pss_all = peak.stop()
    how = loader.stats().worker_method if isinstance(loader, minato.DataLoader) else ""
    print(f"{elapsed:.2f} {pss:.0f} {pss_all:.0f} {how}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--frame",
        nargs="?",
        const="pyarrow",
        choices=["pyarrow", "objects"],
        help="a pandas DataFrame of them, its strings in pyarrow's buffers or Python objects",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_one(None if args.one == "-" else args.one, args.names, args.frame)
        return
    held = f"a DataFrame of (path, label), {args.frame}" if args.frame else "(path, class) tuples"
    print(
        f"# file_names: {args.names:,} {held} held by the dataset, 2 workers, "
        f"batch 64, {BATCHES} batches, {os.cpu_count()} cores; peak PSS of the process tree "
        "over its base"
    )
    print(f"  {'system':24s} {'time':>8s} {'peak PSS':>10s} {'+ all shm':>10s}")
    for _ in range(args.repeats):
        for name, method in SYSTEMS.items():
            out = run_fresh(
                [__file__, "--names", str(args.names), "--one", method or "-"]
                + (["--frame", args.frame] if args.frame else [])
            ).split()
            how = f"  ({out[3]})" if len(out) > 3 else ""
            print(
                f"  {name:24s} {float(out[0]):6.2f} s {float(out[1]):+7.0f} MB "
                f"{float(out[2]):+7.0f} MB{how}",
                flush=True,
            )


if __name__ == "__main__":
    main()
