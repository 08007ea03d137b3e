"""What turns loaded samples into the batch delivered, off the training
loop's thread: collate, then pin.

torch's DataLoader collates in its worker processes and pins in a pin-memory
thread: the training loop's thread only takes finished batches. minato does
the same with threads. A batch-level worker pins the batch it collated
(`pinning`); the sample-level engine collates each batch it assembled on the
worker thread that completed it, as torch's workers each collate their own
(`sample_collator`), or, where the workers are processes and the samples
are made where they are collated, on its one collate thread. A
``collate_fn`` that draws random numbers (MixUp, CutMix) draws from
generators of the collating thread's own, as in a torch worker process,
seeded for each batch from the epoch's seed and the batch's first sample:
which thread collates a batch changes nothing it draws, and it neither draws
from nor disturbs the training loop's generators. A cheap batch of a collate
that draws no random numbers (torch's ``default_collate``, unpinned) is the
exception: the consumer collates it (rust/bindings/sample_collate.rs), a GIL
hand-over costing more than the work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torch._utils import ExceptionWrapper
from torch.utils.data._utils.collate import default_collate
from torch.utils.data._utils.pin_memory import pin_memory

from minato._loader.device import Failure
from minato._process.ipc import open_samples
from minato._task.error import WorkerError
from minato._task.seed import SampleRun, collate_run
from minato._thread.generators import ThreadGenerator, bound_to, worker_rng_generators
from minato._thread.torch_threads import limit_thread_intra_op
from minato._thread.worker_info import set_thread_worker_info, thread_worker_info
from minato._util.user_code import IN_USER_CODE

# The collating generators are made as a worker with this id would have
# them: above any pool's size, so never a worker's seed.
COLLATE_THREAD_SEED_ID = 1 << 20


class EpochSeed:
    """The seed of the epoch whose batches are collated, set by the iterator
    as each epoch begins (None where its samples are not seeded: then one
    stream of draws per thread, in the order it collates batches, and the
    loader keeps such a collate on its one collate thread). A batch of an
    earlier epoch still collating when it changes is dropped, never
    delivered."""

    __slots__ = ("seed",)

    def __init__(self) -> None:
        self.seed: int | None = None

    def batch_run(self, tags: list[int]) -> SampleRun | None:
        """The draws of the batch whose samples are at `tags`."""
        seed = self.seed
        if seed is None or not tags:
            return None
        return collate_run(seed, tags[0], None)


PIN_WHERE = "while pinning a batch in a DataLoader worker thread"


def pinned(batch: Any, device: str | None) -> Any:
    """`batch` in page-locked memory, as torch's pin-memory thread makes it."""
    return pin_memory(batch, device)


def pinning(run: Callable[[int, Any], Any], device: str | None) -> Callable[[int, Any], Any]:
    """A batch-level worker's `run` (see minato._task.runner) that pins each batch
    it delivers; an error pinning is delivered as the batch's error."""

    def run_pinned(epoch: int, task: Any) -> Any:
        output = run(epoch, task)
        if not isinstance(output, tuple):
            return output  # EXHAUSTED
        tag, payload = output
        if not isinstance(payload, tuple) or payload[1] is None:
            return output  # an ExceptionWrapper, or every sample skipped
        samples, batch, failures = payload
        try:
            batch = pinned(batch, device)
        except Exception:
            return tag, WorkerError(where=PIN_WHERE)
        return tag, (samples, batch, failures)

    return run_pinned


def draws_no_random(collate_fn: Callable[[list[Any]], Any]) -> bool:
    """Whether `collate_fn` is known to draw no random numbers: torch's
    default_collate and minato's."""
    return collate_fn is default_collate or getattr(collate_fn, "draws_no_random", False)


def sample_collator(
    collate_fn: Callable[[list[Any]], Any],
    *,
    pin: bool,
    device: str | None,
    base_seed: int = 0,
    own_thread: bool = True,
    opens_samples: bool = False,
    epoch_seed: EpochSeed | None = None,
    worker_info: Callable[[], Any] | None = None,
) -> Callable[
    [list[int], list[Any], ExceptionWrapper | None],
    tuple[list[int], int, Any, BaseException | None],
]:
    """The sample engine's collate stage: a batch's tags, its samples and the
    first worker error among them (or None) to ``(tags, sample count, the
    batch or a Failure, the collate error or None)``. A
    collate error is handed back for the consumer to name the samples' indices.

    `own_thread`: it runs on the loader's collate thread or a worker thread,
    which it sets up as a worker process is set up (one intra-op thread),
    and a collate that may draw random numbers draws from generators of the
    thread's own, seeded for each batch from `epoch_seed` (see `EpochSeed`).
    Otherwise it runs on the consumer's thread, a cheap batch of a collate
    that draws no random numbers: that thread, the training loop's, keeps its
    intra-op threads and generators.

    `opens_samples`: samples from worker processes may arrive still pickled
    (a user's collate_fn's: minato._process.ipc.DeferredSample), and are
    made here, not on the worker threads that received them.

    `worker_info`: what ``get_worker_info()`` answers on the loader's
    collate thread, which is no worker's (a worker thread answers its own):
    in torch the collate_fn runs in a worker process, where it is never
    None."""
    local = threading.local()

    def generator() -> ThreadGenerator:
        own = getattr(local, "generator", None)
        if own is None:
            # First call on this thread: the generators a worker process
            # would have, bound only while collating (a worker thread keeps
            # its own for its samples).
            own = local.generator = ThreadGenerator(
                worker_rng_generators(base_seed, COLLATE_THREAD_SEED_ID)
            )
        return own

    def collate_drawing(tags: list[int], samples: list[Any]) -> Any:
        mode = generator()
        if epoch_seed is not None:
            mode.generators.begin_run(epoch_seed.batch_run(tags))
        with bound_to(mode.generators), mode:
            return collate_fn(samples)

    # torch's default_collate and minato's draw no random numbers: they are
    # spared the generator mode's cost on every torch call (10-30 % of a
    # trivial dataset's shuffled epoch, benchmarks/overhead.py --shuffle).
    no_random = draws_no_random(collate_fn)

    def collate(
        tags: list[int], samples: list[Any], error: ExceptionWrapper | None
    ) -> tuple[list[int], int, Any, BaseException | None]:
        # The engine split the workers' (tag, sample) pairs and found the
        # first sample that is a worker's error (rust/bindings/sample_collate.rs):
        # nothing here is done per sample.
        if own_thread and not getattr(local, "limited", False):
            # One intra-op thread, as torch's workers (which collate) and its
            # pin-memory thread have: not a team spinning beside the workers.
            limit_thread_intra_op(1)
            if worker_info is not None and thread_worker_info() is None:
                set_thread_worker_info(worker_info())
            local.limited = True
        if error is not None:
            return tags, 0, Failure(error), None
        try:
            with IN_USER_CODE:
                if opens_samples:
                    samples = open_samples(samples)
                if no_random or not own_thread:
                    batch = collate_fn(samples)
                else:
                    batch = collate_drawing(tags, samples)
        except Exception as error:
            return tags, 0, None, error
        if pin:
            try:
                batch = pinned(batch, device)
            except Exception:
                return tags, 0, Failure(WorkerError(where=PIN_WHERE)), None
        return tags, len(samples), batch, None

    return collate
