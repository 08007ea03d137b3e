"""Where a loader's memory goes, page by page: the physical pages its process
tree holds that the training process did not hold before the loader was
built, each counted once, by what maps it (heap, other anonymous memory,
files, minato's slot rings and batch arenas, other shared memory) and which
processes share it (the training process, the fork server, how many
workers). PSS splits a shared page between its processes and cannot tell a
page the training process copied after a fork from one it always had; page
frame numbers (/proc/<pid>/pagemap) can. Needs root (the kernel zeroes
frame numbers for others). Shared memory no process maps (torch's batches
waiting in its queue, passed by descriptor) has no frame in the tree: the
last line adds the machine's ``Shmem`` over its base instead of the tree's
shared pages (a quiet machine's: other programs' shared memory counts too).

gpu_train's PIL pipeline over generated 300-900 px JPEGs held in memory, as
first_epoch.py's, batch 16, shuffled; read after `--batches` batches, the
loader paused.

    sudo python benchmarks/tree_pages.py {torch,processes,defaults,threads} \
        [--workers 2] [--batches 30]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PRESENT = np.uint64(1 << 63)
FRAME = np.uint64((1 << 55) - 1)


def kind_of(name: str) -> str:
    if "minato-slots" in name:
        return "slot ring"
    if "minato-arena" in name:
        return "batch arena"
    if "memfd" in name or "/dev/shm" in name or "torch_" in name:
        return "shared memory"
    if name == "[heap]":
        return "heap"
    if name.startswith("/"):
        return "file"
    return "anonymous"


def frames(pid: int) -> dict[int, str]:
    """Each page frame `pid` maps now, and what maps it."""
    found: dict[int, str] = {}
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for line in maps:
            parts = line.split()
            name = parts[5] if len(parts) > 5 else ""
            if name == "[vsyscall]":
                continue
            low, high = (int(x, 16) for x in parts[0].split("-"))
            pagemap.seek((low >> 12) * 8)
            entries = np.frombuffer(pagemap.read(((high - low) >> 12) * 8), dtype=np.uint64)
            kind = kind_of(name)
            for frame in (entries[(entries & PRESENT) != 0] & FRAME).tolist():
                found[frame] = kind
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=["torch", "processes", "defaults", "threads"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--images", type=int, default=768)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    sys.path.insert(0, HERE)
    import torch.utils.data as tud
    from gpu_train import PilImages, generate_in_parallel
    from tree_memory import machine_shmem_mib, process_tree

    import minato

    data = generate_in_parallel(args.images, os.cpu_count() or 1)
    me = os.getpid()
    shmem_before = machine_shmem_mib()
    before = set(frames(me))
    if not any(before):
        sys.exit("page frame numbers read as 0: run as root")
    options = dict(batch_size=16, shuffle=True, num_workers=args.workers, persistent_workers=True)
    if args.system == "torch":
        loader = tud.DataLoader(PilImages(data), **options)
    else:
        method = {"processes": "multiprocessing", "defaults": "auto", "threads": "thread"}
        loader = minato.DataLoader(PilImages(data), worker_method=method[args.system], **options)
    batches = iter(loader)
    started = time.perf_counter()
    for _ in range(args.batches):
        next(batches)
    rate = args.batches * 16 / (time.perf_counter() - started)
    time.sleep(0.3)  # the workers' last tasks in
    tree = process_tree(me)
    roles = {pid: "worker" for pid in tree}
    roles[me] = "training"
    for pid in tree:
        if pid != me and len(process_tree(pid)) > 1:
            roles[pid] = "fork server"
    holders: dict[int, list[int]] = collections.defaultdict(list)
    kinds: dict[int, str] = {}
    for pid in tree:
        try:
            for frame, kind in frames(pid).items():
                holders[frame].append(pid)
                kinds[frame] = kind
        except OSError:
            pass  # gone meanwhile
    tally: collections.Counter[tuple[str, str]] = collections.Counter()
    for frame, pids in holders.items():
        if frame in before:
            continue
        named = sorted({roles[pid] for pid in pids} - {"worker"})
        workers = sum(roles[pid] == "worker" for pid in pids)
        if workers:
            named.append(f"{workers} worker{'s' if workers > 1 else ''}")
        tally[(kinds[frame], " + ".join(named))] += 1
    extra = ""
    if isinstance(loader, minato.DataLoader):
        stats = loader.stats()
        pool = getattr(getattr(batches, "_processes", None), "arenas", None)
        if pool is not None:
            extra = f"; arenas lent {pool.lent_arenas}, kept free {pool.free_arenas}"
        extra = f" ({stats.worker_method}{extra})"
    total = sum(tally.values()) * 4 / 1024
    print(
        f"{args.system}, {args.workers} workers, after {args.batches} batches "
        f"({rate:.0f} samples/s){extra}: {total:.1f} MiB of new pages in the tree"
    )
    for (kind, who), pages in sorted(tally.items(), key=lambda item: -item[1]):
        if pages * 4 / 1024 >= 0.25:
            print(f"  {kind:14s} {who:34s} {pages * 4 / 1024:7.1f} MiB")
    shared_kinds = ("slot ring", "batch arena", "shared memory")
    private = sum(pages for (kind, _), pages in tally.items() if kind not in shared_kinds)
    shmem = machine_shmem_mib() - shmem_before
    print(
        f"  with every shared-memory page counted (mapped or not): "
        f"{private * 4 / 1024 + shmem:.1f} MiB ({shmem:.1f} of them shared memory)"
    )


if __name__ == "__main__":
    main()
