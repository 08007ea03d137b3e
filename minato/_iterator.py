"""The iterator of a minato DataLoader with worker threads."""

from __future__ import annotations

import atexit
import weakref
from typing import TYPE_CHECKING, Any

from torch._utils import ExceptionWrapper
from torch.utils.data._utils.pin_memory import pin_memory
from torch.utils.data.dataloader import _BaseDataLoaderIter, _DatasetKind

from minato._minato import Engine, SampleEngine
from minato._worker import EXHAUSTED, WorkerSpec, worker_factory

if TYPE_CHECKING:
    from minato.dataloader import DataLoader

# How long ending an iterator early (break, an exception, garbage collection)
# waits for a worker still inside the dataset's code before leaving it to
# finish that call and exit on its own. Idle workers leave at once.
SHUTDOWN_GRACE_S = 1.0
# At interpreter exit, workers get longer: one still running Python code when
# the interpreter finalizes would be killed in the middle of it.
EXIT_GRACE_S = 10.0

_live_iterators: weakref.WeakSet[_ThreadDataLoaderIter] = weakref.WeakSet()


@atexit.register
def _shut_down_all_at_exit() -> None:
    for iterator in list(_live_iterators):
        iterator._shutdown(EXIT_GRACE_S)


class _ThreadDataLoaderIter(_BaseDataLoaderIter):
    """Keeps the engine fed with the sampler's indices and yields what it delivers.

    The sampler is iterated here, on the consumer's thread, as torch does; the
    engine bounds the work in flight to ``prefetch_factor * num_workers``.
    """

    def __init__(self, loader: DataLoader, *, in_order: bool = True) -> None:
        self._in_order = in_order
        self._engine: Engine | SampleEngine | None = None
        super().__init__(loader)
        self._reset(loader, first_iter=True)

    def _worker_spec(self, loader: DataLoader) -> WorkerSpec:
        return WorkerSpec(
            dataset=self._dataset,
            is_iterable=self._dataset_kind == _DatasetKind.Iterable,
            auto_collation=self._auto_collation,
            collate_fn=self._collate_fn,
            drop_last=self._drop_last,
            num_workers=self._num_workers,
            base_seed=int(self._base_seed),
            worker_init_fn=loader.worker_init_fn,
        )

    def _batches_in_flight(self, loader: DataLoader) -> int:
        return max(1, (loader.prefetch_factor or 0) * self._num_workers)

    def _start_engine(self, loader: DataLoader) -> Engine | SampleEngine:
        spec = self._worker_spec(loader)
        return Engine(
            worker_factory(spec),
            EXHAUSTED,
            num_workers=self._num_workers,
            max_in_flight=self._batches_in_flight(loader),
            in_order=self._in_order,
            # Each worker owns a stream of an iterable dataset, so tasks go
            # to workers in turn, as in torch; map-style tasks go to
            # whichever worker is free.
            round_robin=spec.is_iterable,
            shutdown_grace=SHUTDOWN_GRACE_S,
        )

    def _to_batch(self, data: Any) -> Any:
        """What the engine delivered, as the batch to yield."""
        if isinstance(data, ExceptionWrapper):
            data.reraise()
        return data

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        if self._engine is None:
            # First epoch, or a persistent iterator whose workers were stopped
            # (Ctrl-C in a notebook): start them.
            self._engine = self._start_engine(loader)
            _live_iterators.add(self)
        elif not first_iter:
            # A persistent iterator's next epoch: drop what is left of the last one.
            self._engine.new_epoch()
        self._sampler_done = False
        self._submit_ready()

    def _submit_ready(self) -> None:
        engine = self._engine
        if engine is None:
            return
        while not self._sampler_done and engine.can_submit():
            try:
                index = self._next_index()
            except StopIteration:
                self._sampler_done = True
                return
            if not engine.submit(index):
                # Every worker of an iterable dataset is exhausted.
                self._sampler_done = True

    def _next_data(self) -> Any:
        if self._engine is None:
            raise StopIteration  # finished or stopped, as torch's iterator stays
        while True:
            try:
                data = self._engine.next(self._timeout)
            except StopIteration:
                # Nothing pending. An iterable's exhausted workers may have
                # freed slots while the sampler still has indices: refill.
                self._submit_ready()
                if self._engine.pending():
                    continue
                if not self._persistent_workers:
                    self._shutdown(SHUTDOWN_GRACE_S)
                raise
            except KeyboardInterrupt:
                # Leave now: workers still inside the dataset finish on their own.
                self._shutdown(0.0)
                raise
            # Refill before handing the batch over, as torch does: after k
            # batches the sampler has been advanced exactly as far as torch's.
            self._submit_ready()
            data = self._to_batch(data)
            if self._pin_memory:
                data = pin_memory(data, self._pin_memory_device)
            return data

    def _shutdown(self, grace: float) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            self._engine = None
            _live_iterators.discard(self)
            engine.shutdown(grace)

    def __del__(self) -> None:
        self._shutdown(SHUTDOWN_GRACE_S)


class _SampleDataLoaderIter(_ThreadDataLoaderIter):
    """Builds each batch from whichever samples are ready first.

    Workers load single samples (runs of them when samples are cheap); a
    batch of the sampler's next size is assembled from finished samples, fast
    ones first, and collated here. A sample running past the per-sample
    timeout is flagged slow: it finishes in the background, lands in a later
    batch, and a replacement worker keeps the fast samples flowing.
    """

    def _start_engine(self, loader: DataLoader) -> Engine | SampleEngine:
        batch_size = loader.batch_size or 1
        return SampleEngine(
            worker_factory(self._worker_spec(loader), samples=True),
            num_workers=self._num_workers,
            max_samples_in_flight=self._batches_in_flight(loader) * batch_size,
            max_batch_size=batch_size,
            sample_timeout=loader.sample_timeout,
            timeout_warmup=loader.sample_timeout_warmup,
            max_slow_in_flight=(
                self._num_workers if loader.max_slow_samples is None else loader.max_slow_samples
            ),
            shutdown_grace=SHUTDOWN_GRACE_S,
        )

    def _to_batch(self, data: Any) -> Any:
        for sample in data:
            if isinstance(sample, ExceptionWrapper):
                sample.reraise()
        return self._collate_fn(data)
