"""A fresh process's first loader: construction, first batch and first epoch.

gpu_train's PIL pipeline over generated 300-900 px JPEGs held in memory (the
dataset's pickle is large, as a dataset that holds its data is), 2 workers
(or each count of ``--workers``), batch 16, shuffled, one epoch, and the
peak PSS of the process tree (the fork server and its workers included)
over what the process held before the loader was built; and beside it the
same with every shared-memory segment counted: PSS counts shared memory
only where a process maps it, and torch's batches in flight are
shared-memory files passed by descriptor, unmapped while they wait in its
queue, where minato's arenas and slot rings stay mapped. That figure is the
tree's anonymous and file PSS plus the machine's ``Shmem`` (/proc/meminfo)
over its base: a quiet machine's. Each reading walks the page tables of
every process of the tree, a load of its own beside the run, and minato's
auto decides on what it measures then (it tried processes beside the
readings where it kept threads without them, benchmarks/RESULTS.md, session
30): figures of speed alone come from ``--pss-interval 0``. Each system
runs in a fresh interpreter of its own (what a training script's first
epoch pays: forks, the fork server, the dataset sent to each worker), in
turn, repeated:

- torch's DataLoader (worker processes forked at ``iter()``);
- minato's defaults and minato forced to worker processes, with the fork
  server forked from the training process (the default) and started as a
  fresh interpreter (``MINATO_FORK_SERVER=exec``);
- minato on threads.

``--let-go MIB``: the process holds MIB of CPU tensors (a model on the
CPU, a checkpoint) when the loader is built and lets them go just after
(the model moved to the GPU), before ``iter()``; the peak counts from then.
A fork server forked as the loader is built would keep its own copy.

    python benchmarks/first_epoch.py [--images 768] [--repeats 2] [--workers 2 8] [--let-go 300]
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time

from tree_memory import run_fresh

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


class TreePeak:
    """The peak PSS of this process's tree over its base, from now until
    `stop`, and the same with all shared memory counted (see the module's
    note). Read by a process of its own (`sample_pss`): a thread here would
    take this process's GIL and CPU from the run (page tables walked)."""

    def __init__(self, interval: float) -> None:
        self.sampler = subprocess.Popen(
            [sys.executable, __file__, "--sample-pss", str(os.getpid()), str(interval)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.sampler.stdout is not None
        self.base, self.base_all = map(float, self.sampler.stdout.readline().split())

    def restart(self) -> None:
        """The peak counts from now (what was let go before is not in it)."""
        assert self.sampler.stdin is not None
        self.sampler.stdin.write("restart\n")
        self.sampler.stdin.flush()

    def stop(self) -> tuple[float, float]:
        assert self.sampler.stdout is not None and self.sampler.stdin is not None
        self.sampler.stdin.close()
        peak, peak_all = map(float, self.sampler.stdout.readline().split())
        self.sampler.wait()
        return peak - self.base, peak_all - self.base_all


def run_one(
    kind: str, method: str | None, images: int, workers: int, interval: float, let_go: int = 0
) -> None:
    sys.path.insert(0, HERE)
    import torch.utils.data as tud
    from gpu_train import PilImages, generate_in_parallel

    import minato

    data = generate_in_parallel(images, os.cpu_count() or 1)
    options = {} if method is None else {"worker_method": method}
    loader_class = tud.DataLoader if kind == "torch" else minato.DataLoader

    peak = TreePeak(interval)
    import torch

    held = torch.ones(let_go << 18) if let_go else None  # float32, written
    started = time.perf_counter()
    loader = loader_class(
        PilImages(data), batch_size=16, shuffle=True, num_workers=workers, **options
    )
    built = time.perf_counter()
    if held is not None:
        del held
        peak.restart()
    batches = iter(loader)
    next(batches)
    first = time.perf_counter()
    for _ in batches:
        pass
    ended = time.perf_counter()
    pss, pss_all = peak.stop()
    how = loader.stats().worker_method if isinstance(loader, minato.DataLoader) else ""
    print(
        f"{(built - started) * 1e3:.1f} {first - built:.3f} {images / (ended - built):.1f} "
        f"{pss:.0f} {pss_all:.0f} {how}"
    )
    if isinstance(loader, minato.DataLoader):
        print(loader.stats().worker_method_reason)


def sample_pss(root: int, interval: float) -> None:
    """Prints the PSS of `root`'s process tree (this process left out) now,
    and the same with all shared memory counted (see the module's note),
    then their peaks once standard input closes."""
    sys.path.insert(0, HERE)
    from tree_memory import measure

    def tree_pss() -> tuple[float, float]:
        return measure(root, leave_out=os.getpid())

    peak, peak_all = tree_pss()
    print(peak, peak_all, flush=True)
    while True:
        if interval > 0 and not select.select([sys.stdin], [], [], interval)[0]:
            now, now_all = tree_pss()
            peak, peak_all = max(peak, now), max(peak_all, now_all)
            continue
        if not sys.stdin.readline():  # closed: the run is over
            break
        peak, peak_all = tree_pss()  # restarted
    print(peak, peak_all, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--only", nargs="+", choices=list(SYSTEMS), help="these systems only")
    # How often the tree's PSS is read (0: never, for figures of speed alone).
    parser.add_argument("--pss-interval", type=float, default=0.05)
    # MiB held as the loader is built and let go before iter() (see above).
    parser.add_argument("--let-go", type=int, default=0)
    parser.add_argument("--sample-pss", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sample_pss:
        sample_pss(int(args.sample_pss[0]), float(args.sample_pss[1]))
        return
    if args.one:
        kind, method = args.one
        method = None if method == "-" else method
        run_one(kind, method, args.images, args.workers[0], args.pss_interval, args.let_go)
        return
    print(
        f"# first_epoch: PIL pipeline, {args.images} JPEGs held in memory, batch 16, "
        f"{os.cpu_count()} cores; each run a fresh interpreter; peak PSS of the process "
        "tree over its base"
        + (f"; {args.let_go} MiB let go after the loader is built" if args.let_go else "")
    )
    print(
        f"  {'system':40s} {'workers':>7s} {'construct':>10s} {'first batch':>12s} "
        f"{'epoch':>10s} {'peak PSS':>10s} {'+ all shm':>12s}"
    )
    for _ in range(args.repeats):
        for workers in args.workers:
            for name, (kind, method, env) in SYSTEMS.items():
                if args.only and name not in args.only:
                    continue
                out = run_fresh(
                    [
                        __file__,
                        "--images",
                        str(args.images),
                        "--workers",
                        str(workers),
                        "--pss-interval",
                        str(args.pss_interval),
                        "--let-go",
                        str(args.let_go),
                        "--one",
                        kind,
                        method or "-",
                    ],
                    env=dict(os.environ, **env),
                ).splitlines()
                reason = out[1] if len(out) > 1 else ""
                out = out[0].split()
                construct, first, rate = float(out[0]), float(out[1]), float(out[2])
                pss, pss_all = float(out[3]), float(out[4])
                how = f"  ({out[5]})" if len(out) > 5 else ""
                print(
                    f"  {name:40s} {workers:7d} {construct:7.1f} ms {first:9.2f} s {rate:6.0f}/s "
                    f"{pss:+7.0f} MB {pss_all:+9.0f} MB{how}",
                    flush=True,
                )
                if method == "auto":
                    print(f"      ({reason})", flush=True)


if __name__ == "__main__":
    main()
