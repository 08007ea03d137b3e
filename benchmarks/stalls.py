"""Stalls: the longest wait between two batches, over many fresh loaders.

manycore.py's emulation (32 worker threads whose samples sleep 1 ms, GIL
released, each returning a (224, 224, 3) tensor; batch 64), with both real
cores kept busy by spinning processes, loaded by minato's defaults, one
fresh loader and one epoch per run, each run in a process of its own. Most
runs take 4-5 s; a few have stalled for seconds while every worker thread
waited for the GIL (benchmarks/RESULTS.md, session 16). Rare, so counted
over many runs: the runs, how many had a wait between two batches longer
than `--stall-s`, and the longest waits seen, with the samples/s of the
runs they were in.

    python benchmarks/stalls.py [--runs 40] [--stall-s 1.0] [--idle] [--loader torch]

`--loader torch` runs torch's DataLoader instead (its workers are processes,
each with a heap and a GIL of its own), to tell a stall of minato's from one
of the machine's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time

WORKERS, SLEEP_S, BATCH, SAMPLES = 32, 0.001, 64, 48_000


def one_run(busy: bool, loader_kind: str) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import manycore

    import minato

    spinners = []
    if busy:
        spinners = [
            multiprocessing.Process(target=manycore._spin, daemon=True)
            for _ in range(os.cpu_count() or 1)
        ]
        for spinner in spinners:
            spinner.start()
    try:
        make = minato.DataLoader if loader_kind == "minato" else torch_loader()
        loader = make(
            manycore.Sleeping(SAMPLES, SLEEP_S),
            batch_size=BATCH,
            shuffle=True,
            num_workers=WORKERS,
        )
        began = last = time.perf_counter()
        longest = 0.0
        samples = 0
        first = None
        for images, _ in loader:
            now = time.perf_counter()
            if first is None:
                first = now - began  # the workers' start: not a wait between batches
            else:
                longest = max(longest, now - last)
            last = now
            samples += len(images)
        run = {"rate": samples / (last - began), "longest": longest, "moved": 0, "first": first}
        run["workers"] = WORKERS
        if loader_kind == "minato":
            stats = loader.stats()
            run["moved"] = stats.moved_samples
            run["workers"] = max(count for _, count in stats.worker_history or [(0, 0)])
        return run
    finally:
        for spinner in spinners:
            spinner.terminate()


def torch_loader():
    import torch.utils.data

    return torch.utils.data.DataLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--stall-s", type=float, default=1.0)
    parser.add_argument("--idle", action="store_true", help="no spinning processes")
    parser.add_argument("--loader", choices=("minato", "torch"), default="minato")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(not args.idle, args.loader)))
        return
    runs = []
    for _ in range(args.runs):
        command = [sys.executable, os.path.abspath(__file__), "--one", "--loader", args.loader]
        if args.idle:
            command.append("--idle")
        out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    stalled = [run for run in runs if run["longest"] > args.stall_s]
    ideal = WORKERS / SLEEP_S
    rates = sorted(run["rate"] / ideal for run in runs)
    print(
        f"# stalls: {len(runs)} runs of {WORKERS} workers x {SLEEP_S * 1e3:.0f} ms, batch "
        f"{BATCH}, {'idle' if args.idle else 'busy'} cores; {args.loader}'s loader; minato from "
        f"{os.path.dirname(__import__('minato').__file__)}"
    )
    print(
        f"  runs with a wait over {args.stall_s:.1f} s between batches: {len(stalled)}; "
        f"median {rates[len(rates) // 2]:.2f} of ideal, lowest {rates[0]:.2f}"
    )
    for run in sorted(runs, key=lambda run: -run["longest"])[:5]:
        print(
            f"  longest wait {run['longest']:.2f} s, {run['rate'] / ideal:.2f} of ideal, "
            f"first batch {run['first']:.2f} s, {run['moved']} moved, "
            f"pool up to {run['workers']}"
        )


if __name__ == "__main__":
    main()
