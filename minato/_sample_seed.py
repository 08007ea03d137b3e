"""Each sample's random draws, a function of the seeds and the sample alone.

torch's workers each draw from their own generators, and torch deals the
batches to them in turn: a seeded run repeats. minato's worker threads (and
processes) take whichever task is next, the adaptive pool adds workers,
and ``worker_method="auto"`` may move them to processes: a sample's draws
would depend on which worker ran it, that is, on timing. So before each
sample (or each batch, where a worker loads whole batches), the worker's
process-wide generators — torch's, ``random``'s and numpy's legacy ones,
the ones a worker process's dataset, transforms and ``collate_fn`` draw from
— are seeded from the epoch's seed and the sample's position in the epoch.
The epoch's seed comes from the iterator's base seed (which torch draws from
the loader's ``generator`` or the global generator, as a seeded program
fixes it) and the epoch's number; ``state_dict()`` keeps it, so a resumed
epoch draws what the uninterrupted one would have.

Where batches go to a fixed pool in turn (deterministic mode, an
IterableDataset's streams) the workers keep torch's own per-worker streams.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64's finalizer: nearby inputs give unrelated seeds."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def epoch_seed(base_seed: int, epoch: int) -> int:
    """The seed of an iterator's `epoch`-th epoch (0 for its first)."""
    return _mix(_mix(base_seed & _MASK) ^ epoch)


def sample_seed(epoch_seed: int, position: int) -> int:
    """The seed of the sample (or batch) at `position` in its epoch."""
    return _mix(epoch_seed ^ _mix(position))


# Seeds a worker's generators for one sample.
Reseed = Callable[[int], None]


def thread_reseed(rng: Any, numpy_state: Any) -> Reseed:
    """For a worker thread: its own generators (torch's worker ``_RNG``, and
    the legacy numpy state minato._thread_random gives it)."""
    torch_generator = rng.torch_generator
    random_generator = rng.random_generator

    def reseed(seed: int) -> None:
        torch_generator.manual_seed(seed)
        random_generator.seed(seed)
        if numpy_state is not None:
            numpy_state.seed(seed & 0xFFFF_FFFF)

    return reseed


def process_reseed(seed: int) -> None:
    """For a worker process: the process's own generators (torch's CPU one:
    CUDA's are not a worker's to touch)."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed & 0xFFFF_FFFF)
