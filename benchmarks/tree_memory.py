"""The peak memory of a loader's whole process tree: the training process,
its worker processes and (minato) the fork server, as PSS (shared pages split
between the processes that map them) sampled every 0.1 s over one shuffled
epoch of manycore.py's sleeping samples (16 workers x 3 ms, batch 64, 12,000
samples), over the tree's PSS before the loader starts. For minato, the
batch arenas lent and kept free at batch 150 (rust/wire/arena_pool.rs).

    python benchmarks/tree_memory.py {torch|minato}
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings

import torch.utils.data as tud

import minato

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from manycore import Sleeping  # noqa: E402


def tree_pss_mib(root: int) -> float:
    """The PSS of `root` and every process below it, in MiB."""
    table = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
    children: dict[int, list[int]] = {}
    for line in table.stdout.splitlines():
        fields = line.split()
        if len(fields) == 2:
            children.setdefault(int(fields[1]), []).append(int(fields[0]))
    tree, stack = set(), [root]
    while stack:
        pid = stack.pop()
        if pid not in tree:
            tree.add(pid)
            stack.extend(children.get(pid, []))
    total_kib = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                for line in rollup:
                    if line.startswith("Pss:"):
                        total_kib += int(line.split()[1])
        except OSError:
            pass  # gone meanwhile
    return total_kib / 1024


def main() -> None:
    warnings.filterwarnings("ignore")
    kind = sys.argv[1] if len(sys.argv) > 1 else "minato"
    base = tree_pss_mib(os.getpid())
    peak, done = [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_pss_mib(os.getpid()))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    dataset = Sleeping(12000, 0.003)
    options = dict(batch_size=64, shuffle=True, num_workers=16)
    if kind == "torch":
        loader = tud.DataLoader(dataset, **options)
    else:
        loader = minato.DataLoader(
            dataset, worker_method="multiprocessing", worker_nice=0, **options
        )
    iterator = iter(loader)
    arenas = ""
    for batches, _ in enumerate(iterator, 1):
        if batches == 150 and kind != "torch":
            pool = getattr(iterator._processes, "arenas", None)
            if pool is not None:
                arenas = f", arenas lent {pool.lent_arenas}, kept free {pool.free_arenas}"
    done.set()
    sampler.join()
    print(f"{kind}: peak PSS of the process tree over its base {peak[0] - base:.0f} MiB{arenas}")


if __name__ == "__main__":
    main()
