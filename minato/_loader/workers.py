"""The worker threads the engine starts, as the training process's side
makes them: each one isolated as a worker process would be (its own copy
of the dataset, generators, intra-op thread and ``get_worker_info()``),
running its tasks itself (minato._task.runner) or handing them to a worker
process of its own (minato._process.workers)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from torch.utils.data._utils import worker as _torch_worker

from minato._loader.collate_stage import pinning
from minato._process.method import WorkerMethod
from minato._process.workers import ProcessWorkers
from minato._task.runner import WorkerSpec, make_runner
from minato._task.seed import SampleRun
from minato._thread.dataset import bound_to_copies, worker_dataset
from minato._thread.generators import ThreadGenerator, bind_thread_rng
from minato._thread.process_state import ProcessOutput
from minato._thread.torch_threads import limit_thread_intra_op
from minato._thread.worker_info import set_thread_worker_info


def worker_factory(
    spec: WorkerSpec, *, samples: bool = False, processes: ProcessWorkers | None = None
) -> Callable[[int], Callable[[int, Any], Any]]:
    """The `make_worker` the engine calls on each new worker thread.

    Its `run(epoch, (tag, index))` loads one batch (the index list torch's
    batch sampler gave) and returns ``(tag, (sample count, collated batch,
    skipped failures))`` (the batch NOTHING_LOADED when every sample was skipped; for
    an iterable dataset `run(epoch, index)` returns ``(worker id, ...)`` or
    EXHAUSTED), or, with `samples`, loads a run of single samples
    ``[(tag, index), ...]`` and returns them uncollated, ``[(tag, sample),
    ...]``, a skipped one as its `Skipped` record.

    With `processes`, the thread hands its tasks to a worker process of its
    own (see minato._process.workers) when the loader runs on processes; otherwise
    it runs them itself.
    """

    # Captured here, on the training thread: what a worker thread's
    # worker_init_fn redirects is put back to it. Forced worker processes
    # run it in processes of their own: nothing to capture (nor descriptors
    # to copy into the next epoch's fork server).
    on_threads = processes is None or not processes.forced
    output = ProcessOutput() if spec.worker_init_fn is not None and on_threads else None

    def make_worker(worker_id: int) -> Callable[[int, Any], Any]:
        run = make_thread_runner(worker_id)
        # Off the training loop's thread, as torch's pin-memory thread does
        # (a sample-level batch is pinned where it is collated).
        return pinning(run, spec.pin_device) if spec.pin and not samples else run

    def make_thread_runner(worker_id: int) -> Callable[[int, Any], Any]:
        if processes is not None and processes.forced:
            # Never on this thread: no copy, no worker_init_fn here.
            return processes.runner(worker_id, samples, None)
        own_spec, own_generator, begin_run = _isolate_thread(spec, worker_id, output)
        run = make_runner(
            own_spec,
            own_spec.dataset,
            worker_id,
            own_generator,
            samples=samples,
            begin_run=begin_run,
        )
        if processes is None:
            return run
        return processes.runner(worker_id, samples, run)

    return make_worker


class WorkerIds:
    """An epoch's worker ids across the engines that load it: a sample-level
    epoch that hands over to whole batches (minato._loader.iterator) runs
    two pools, one after the other, and an id is never given twice.

    The first engine's workers keep the ids it numbers them by until the
    hand-over; from then on every worker of either engine, the new pool's
    and a replacement the old one still starts, gets the next unused id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._handed_over = False

    def numbered(self, make_worker: Callable[[int], Any]) -> Callable[[int], Any]:
        """The first engine's `make_worker`, its ids kept until the hand-over."""

        def make(worker_id: int) -> Any:
            with self._lock:
                if self._handed_over:
                    worker_id, self._next = self._next, self._next + 1
                else:
                    self._next = max(self._next, worker_id + 1)
            return make_worker(worker_id)

        return make

    def fresh(self, make_worker: Callable[[int], Any]) -> Callable[[int], Any]:
        """The engine handed over to's `make_worker`: every worker a new id."""
        with self._lock:
            self._handed_over = True

        def make(_engine_id: int) -> Any:
            with self._lock:
                worker_id, self._next = self._next, self._next + 1
            return make_worker(worker_id)

        return make


def _isolate_thread(
    spec: WorkerSpec, worker_id: int, output: ProcessOutput | None = None
) -> tuple[WorkerSpec, Any, Callable[[SampleRun | None], None]]:
    """What a worker process would have of its own, for this thread: the
    dataset (a copy that shares the data; a ``worker_init_fn`` that is one
    of its methods bound to the copy, and after which the training
    process's output redirected is put back to `output`), one intra-op
    thread, and the process-wide generators, seeded as torch seeds them;
    its torch generator is also thread_safe_generator(). Returns the spec
    with the thread's own dataset, the context that hands torch's random
    functions the thread's generator, and what seeds the thread's
    generators for one sample."""
    copies: dict[int, Any] = {}
    dataset = worker_dataset(spec.dataset, copies)
    init = bound_to_copies(spec.worker_init_fn, copies)
    if output is not None:
        init = output.keeping(init)
    spec = dataclasses.replace(spec, dataset=dataset, worker_init_fn=init)
    generators = bind_thread_rng(spec.base_seed, worker_id)
    limit_thread_intra_op(1)
    info = _torch_worker.WorkerInfo(
        id=worker_id,
        num_workers=spec.num_workers,
        seed=spec.base_seed + worker_id,
        dataset=dataset,
        rng=generators.worker_rng,
        worker_method="thread",
    )
    set_thread_worker_info(info)
    return spec, ThreadGenerator(generators), generators.begin_run


def collate_thread_info(spec: WorkerSpec, method: WorkerMethod) -> Any:
    """What ``get_worker_info()`` answers on the loader's collate thread
    (minato._loader.collate_stage): torch's collate_fn runs in a worker
    process, where it is that worker's; here worker 0's, over the dataset
    the workers copied."""
    return _torch_worker.WorkerInfo(
        id=0,
        num_workers=spec.num_workers,
        seed=spec.base_seed,
        dataset=spec.dataset,
        rng=None,
        worker_method="multiprocessing" if method.processes else "thread",
    )
