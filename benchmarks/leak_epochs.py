"""Epoch after epoch of one persistent loader: memory maps and RSS stay flat.

Issue 14's leak: a shuffled loader with persistent workers and default
options over a small dataset (256 samples, 2 workers) grew the process's
memory maps by about 3.7 and RSS by about 0.1 MB per epoch (1,268 -> 65,529
maps after 17,452 epochs, where the kernel's map limit stops any new thread):
retired worker threads kept their stacks. This runs that loop and prints the
maps, RSS and thread counts as it goes; it fails (exit 1) when the maps or
RSS grew past the tolerances between the first report after warm-up with
the pool at its final size and the last.

    python benchmarks/leak_epochs.py [--epochs 20000] [--report-every 1000]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch.utils.data as tud
from soak import map_count, rss_mib, thread_count

import minato


class Small(tud.Dataset):
    def __init__(self, slow_ms: float) -> None:
        self.slow_s = slow_ms / 1000

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> int:
        if i == 0 and self.slow_s:
            time.sleep(self.slow_s)
        return i


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20_000)
    parser.add_argument("--report-every", type=int, default=1_000)
    parser.add_argument("--warmup", type=int, default=1_000, help="epochs before the baseline")
    parser.add_argument("--map-growth", type=int, default=64, help="allowed extra memory maps")
    parser.add_argument("--rss-growth", type=float, default=32.0, help="allowed extra RSS, MiB")
    parser.add_argument(
        "--churn",
        action="store_true",
        help="sample 0 sleeps 20 ms past a 0.2 ms sample_timeout (per sample of a "
        "task): a replacement "
        "thread starts and retires every epoch",
    )
    args = parser.parse_args()

    options = dict(sample_timeout=0.0002, adaptive=False) if args.churn else {}
    loader = minato.DataLoader(
        Small(20.0 if args.churn else 0.0),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        **options,
    )
    print(
        f"# leak_epochs: {args.epochs} epochs of 256 samples, 2 workers, persistent, "
        f"shuffled{', churn' if args.churn else ''}"
    )
    print(f"{'epoch':>7} {'seconds':>8} {'maps':>6} {'RSS MiB':>8} {'threads':>7} {'workers':>7}")
    started = time.perf_counter()
    rows = []
    for epoch in range(1, args.epochs + 1):
        seen = sorted(int(i) for batch in loader for i in batch)
        if seen != list(range(256)):
            print(f"epoch {epoch}: wrong samples delivered", file=sys.stderr)
            return 1
        if epoch % args.report_every == 0 or epoch == args.warmup:
            row = (epoch, time.perf_counter() - started, map_count(), rss_mib(), thread_count())
            rows.append(row)
            print(
                f"{row[0]:>7} {row[1]:>8.1f} {row[2]:>6} {row[3]:>8.1f} {row[4]:>7} "
                f"{loader.stats().workers:>7}",
                flush=True,
            )
    # The adaptive pool grows for a while (to its bound, on this loop): the
    # baseline is the first report after the warm-up with the final thread count.
    baseline = next(row for row in rows if row[0] >= args.warmup and row[4] == rows[-1][4])
    last = rows[-1]
    map_growth, rss_growth = last[2] - baseline[2], last[3] - baseline[3]
    print(
        f"# from epoch {baseline[0]} to {last[0]}: maps {map_growth:+d}, "
        f"RSS {rss_growth:+.1f} MiB, threads {baseline[4]} -> {last[4]}; "
        f"slow samples {loader.stats().slow_samples}"
    )
    if map_growth > args.map_growth or rss_growth > args.rss_growth:
        print("# FAILED: grew past the tolerances", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
