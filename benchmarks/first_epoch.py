"""A fresh process's first loader: construction, first batch and first epoch.

gpu_train's PIL pipeline over generated 300-900 px JPEGs held in memory (the
dataset's pickle is large, as a dataset that holds its data is), 2 workers,
batch 16, shuffled, one epoch. Each system runs in a fresh interpreter of
its own (what a training script's first epoch pays: forks, the fork server,
the dataset sent to each worker), in turn, repeated:

- torch's DataLoader (worker processes forked at ``iter()``);
- minato's defaults and minato forced to worker processes, with the fork
  server forked from the training process (the default) and started as a
  fresh interpreter (``MINATO_FORK_SERVER=exec``);
- minato on threads.

    python benchmarks/first_epoch.py [--images 768] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

SYSTEMS = {
    "torch's DataLoader": ("torch", None, {}),
    "minato defaults": ("minato", "auto", {}),
    "minato defaults, exec'd fork server": ("minato", "auto", {"MINATO_FORK_SERVER": "exec"}),
    "minato processes": ("minato", "multiprocessing", {}),
    "minato processes, exec'd fork server": (
        "minato",
        "multiprocessing",
        {"MINATO_FORK_SERVER": "exec"},
    ),
    "minato threads": ("minato", "thread", {}),
}


def run_one(kind: str, method: str | None, images: int) -> None:
    sys.path.insert(0, HERE)
    import torch.utils.data as tud
    from gpu_train import PilImages, generate_in_parallel

    import minato

    data = generate_in_parallel(images, os.cpu_count() or 1)
    options = {} if method is None else {"worker_method": method}
    loader_class = tud.DataLoader if kind == "torch" else minato.DataLoader
    started = time.perf_counter()
    loader = loader_class(PilImages(data), batch_size=16, shuffle=True, num_workers=2, **options)
    built = time.perf_counter()
    batches = iter(loader)
    next(batches)
    first = time.perf_counter()
    for _ in batches:
        pass
    ended = time.perf_counter()
    how = loader.stats().worker_method if isinstance(loader, minato.DataLoader) else ""
    print(f"{(built - started) * 1e3:.1f} {first - built:.3f} {images / (ended - built):.1f} {how}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, method = args.one
        run_one(kind, None if method == "-" else method, args.images)
        return
    print(
        f"# first_epoch: PIL pipeline, {args.images} JPEGs held in memory, 2 workers, "
        f"batch 16, {os.cpu_count()} cores; each run a fresh interpreter"
    )
    print(f"  {'system':40s} {'construct':>10s} {'first batch':>12s} {'epoch':>10s}")
    for _ in range(args.repeats):
        for name, (kind, method, env) in SYSTEMS.items():
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--images",
                    str(args.images),
                    "--one",
                    kind,
                    method or "-",
                ],
                env=dict(os.environ, **env),
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            ).stdout.split()
            construct, first, rate = float(out[0]), float(out[1]), float(out[2])
            how = f"  ({out[3]})" if len(out) > 3 else ""
            print(
                f"  {name:40s} {construct:7.1f} ms {first:9.2f} s {rate:6.0f}/s{how}",
                flush=True,
            )


if __name__ == "__main__":
    main()
