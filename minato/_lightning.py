"""Lightning's worker seeding, made per-thread.

With ``seed_everything(seed, workers=True)`` Lightning sets each loader's
``worker_init_fn`` to ``partial(pl_worker_init_function, rank=rank)``. In a
worker *process* that function reads the worker's seed from
``torch.initial_seed()`` and reseeds the process-wide ``torch``, ``random``
and numpy generators. In a worker *thread* both are wrong: every thread reads
the training process's seed, and reseeding the globals would reset the
training loop's generators (dropout, augmentation in the loop) from each new
thread. minato runs the same seed derivation from the thread's own base seed
and applies it to the thread's generators (``get_worker_info().rng``, what
``torch.thread_safe_generator()`` returns), leaving the globals alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def _lightning_seed_function(worker_init_fn: object) -> tuple[Any, int | None] | None:
    """(Lightning's pl_worker_init_function, its rank) when that is what was given."""
    function, rank = worker_init_fn, None
    if isinstance(worker_init_fn, functools.partial):
        if worker_init_fn.args:
            return None
        function, rank = worker_init_fn.func, worker_init_fn.keywords.get("rank")
    if getattr(function, "__name__", None) != "pl_worker_init_function":
        return None
    if not str(getattr(function, "__module__", "")).endswith("utilities.seed"):
        return None
    return function, rank


def thread_worker_init_fn(
    worker_init_fn: Callable[[int], None] | None, base_seed: int, rng: Any
) -> Callable[[int], None] | None:
    """``worker_init_fn``, or for Lightning's seeding function its per-thread equivalent."""
    found = _lightning_seed_function(worker_init_fn)
    if found is None:
        return worker_init_fn
    function, rank = found
    lightning_seed = function.__globals__
    generate_seed_sequence = lightning_seed["_generate_seed_sequence"]

    def seed_thread(worker_id: int) -> None:
        global_rank = rank if rank is not None else lightning_seed["rank_zero_only"].rank
        # As Lightning: torch_seed, then two halves of Python's seed.
        seeds = generate_seed_sequence(base_seed, worker_id, global_rank, count=4)
        rng.torch_generator.manual_seed(seeds[0])
        rng.random_generator.seed((seeds[1] << 32) | seeds[2])
        if rng.numpy_generator is not None:
            import numpy as np

            seed = np.random.SeedSequence([base_seed, worker_id, global_rank]).generate_state(4)
            # The container is frozen: reseed its generator in place.
            bit_generator = rng.numpy_generator.bit_generator
            bit_generator.state = type(bit_generator)(seed).state

    return seed_thread
