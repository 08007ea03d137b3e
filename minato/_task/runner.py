"""What runs on a minato worker thread: set-up, then one call per task.

The Rust engine calls ``make_worker(worker_id)`` once on each worker thread
and the returned ``run(epoch, index)`` for each task. ``run`` never raises
for a dataset or collate error: it returns torch's ``ExceptionWrapper`` (a
`WorkerError`, formatted off this thread), which the consumer re-raises in
order, as torch does; with ``on_error="skip"`` a
failing sample is left out and its `SampleFailure` handed back beside the
batch (see minato._task.failures). Every result carries a tag (see
minato._loader.resume): the one its index came with for a map-style dataset, the
worker's id (its stream) for an iterable one.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch._utils import ExceptionWrapper

from minato._task.error import WorkerError
from minato._task.failures import (
    NOTHING_LOADED,
    SampleFailure,
    Skipped,
    load_each,
    load_skipping,
    next_skipping,
    split_failures,
)
from minato._task.seed import SampleRun, collate_run
from minato._util.user_code import IN_USER_CODE

if TYPE_CHECKING:
    pass

# Returned by `run` when an iterable dataset's worker has no more data.
EXHAUSTED = object()


def sample_count(data: Any, auto_collation: bool) -> int:
    """Samples in what a fetch collates (or in the index it was given): a
    list of them with auto-collation, one item without."""
    return len(data) if auto_collation else 1


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker thread needs; it holds no reference to the loader or iterator."""

    dataset: Any
    is_iterable: bool
    auto_collation: bool
    collate_fn: Callable[[Any], Any]
    drop_last: bool
    num_workers: int
    base_seed: int
    worker_init_fn: Callable[[int], None] | None
    # For an IterableDataset resumed mid-epoch: batches a worker's stream drops first.
    take_stream_skip: Callable[[int], int] = lambda _stream: 0
    # on_error="skip": a failing sample is left out instead of failing its batch.
    skip_errors: bool = False
    # pin_memory: a batch-level worker pins each batch it delivers, on the
    # given device's behalf (None: the current accelerator's).
    pin: bool = False
    pin_device: str | None = None
    # The nice value worker processes run at (minato._util.priority); None: unchanged.
    nice: int | None = None


# What a worker is, in messages: "process" in a worker process (minato._process.child).
WORKER_NOUN = {"noun": "thread"}


def _where(worker_id: int, index: object = None, *, collating: bool = False) -> str:
    where = f"in DataLoader worker {WORKER_NOUN['noun']} {worker_id}"
    if index is None:
        return where
    what = "sample indices" if isinstance(index, list) else "sample index"
    if collating:
        what = f"collating {what}"
    return f"{where} ({what} {index})"


def _exited(worker_id: int, index: object = None) -> WorkerError:
    """A ``SystemExit`` raised by the user's code (``sys.exit()`` in a
    dataset), as torch reports it: its worker process exits, and the loader
    raises ``RuntimeError``. A thread, or a process, of minato's stays: the
    task fails with that error, the ``SystemExit`` as its cause, and the
    training process goes on as it would after torch's error."""
    exiting = sys.exc_info()[1]
    assert isinstance(exiting, SystemExit), "call inside an except SystemExit block"
    error = RuntimeError(
        f"DataLoader worker {WORKER_NOUN['noun']} {worker_id} exited unexpectedly: "
        f"the dataset's code raised SystemExit({exiting.code!r}) (sys.exit)"
    )
    error.__cause__ = exiting
    return WorkerError(exc_info=(RuntimeError, error, None), where=_where(worker_id, index))


def make_runner(
    spec: WorkerSpec,
    dataset: Any,
    worker_id: int,
    own_generator: contextlib.AbstractContextManager[Any],
    *,
    samples: bool,
    begin_run: Callable[[SampleRun | None], None],
    eager_seed: Callable[[SampleRun], None] | None = None,
) -> Callable[[int, Any], Any]:
    """Runs worker_init_fn, then returns the worker's `run` (see
    minato._loader.workers).

    A map-style task carries its epoch's seed (None where workers keep
    their own streams: batches dealt in turn): the worker's generators are
    then seeded for each sample from it and the sample's position (see
    minato._task.seed), and for a drawing collate from the batch's own
    seed: a whole batch draws what its samples loaded one by one would
    draw. A whole batch of a batch sampler of the user's (whose batches'
    sizes vary: no sample's position is known) draws from the batch's seed.
    `begin_run` hands them each task's `SampleRun`, and `eager_seed`, where
    given, seeds them as each sample starts."""
    # As in torch: a failing worker_init_fn (or iter(dataset)) is
    # reported as the result of the worker's first task.
    init_error: ExceptionWrapper | None = None
    fetcher: _MapFetcher | _IterableFetcher | None = None
    try:
        with own_generator, IN_USER_CODE:
            if spec.worker_init_fn is not None:
                spec.worker_init_fn(worker_id)
            fetcher_type = _IterableFetcher if spec.is_iterable else _MapFetcher
            fetcher = fetcher_type(spec, dataset, worker_id)
    except Exception:
        init_error = WorkerError(where=_where(worker_id))
    except SystemExit:
        init_error = _exited(worker_id)

    def failure() -> ExceptionWrapper | None:
        nonlocal init_error
        if init_error is not None:
            error, init_error = init_error, None
            return error
        if fetcher is None:
            return WorkerError(
                exc_info=(RuntimeError, RuntimeError("worker set-up failed"), None),
                where=_where(worker_id),
            )
        return None

    def seed_collate(run: SampleRun) -> None:
        begin_run(run)
        if eager_seed is not None:
            eager_seed(run)

    def run(epoch: int, task: Any) -> Any:
        tag, index, key, first = (worker_id, task, None, None) if spec.is_iterable else task
        error = failure()
        if error is not None:
            return tag, error
        assert fetcher is not None
        batch_run = per_sample = None
        if key is not None and first is None:
            batch_run = SampleRun(key, [tag], eager_seed)
        elif key is not None:
            # The samples' positions: from `first` on, or listed.
            if isinstance(first, list):
                positions = first
            else:
                positions = list(range(first, first + sample_count(index, spec.auto_collation)))
            per_sample = SampleRun(key, positions, eager_seed)
        begin_run(batch_run or per_sample)
        try:
            with own_generator, IN_USER_CODE:
                if batch_run is not None and eager_seed is not None:
                    eager_seed(batch_run)  # the whole batch draws from the batch's seed
                if per_sample is None:
                    output = fetcher.fetch(epoch, index)
                else:
                    collating = collate_run(key, per_sample.positions[0], eager_seed)
                    output = fetcher.fetch(
                        epoch, index, per_sample, lambda: seed_collate(collating)
                    )
        except SystemExit:
            return tag, _exited(worker_id, None if spec.is_iterable else index)
        return output if output is EXHAUSTED else (tag, output)

    def run_samples(
        epoch: int,
        tagged: list[tuple[int, Any, Any]],
        settle: Callable[[int, Any], Any] | None = None,
    ) -> list[tuple[int, Any]]:
        tags = [tag for tag, _, _ in tagged]
        error = failure()
        if error is not None:
            return [(tag, error) for tag in tags]
        assert isinstance(fetcher, _MapFetcher)
        key = tagged[0][2]
        run = None if key is None else SampleRun(key, tags, eager_seed)
        begin_run(run)
        indices = [index for _, index, _ in tagged]
        try:
            with own_generator, IN_USER_CODE:
                loaded = fetcher.fetch_samples(indices, run, settle)
        except SystemExit:
            return [(tag, _exited(worker_id, indices)) for tag in tags]
        return [
            Skipped(tag, sample) if isinstance(sample, SampleFailure) else (tag, sample)
            for tag, sample in zip(tags, loaded, strict=True)
        ]

    return run_samples if samples else run


class _MapFetcher:
    def __init__(self, spec: WorkerSpec, dataset: Any, worker_id: int) -> None:
        self.dataset = dataset
        self.auto_collation = spec.auto_collation
        self.collate_fn = spec.collate_fn
        self.skip_errors = spec.skip_errors
        self.worker_id = worker_id
        getitems = getattr(dataset, "__getitems__", None)
        self.getitems = getitems if getitems else None

    def fetch(
        self,
        epoch: int,
        index: Any,
        run: SampleRun | None = None,
        seed_collate: Callable[[], None] | None = None,
    ) -> Any:
        """Loads and collates a whole batch. `run`: each sample's seeding,
        moved on before each sample (a ``__getitems__`` call is seeded for
        its first); `seed_collate` seeds the collate's draws."""
        if self.skip_errors:
            return self._fetch_skipping(index, run, seed_collate)
        dataset = self.dataset
        if not self.auto_collation:
            if run is not None:
                run.begin(0)
            try:
                data = dataset[index]
            except Exception:
                return WorkerError(where=_where(self.worker_id, index))
        elif self.getitems is not None:
            if run is not None:
                run.begin(0)
            try:
                data = self.getitems(index)
            except Exception:
                return WorkerError(where=_where(self.worker_id, index))
        else:
            data = []
            for ordinal, i in enumerate(index):
                if run is not None:
                    run.begin(ordinal)
                try:
                    data.append(dataset[i])
                except Exception:
                    return WorkerError(where=_where(self.worker_id, i))
        return self._collate(data, index, [], seed_collate)

    def _fetch_skipping(
        self, index: Any, run: SampleRun | None, seed_collate: Callable[[], None] | None
    ) -> Any:
        indices = index if self.auto_collation else [index]
        loaded = load_skipping(self.dataset, self.getitems, indices, self.worker_id, run)
        data, failures = split_failures(loaded)
        if not data:
            return 0, NOTHING_LOADED, failures
        return self._collate(
            data if self.auto_collation else data[0], index, failures, seed_collate
        )

    def _collate(
        self,
        data: Any,
        index: Any,
        failures: list[SampleFailure],
        seed_collate: Callable[[], None] | None = None,
    ) -> Any:
        try:
            if seed_collate is not None:
                seed_collate()
            batch = self.collate_fn(data)
        except Exception:
            return WorkerError(where=_where(self.worker_id, index, collating=True))
        return sample_count(data, self.auto_collation), batch, failures

    def fetch_samples(
        self,
        indices: list[Any],
        run: SampleRun | None = None,
        settle: Callable[[int, Any], Any] | None = None,
    ) -> list[Any]:
        """Single samples, uncollated; a failing one becomes its ExceptionWrapper
        (its SampleFailure when skipping). `run`: each sample's seeding,
        moved on before the sample is loaded (a ``__getitems__`` call is
        seeded for its first); `settle`: see minato._task.failures.load_each
        (not for ``__getitems__``, whose samples come all at once)."""
        if self.skip_errors:
            return load_skipping(self.dataset, self.getitems, indices, self.worker_id, run, settle)
        if self.getitems is not None:
            if run is not None:
                run.begin(0)
            try:
                return list(self.getitems(indices))
            except Exception:
                return [WorkerError(where=_where(self.worker_id, indices))] * len(indices)
        worker_id = self.worker_id
        return load_each(
            self.dataset,
            indices,
            run,
            lambda index: WorkerError(where=_where(worker_id, index)),
            settle,
        )


class _IterableFetcher:
    """A worker's own stream over an IterableDataset, restarted each epoch."""

    def __init__(self, spec: WorkerSpec, dataset: Any, worker_id: int) -> None:
        self.spec = spec
        self.dataset = dataset
        self.worker_id = worker_id
        self.epoch: int | None = None
        self.iterator = iter(dataset)
        self.ended = False

    def fetch(self, epoch: int, index: Any) -> Any:
        if epoch != self.epoch:
            if self.epoch is not None:
                self.iterator, self.ended = iter(self.dataset), False
            self.epoch = epoch
            # A resumed epoch: drop what this stream delivered before the checkpoint.
            for _ in range(self.spec.take_stream_skip(self.worker_id)):
                if self._next_batch(index) is EXHAUSTED:
                    break
        return self._next_batch(index)

    def _next_batch(self, index: Any) -> Any:
        spec = self.spec
        if self.ended:
            return EXHAUSTED
        if spec.skip_errors:
            return self._next_batch_skipping(index)
        try:
            if spec.auto_collation:
                data = []
                for _ in index:
                    try:
                        data.append(next(self.iterator))
                    except StopIteration:
                        self.ended = True
                        break
                if not data or (spec.drop_last and len(data) < len(index)):
                    return EXHAUSTED
            else:
                try:
                    data = next(self.iterator)
                except StopIteration:
                    self.ended = True
                    return EXHAUSTED
        except Exception:
            return WorkerError(where=_where(self.worker_id))
        return self._collate(data, [])

    def _next_batch_skipping(self, index: Any) -> Any:
        """A batch of the stream's next items that load: a failing item is
        replaced by the one after it, so the batch keeps its size."""
        spec = self.spec
        wanted = len(index) if spec.auto_collation else 1
        items, failures, self.ended = next_skipping(
            self.iterator, wanted, self.worker_id, drop_last=spec.drop_last
        )
        if not items:
            # The stream ended; its last failures still reach the loop first.
            return (0, NOTHING_LOADED, failures) if failures else EXHAUSTED
        return self._collate(items if spec.auto_collation else items[0], failures)

    def _collate(self, data: Any, failures: list[SampleFailure]) -> Any:
        spec = self.spec
        try:
            return sample_count(data, spec.auto_collation), spec.collate_fn(data), failures
        except Exception:
            return WorkerError(where=_where(self.worker_id))
