"""The peak memory of a loader's whole process tree: the training process,
its worker processes and (minato) the fork server, as PSS (shared pages split
between the processes that map them) sampled every 0.1 s over one shuffled
epoch of manycore.py's sleeping samples (16 workers x 3 ms, batch 64, 12,000
samples), over the tree's PSS before the loader starts. For minato, the
batch arenas lent and kept free at batch 150 (rust/wire/arena_pool.rs).

PSS counts shared memory only where a process maps it. torch's batches in
flight are shared-memory files passed between processes by descriptor, not
mapped while they wait in its queue, so PSS leaves them out, where minato's
arenas are mapped and counted. The second figure counts every one: the
tree's PSS of anonymous and file pages, plus the machine's shared memory
(/proc/meminfo ``Shmem``) over its base (a quiet machine: other processes'
shared memory would count too).

    python benchmarks/tree_memory.py {torch|minato}
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings


def process_tree(root: int) -> list[int]:
    """`root` and every process descended from it, read from /proc (not from
    a `ps` child: one started from a sampling thread while torch forked its
    workers read nothing for them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def pss_mib(pids: list[int]) -> tuple[float, float]:
    """The PSS of `pids` together, in MiB: all of it, and their anonymous
    and file pages only (shared memory left out)."""
    total_kib = unshared_kib = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                for line in rollup:
                    if line.startswith("Pss:"):
                        total_kib += int(line.split()[1])
                    elif line.startswith(("Pss_Anon:", "Pss_File:")):
                        unshared_kib += int(line.split()[1])
        except OSError:
            pass  # gone meanwhile
    return total_kib / 1024, unshared_kib / 1024


def machine_shmem_mib() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) / 1024
    return 0.0


def measure(root: int, leave_out: int | None = None) -> tuple[float, float]:
    """(the tree's PSS, its anonymous and file PSS plus the machine's shared memory)."""
    pss, unshared = pss_mib([pid for pid in process_tree(root) if pid != leave_out])
    return pss, unshared + machine_shmem_mib()


def run_fresh(args: list[str], env: dict[str, str] | None = None) -> str:
    """What ``python *args`` prints, run in a fresh interpreter (a script's
    first loader pays its forks and imports there)."""
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout


def main() -> None:
    # Imported here: first_epoch.py's sampling process reads the tree with
    # `measure` alone.
    import torch.utils.data as tud

    import minato

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from manycore import Sleeping

    warnings.filterwarnings("ignore")
    kind = sys.argv[1] if len(sys.argv) > 1 else "minato"
    base = measure(os.getpid())
    peak, done = [0.0, 0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = measure(os.getpid())
            peak[:] = [max(peak[0], now[0]), max(peak[1], now[1])]
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
    print(
        f"{kind}: peak PSS of the process tree over its base {peak[0] - base[0]:.0f} MiB; "
        f"with all shared memory {peak[1] - base[1]:.0f} MiB{arenas}"
    )


if __name__ == "__main__":
    main()
