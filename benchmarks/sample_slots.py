"""A worker process's payloads through fresh shared memory or its ring of slots.

Both sides of minato._process.ipc in this one process, as a worker process and the
loader run them: the worker pickles a sample (its image tensor copied into
shared memory), the loader unpickles 16 of them and stacks them into a
batch, as ``default_collate`` does, then drops the samples (their slots go
back to the ring). Side by side, alternated: fresh shared memory per
sample (the path before rings, still taken where a payload does not fit a
slot), the ring (each sample made a tensor, then torch.stack), and the
ring with the batch stacked straight from the slots (minato's
default_collate, as the loader does with worker processes).

    python benchmarks/sample_slots.py [--batches 200] [--shape 3 224 224]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from minato._loader.collate import fast_default_collate
from minato._minato import SlotMap as SlotLeases
from minato._minato import SlotRing
from minato._process import ipc as _ipc

BATCH = 16
_collate = fast_default_collate(pin=False)


def one_batch(
    samples: list[torch.Tensor], ring: SlotRing | None, leases: SlotLeases, leaves: bool = False
):
    """(worker seconds, loader seconds) for one batch of `samples`; `leaves`:
    stacked from the slots by minato's default_collate, as the loader does."""
    began = time.perf_counter()
    payloads = [_ipc.dumps((sample, 0), ring) for sample in samples]
    worker = time.perf_counter() - began
    began = time.perf_counter()
    received = [
        _ipc.loads(
            p.data, [os.dup(fd) for fd in p.fds], leases if ring is not None else None, leaves
        )
        for p in payloads
    ]
    if leaves:
        batch = _collate(received)[0]
    else:
        batch = torch.stack([image for image, _ in received])
    del received
    loader = time.perf_counter() - began
    del payloads, batch
    if ring is not None:
        ring.give_back(leases.take_freed())  # with the next task, in a real loader
    return worker, loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--shape", type=int, nargs="+", default=[3, 224, 224])
    args = parser.parse_args()
    torch.set_num_threads(1)
    shape = tuple(args.shape)
    samples = [torch.randn(shape) for _ in range(BATCH)]
    nbytes = samples[0].nbytes
    ring, leases = SlotRing(), SlotLeases()
    times: dict[str, list[tuple[float, float]]] = {"fresh": [], "ring": [], "leaves": []}
    for _ in range(args.batches):
        times["fresh"].append(one_batch(samples, None, leases))
        times["ring"].append(one_batch(samples, ring, leases))
        times["leaves"].append(one_batch(samples, ring, leases, leaves=True))
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; "
        f"samples {shape} float32 ({nbytes / 1024:.0f} KiB), batch {BATCH}, "
        f"{args.batches} batches each, alternated; medians"
    )
    print(f"  {'path':8s} {'worker ms/sample':>17s} {'loader ms/batch':>16s}")
    medians = {}
    for name, pairs in times.items():
        worker = statistics.median(w for w, _ in pairs) / BATCH * 1e3
        loader = statistics.median(lo for _, lo in pairs) * 1e3
        medians[name] = (worker, loader)
        print(f"  {name:8s} {worker:17.3f} {loader:16.2f}")
    (fw, fl), (rw, rl) = medians["fresh"], medians["ring"]
    print(f"  ring / fresh: worker {rw / fw:.2f}x, loader {rl / fl:.2f}x")
    print(f"  leaves / ring: loader {medians['leaves'][1] / rl:.2f}x")


if __name__ == "__main__":
    main()
