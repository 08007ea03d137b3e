"""Each sample's random draws, a function of the seeds and the sample alone.

torch's workers each draw from their own generators, and torch deals the
batches to them in turn: a seeded run repeats. minato's worker threads (and
processes) take whichever task is next, the adaptive pool adds workers,
and ``worker_method="auto"`` may move them to processes: a sample's draws
would depend on which worker ran it, that is, on timing. So for each sample
(each batch of a batch sampler of the user's) the worker's process-wide
generators — torch's, ``random``'s and numpy's legacy ones, which a worker
process's dataset, transforms and ``collate_fn`` draw from — are seeded from
the epoch's seed and the sample's position in the epoch (the seeds are
computed in Rust: rust/engine/sample_seed.rs). The epoch's seed comes from
the iterator's base seed (which torch draws from the loader's ``generator``
or the global generator, as a seeded program fixes it) and the epoch's
number; ``state_dict()`` keeps it, so a resumed epoch draws what the
uninterrupted one would have.

A worker thread's generators are seeded when first drawn from in the
sample (minato._thread.generators.ThreadGenerators), so a sample that draws
nothing costs nothing; a worker process's, which the loader cannot watch,
before each sample. Where batches go to a fixed pool in turn (deterministic
mode, an IterableDataset's streams) the workers keep torch's own
per-worker streams.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import torch

from minato._minato import _epoch_seed, _sample_seed

_MASK = (1 << 64) - 1
# A batch's collate draws from seeds of their own: the epoch's seed mixed
# with this, at the batch's first sample's position (a sample's draws use
# the epoch's seed itself).
COLLATE_SEED_SALT = 0x636F_6C6C_6174_6521


class SampleRun:
    """The samples a worker loads in one task (one, or a whole batch loaded
    as one): the epoch's seed, each one's position, and which is being
    loaded (`at`, set by the fetch loop: one store per sample). `eager`
    seeds the generators as each sample starts, where they cannot be seeded
    lazily (a worker process's)."""

    __slots__ = ("at", "eager", "key", "positions")

    def __init__(
        self, key: int, positions: list[int], eager: Callable[[SampleRun], None] | None
    ) -> None:
        self.key = key
        self.positions = positions
        self.at = 0
        self.eager = eager

    def seed(self) -> int:
        """The seed of the sample being loaded."""
        return _sample_seed(self.key, self.positions[self.at])

    def begin(self, ordinal: int) -> None:
        """The run's `ordinal`-th sample starts (a ``__getitems__`` call: its
        first): its generators are seeded for it, eagerly where they must be."""
        self.at = ordinal
        if self.eager is not None:
            self.eager(self)


def collate_run(
    key: int, first_position: int, eager: Callable[[SampleRun], None] | None
) -> SampleRun:
    """The draws of the collate of a batch whose first sample is at
    `first_position` in the epoch of seed `key`: the same wherever the batch
    is collated (a worker thread or process that loaded it whole, or the
    thread that assembled it from single samples)."""
    return SampleRun((key ^ COLLATE_SEED_SALT) & _MASK, [first_position], eager)


def epoch_seed(base_seed: int, epoch: int) -> int:
    """The seed of an iterator's `epoch`-th epoch (0 for its first)."""
    return _epoch_seed(base_seed & _MASK, epoch)


def seed_process(run: SampleRun) -> None:
    """A worker process's `eager`: seeds the process's generators (torch's
    CPU one: CUDA's are not a worker's to touch)."""
    seed = run.seed()
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed & 0xFFFF_FFFF)
