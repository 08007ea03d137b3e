"""The iterator of a minato DataLoader with worker threads."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils.collate import default_collate
from torch.utils.data.dataloader import (
    _BaseDataLoaderIter,
    _DatasetKind,
    _SingleProcessDataLoaderIter,
)

from minato._loader.collate import fast_default_collate
from minato._loader.collate_stage import EpochSeed, draws_no_random, sample_collator
from minato._loader.device import DeviceStage, Failure, HostBatch
from minato._loader.resume import EpochStream, IterableStream, capture_epoch_rng
from minato._loader.stats import StatsRecorder
from minato._loader.whole_batches import (
    STALL_FLOOR_S,
    SWITCH_AFTER,
    SWITCH_AFTER_DELIVERED,
    SWITCH_ROUNDS_LEFT,
    EpochPace,
    moved_few_and_short,
    stalls,
    whole_pool_start,
)
from minato._loader.workers import WorkerIds, collate_thread_info, worker_factory
from minato._minato import (
    ArenaPool,
    Engine,
    SampleEngine,
    _before_fork,
)
from minato._process.method import WorkerMethod, start_method_of
from minato._process.workers import (
    ProcessWorkers,
    fork_server_ready,
    release_fork_server,
    stop_all,
    warm_up,
)
from minato._task.failures import (
    NOTHING_LOADED,
    SampleFailure,
    Skipped,
    budget_exceeded,
    epoch_samples,
    failure_budget,
    load_skipping,
    next_skipping,
    split_failures,
)
from minato._task.runner import EXHAUSTED, WorkerSpec, sample_count
from minato._task.seed import epoch_seed
from minato._thread.dataset import bound_to_copies, worker_dataset
from minato._util.log import logger
from minato._util.memory import give_back_freed_memory_soon
from minato._util.priority import worker_nice_value
from minato._util.user_code import FORK_QUIET_BOUND_S, out_of_user_code

if TYPE_CHECKING:
    from minato.dataloader import DataLoader

# How long ending an iterator early (break, an exception, garbage collection)
# waits for a worker still inside the dataset's code before leaving it to
# finish that call and exit on its own. Idle workers leave at once.
SHUTDOWN_GRACE_S = 1.0
# At interpreter exit, the time all loaders' workers get in all to finish the
# dataset's code they are in. One still in it after that blocks for good at
# its next GIL take while the process exits, as CPython 3.14 blocks a daemon
# thread (rust/thread_exit.rs); torch terminates its worker processes at once.
EXIT_GRACE_S = 0.5

# How often a running loader checks whether its workers wait on the GIL.
GIL_CHECK_INTERVAL_S = 1.0
# How often worker_method="auto" judges the engine's figures (a stats()
# read, tens of microseconds, only until it decides): a GIL-bound dataset
# shows itself within the first batches, each one more on threads at half
# speed.
METHOD_CHECK_INTERVAL_S = 0.01
# How often a loader back on threads after auto's trial asks whether the
# fork server can go (its worker processes exit as the threads take tasks).
SERVER_RELEASE_CHECK_INTERVAL_S = 0.5
# After a move to processes, the memory the worker threads freed is given
# back this long after (their last tasks done meanwhile).
TRIM_AFTER_MOVE_S = 0.2
# With worker processes, a task costs a round trip (pickling, two socket
# hops), and far more beside many workers, whose threads take the GIL for
# each: samples go to them in runs of at least this long (faster than runs
# of 10 ms at 16 workers on 16 cores, and on 2: benchmarks/RESULTS.md).
PROCESS_RUN_TARGET_S = 0.05
# ...and a replacement for a slow sample costs a process start (a fork, and
# the dataset unpickled): the automatic per-sample timeout is at least this.
PROCESS_MIN_TIMEOUT_S = 0.05

_live_iterators: weakref.WeakSet[_ThreadDataLoaderIter] = weakref.WeakSet()


@atexit.register
def _shut_down_all_at_exit() -> None:
    deadline = time.monotonic() + EXIT_GRACE_S
    for iterator in list(_live_iterators):
        iterator._shutdown(max(0.0, deadline - time.monotonic()))
    stop_all()


def _leave_workers_in_parent() -> None:
    """After ``os.fork``, in the child: every live iterator's worker threads
    stayed in the parent (see ``_ThreadDataLoaderIter._forked``)."""
    for iterator in list(_live_iterators):
        iterator._forked()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_leave_workers_in_parent)
    # A fork waits for minato's threads to finish creating their interpreter
    # thread states: CPython before 3.12 hangs a child forked meanwhile
    # (rust/fork_gate.rs).
    os.register_at_fork(before=_before_fork)


class _Delivery(DeviceStage):
    """What minato's iterators share: delivery bookkeeping (stats, periodic
    log lines, the GIL hint), the collate fast path and the device stage."""

    _pin_memory: bool
    _collate_fn: Any

    def _init_delivery(self, loader: DataLoader) -> None:
        """Call after torch's iterator constructor, before any batch is loaded."""
        self._init_device(loader)
        if self._prefetcher is not None:
            # Copies run asynchronously only from page-locked memory.
            self._pin_memory = True
        if self._collate_fn is default_collate and self._pin_memory:
            # Into page-locked memory at once, instead of torch's stack and
            # then a second copy by pin_memory. Unpinned, torch.stack is as
            # fast (benchmarks/collate.py), so torch's own collate stays.
            self._collate_fn = fast_default_collate(pin=True)
        self._init_reporting(loader)
        self._skip_errors = loader.on_error == "skip"
        self._max_failures = loader.max_failures
        self._over_budget = False

    def _begin_epoch(
        self, loader: DataLoader, epoch_rng: dict[str, Any], *, samples: bool = False
    ) -> None:
        """Starts the epoch's tagged index stream (see minato._loader.resume); call
        after torch made ``_sampler_iter``, before the first index is taken."""
        # Each sample's random draws follow from this seed and its position
        # (minato._task.seed), unless batches are dealt to workers in turn:
        # then each worker keeps its own streams, as torch's do.
        epochs_begun = getattr(self, "_epochs_begun", 0)
        self._epochs_begun = epochs_begun + 1
        seed = None
        if self._num_workers > 0 and not loader.deals_in_turn():
            seed = epoch_seed(int(self._base_seed), epochs_begun)
        self._epoch: EpochStream | IterableStream = loader._progress.begin_epoch(
            loader, self._sampler_iter, epoch_rng, samples=samples, seed=seed
        )
        self._epoch_size = epoch_samples(loader) if self._skip_errors else None
        self._failure_budget = (
            failure_budget(self._max_failures, self._epoch_size) if self._skip_errors else None
        )
        self._over_budget = False

    def _note_skipped(self, skipped: list[tuple[int | None, SampleFailure]]) -> Failure | None:
        """Records samples the failure policy skipped (each once: log, stats,
        the epoch's state); the error that ends the epoch at the first one
        over budget (those after it are not recorded: the epoch is over)."""
        if self._over_budget:
            return None
        budget = self._failure_budget
        for tag, failure in skipped:
            self._epoch.skipped(tag, failure)
            self._recorder.skipped(failure)
            logger.warning("minato: skipped %s", failure.describe())
            failures = self._epoch.failures
            if budget is not None and len(failures) > budget:
                self._over_budget = True
                return Failure(
                    budget_exceeded(self._max_failures, failures, budget, self._epoch_size)
                )
        return None

    def _delivered(self, tags: list[int]) -> None:
        self._epoch.delivered(tags)

    def _epoch_ended(self) -> None:
        self._epoch.ended = True

    def _init_reporting(self, loader: DataLoader) -> None:
        self._recorder: StatsRecorder = loader._stats_recorder
        self._log_interval: float | None = loader.log_interval
        now = time.perf_counter()
        self._next_log = now + (self._log_interval or 0.0)
        self._next_gil_check = now + GIL_CHECK_INTERVAL_S

    def _report(self, samples: int, waited: float) -> None:
        self._recorder.delivered(samples, waited)
        now = time.perf_counter()
        if self._log_interval is not None and now >= self._next_log:
            self._next_log = now + self._log_interval
            logger.info(self._recorder.snapshot().summary())
        if now >= self._next_gil_check:
            self._next_gil_check = now + GIL_CHECK_INTERVAL_S
            self._recorder.check_gil()


class _CallingThreadDataLoaderIter(_Delivery, _SingleProcessDataLoaderIter):
    """torch's single-process iterator (num_workers=0), counting what it delivers."""

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._init_delivery(loader)
        # torch's samplers draw on their first batch, after torch's set-up.
        self._begin_epoch(loader, capture_epoch_rng(loader))
        self._recorder.engine_started(None)
        self._batch_samples = 0
        self._tags: list[int] = []
        self._replay_pending = isinstance(self._epoch, IterableStream)
        fetcher = self._dataset_fetcher
        collate, auto_collation = self._collate_fn, fetcher.auto_collation

        def counting_collate(data: Any) -> Any:
            self._batch_samples = sample_count(data, auto_collation)
            return collate(data)

        fetcher.collate_fn = counting_collate
        self._over_budget_failure: Failure | None = None
        self._replaying = False
        if self._skip_errors:
            self._dataset_fetcher = _SkippingFetcher(fetcher, self._skip_failures)

    def _next_index(self) -> Any:
        self._tags, index = self._epoch.next_batch()
        return index

    def _replay_stream(self) -> None:
        """A resumed IterableDataset: drop the batches delivered before the checkpoint."""
        self._replay_pending = False
        assert isinstance(self._epoch, IterableStream)
        self._replaying = True
        try:
            for _ in range(self._epoch.take_skip(0)):
                try:
                    _SingleProcessDataLoaderIter._next_data(self)
                except StopIteration:
                    raise
                except Exception:
                    pass  # it failed the first time too, and counted as delivered
        finally:
            self._replaying = False

    def _next_host_data(self) -> HostBatch:
        if self._over_budget:
            raise StopIteration
        started = time.perf_counter()
        while True:
            self._tags = []
            try:
                if self._replay_pending:
                    self._replay_stream()
                data = _SingleProcessDataLoaderIter._next_data(self)
            except StopIteration:
                raise
            except _NothingLoaded:
                data = NOTHING_LOADED
            except Exception as error:
                # As torch: the batch is used up, the error raised unwrapped.
                data = Failure(error)
            else:
                # Loading happens on this thread: all of it is time the loop waited.
                self._report(self._batch_samples, time.perf_counter() - started)
            tags = self._tags_of_batch()
            over_budget, self._over_budget_failure = self._over_budget_failure, None
            if over_budget is not None:
                return tags, over_budget
            if data is NOTHING_LOADED:
                # Every sample of the batch was skipped: go on to the next one.
                self._delivered(tags)
                continue
            return tags, data

    def _tags_of_batch(self) -> list[int]:
        # An iterable dataset's one stream (this thread's) is stream 0.
        return [0] if isinstance(self._epoch, IterableStream) else self._tags

    def _skip_failures(self, failures: list[SampleFailure]) -> None:
        if self._replaying:
            return  # reported before the checkpoint, and kept in its state
        tag = self._tags[0] if self._tags else None
        over_budget = self._note_skipped([(tag, failure) for failure in failures])
        if over_budget is not None:
            self._over_budget_failure = over_budget


class _NothingLoaded(Exception):
    """Every sample of a batch was skipped (on_error="skip", num_workers=0)."""


class _SkippingFetcher:
    """torch's fetcher for ``num_workers=0``, with ``on_error="skip"``: a
    failing sample is left out (an IterableDataset's is replaced by the
    stream's next item) and handed to ``on_skip``."""

    def __init__(self, fetcher: Any, on_skip: Any) -> None:
        self.fetcher = fetcher
        self.on_skip = on_skip
        getitems = getattr(fetcher.dataset, "__getitems__", None)
        self.getitems = getitems if getitems else None
        self.is_iterable = hasattr(fetcher, "dataset_iter")

    def fetch(self, index: Any) -> Any:
        fetcher = self.fetcher
        batched = fetcher.auto_collation
        if self.is_iterable:
            if fetcher.ended:
                raise StopIteration
            wanted = len(index) if batched else 1
            data, failures, fetcher.ended = next_skipping(
                fetcher.dataset_iter, wanted, None, drop_last=fetcher.drop_last
            )
            if not data and not failures:
                raise StopIteration
        else:
            indices = index if batched else [index]
            loaded = load_skipping(fetcher.dataset, self.getitems, indices, None)
            data, failures = split_failures(loaded)
        self.on_skip(failures)
        if not data:
            raise _NothingLoaded
        return fetcher.collate_fn(data if batched else data[0])


class _ThreadDataLoaderIter(_Delivery, _BaseDataLoaderIter):
    """Keeps the engine fed with the sampler's indices and yields what it delivers.

    The sampler is iterated here, on the consumer's thread, as torch does; the
    engine bounds the work in flight to ``prefetch_factor * num_workers``.
    """

    def __init__(self, loader: DataLoader, *, in_order: bool = True) -> None:
        self._in_order = in_order
        self._engine: Engine | SampleEngine | None = None
        # A sample-level epoch's engine delivering the batches it was given
        # before the epoch goes on in whole batches (see
        # _SampleDataLoaderIter._switch_to_whole); `_engine` too till then.
        self._draining: SampleEngine | None = None
        self._processes: ProcessWorkers | None = None
        self._method: WorkerMethod = loader._worker_method
        self._next_method_check = 0.0
        # Whether `_fix_pool` fixed the engine's pool (see `_release_pool`).
        self._pool_fixed = False
        # When the memory the worker threads freed is given back, after a move
        # to processes (see minato._util.memory).
        self._trim_after: float | None = None
        # Set in a fork child whose parent ran this iterator's workers.
        self._workers_in_parent = False
        carried, loader._carried_iteration = loader._carried_iteration, None
        generator = loader.generator if loader.generator is not None else torch.default_generator
        drawn_from = generator.get_state() if carried is not None else None
        super().__init__(loader)
        if carried is not None:
            # In place of a persistent iterator that no longer fitted: torch
            # would have gone on with that one, drawing no base seed again.
            generator.set_state(drawn_from)
            self._base_seed, self._epochs_begun = carried
        # The loader, to start workers again in a fork child. A persistent
        # iterator is held by its loader: a strong reference back would make
        # a cycle that only the garbage collector frees, workers running
        # until it does.
        self._loader: Callable[[], DataLoader | None] = (
            weakref.ref(loader) if self._persistent_workers else lambda: loader
        )
        self._init_delivery(loader)
        self._reset(loader, first_iter=True)

    def carried(self) -> tuple[int, int]:
        """What an iterator replacing this persistent one goes on from: its
        base seed and the epochs it began."""
        return int(self._base_seed), getattr(self, "_epochs_begun", 0)

    @property
    def kind(self) -> tuple[type, bool]:
        """Its class and whether whole batches keep the sampler's order (see
        DataLoader._iterator_kind)."""
        return type(self), self._in_order

    def reusable(self) -> bool:
        """Whether a persistent iterator can run the loader's next epoch
        (given that its kind fits)."""
        return True

    def _worker_spec(self, loader: DataLoader) -> WorkerSpec:
        # The dataset as it is as the workers start: every worker copies this
        # snapshot, one added later too, as torch's workers (persistent ones
        # for the loader's life) all hold the dataset of their start.
        copies: dict[int, Any] = {}
        snapshot = worker_dataset(self._dataset, copies)
        return WorkerSpec(
            dataset=snapshot,
            is_iterable=self._dataset_kind == _DatasetKind.Iterable,
            auto_collation=self._auto_collation,
            collate_fn=self._collate_fn,
            drop_last=self._drop_last,
            num_workers=self._num_workers,
            base_seed=int(self._base_seed),
            worker_init_fn=bound_to_copies(loader.worker_init_fn, copies),
            take_stream_skip=loader._progress.take_stream_skip,
            skip_errors=self._skip_errors,
            pin=self._pin_memory,
            pin_device=self._pin_memory_device or None,
            nice=worker_nice_value(loader.worker_nice),
        )

    def _adaptive(self, loader: DataLoader) -> bool:
        """Whether the pool resizes: a worker dealt its own batches keeps its
        place. On processes only with ``max_workers`` given: each process
        costs a start and memory, which the controller's trials would pay
        over and over; the pool then keeps ``num_workers``, as torch's."""
        if loader.deals_in_turn() or not loader.adaptive:
            return False
        return not self._method.wants_processes or loader.max_workers is not None

    def _starting_workers(self, loader: DataLoader) -> int:
        """num_workers, or where the adaptive controller settled last epoch."""
        learned = self._recorder.learned_workers
        adaptive = self._adaptive(loader)
        return learned if adaptive and learned is not None else self._num_workers

    def _max_workers(self, loader: DataLoader) -> int | None:
        """The adaptive pool's bound, or None for a fixed pool."""
        return loader.effective_max_workers() if self._adaptive(loader) else None

    def _batches_in_flight(self, loader: DataLoader) -> int:
        return max(1, (loader.prefetch_factor or 0) * self._starting_workers(loader))

    def _process_workers(self, loader: DataLoader, spec: WorkerSpec) -> ProcessWorkers | None:
        """The engine's worker processes, where the loader may use them."""
        method = self._method
        method.restart_window()
        if method.decided and not method.wants_processes:
            return None
        if method.wants_processes and method.fresh is None and not method.forks_at_start:
            # Its workers start now: from a server that shares this
            # process's pages as they are (one that has come to hold those
            # let go since it was forked is forked again, see warm_up).
            warm_up(dataset=spec.dataset)
        workers = ProcessWorkers(
            spec,
            method,
            collate_fn=loader.collate_fn,
            hard_timeout=loader.sample_hard_timeout,
            per_task_switch=not loader.deals_in_turn(),
            start_method=start_method_of(loader.multiprocessing_context),
        )
        if method.requested == "multiprocessing" and method.fresh is not None:
            # multiprocessing_context="spawn" (or "forkserver"): from a
            # fresh interpreter, as torch's.
            workers.start_fresh()
        elif method.forks_at_start:
            # Forked from this process as it is now, as torch forks its
            # workers at iter(): its module globals, its settings, the
            # dataset unpickled (an open file, a lock included).
            workers.inherit_spec(self._starting_workers(loader))
        # Where they are, the shared server, if no other loader needs it,
        # goes once the workers it forked for an earlier epoch have left.
        method.forked_since = method.forks_at_start
        if method.decided_before and not method.processes:
            # An earlier loader's decision: the workers start on processes,
            # as forced ones do. Threads loading beside the starts slowed
            # them (the GIL) and this loader's first epoch with them
            # (benchmarks/RESULTS.md, session 36). Where they are not forked
            # from this process (a fresh server asked for), the spec is
            # pickled here, before any worker thread runs: one that cannot
            # be keeps threads.
            why = workers.check_picklable()
            if why is not None:
                method.cannot_use_processes(why)
                workers.close()
                release_fork_server()
                return None
            method.activate(trial=False)
        return workers

    def _start_engine(self, loader: DataLoader) -> Engine | SampleEngine:
        spec = self._worker_spec(loader)
        self._processes = self._process_workers(loader, spec)
        return Engine(
            worker_factory(spec, processes=self._processes),
            EXHAUSTED,
            num_workers=self._starting_workers(loader),
            max_in_flight=self._batches_in_flight(loader),
            max_workers=self._max_workers(loader),
            in_order=self._in_order,
            # Tasks go to workers in turn, as in torch, where the worker
            # decides what is delivered (see deals_in_turn); otherwise to
            # whichever worker is free.
            round_robin=loader.deals_in_turn(),
            shutdown_grace=SHUTDOWN_GRACE_S,
        )

    def _unpack(self, engine: Any, data: Any) -> tuple[list[int], int, Any, list[Any]]:
        """What `engine` delivered, as `_to_batch` gives it."""
        return self._to_batch(data)

    def _retire_draining(self) -> None:
        """The engine handed over from delivered its last batch: it stops."""

    def _to_batch(self, data: Any) -> tuple[list[int], int, Any, list[Any]]:
        """What the engine delivered, as (tags, sample count, the batch or its
        Failure, the samples skipped as (tag, SampleFailure)); the batch is
        NOTHING_LOADED when every sample was skipped.

        A worker returns ``(tag, payload)``: the batch's tag for a map-style
        dataset, the worker's stream for an iterable one."""
        tag, payload = data
        if isinstance(payload, ExceptionWrapper):
            return [tag], 0, Failure(payload), []
        samples, batch, failures = payload
        return [tag], samples, batch, [(tag, failure) for failure in failures]

    def _engine_skipped(self) -> list[tuple[int | None, SampleFailure]]:
        """Samples the engine skipped outside any batch (the sample-level engine's)."""
        return []

    def _close_epoch(self) -> None:
        """The sampler is exhausted: no batch follows the ones submitted."""

    def _samples_reordered(self) -> bool:
        return False

    def _epoch_completed(self) -> None:
        """The epoch's every batch was delivered."""

    def _judge_pace(self, pace: EpochPace, samples: int, waited: float) -> None:
        """Counts a batch of whole samples; a wait on it that a late sample
        would have made sends the loader's next epochs back to single samples."""
        if pace.add() and waited > STALL_FLOOR_S:
            fetch_p50 = self._recorder.snapshot().fetch_p50
            loader = self._loader()
            if loader is not None and stalls(waited, samples, fetch_p50):
                loader._whole_batches.stalled(waited)

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        epoch_rng = capture_epoch_rng(loader)
        super()._reset(loader, first_iter)
        # Decided as each epoch starts: a batch sampler swapped in since is the user's.
        own_batches = self._auto_collation and loader._batches_from_own_sampler()
        self._samples_per_batch: int | None = loader.batch_size if own_batches else None
        self._begin_epoch(loader, epoch_rng, samples=self._samples_reordered())
        if self._engine is None:
            # First epoch, or a persistent iterator whose workers were stopped
            # (Ctrl-C in a notebook) or are in the parent of a fork: start them.
            self._workers_in_parent = False
            self._engine = self._start_engine(loader)
            if self._processes is not None:
                # Auto's evidence counts from the workers' start: a GIL-bound
                # dataset shows itself in the first batch (see CLEAR_WINDOW_S).
                self._method.restart_window(self._engine.stats())
            self._recorder.engine_started(self._engine)
            _live_iterators.add(self)
        elif not first_iter:
            # A persistent iterator's next epoch: drop what is left of the last one.
            self._engine.new_epoch()
            if self._processes is not None and self._processes.arenas is not None:
                self._processes.arenas.new_epoch()  # its positions start again
        self._sampler_done = False
        self._submit_ready()

    def _submit_ready(self) -> None:
        engine = self._engine
        if engine is None:
            return
        while not self._sampler_done and self._can_submit(engine):
            try:
                submitted = self._submit_next(engine)
            except StopIteration:
                self._sampler_done = True
                self._close_epoch()
                return
            if not submitted:
                # Every worker of an iterable dataset is exhausted.
                self._sampler_done = True

    def _can_submit(self, engine: Any) -> bool:
        return bool(engine.can_submit())

    def _submit_next(self, engine: Any) -> bool:
        """Submits the epoch's next batch; StopIteration when there is none."""
        tags, index = self._epoch.next_batch()
        return self._submit(engine, tags, index)

    def _submit(self, engine: Any, tags: list[int], index: Any) -> bool:
        count = sample_count(index, self._auto_collation)
        if tags:
            # Batch k of torch's BatchSampler holds the epoch's samples from
            # k * batch_size on: each draws as it would loaded on its own.
            size = self._samples_per_batch
            index = (tags[0], index, self._epoch_seed(), None if size is None else tags[0] * size)
        return bool(engine.submit(index, count))

    def _epoch_seed(self) -> int | None:
        epoch = self._epoch
        return epoch.seed if isinstance(epoch, EpochStream) else None

    def _next_host_data(self) -> HostBatch:
        if self._over_budget:
            self._end_epoch_early()
        if self._engine is None and self._workers_in_parent:
            self._continue_in_child()
        if self._engine is None:
            raise StopIteration  # finished or stopped, as torch's iterator stays
        asked = time.perf_counter()
        while True:
            engine = self._draining if self._draining is not None else self._engine
            assert engine is not None
            try:
                data = engine.next(self._timeout)
            except StopIteration:
                if engine is self._draining:
                    self._retire_draining()
                    continue
                over_budget = self._note_skipped(self._engine_skipped())
                if over_budget is not None:
                    return [], over_budget
                # Nothing pending. An iterable's exhausted workers may have
                # freed slots while the sampler still has indices: refill.
                self._submit_ready()
                if self._engine.pending():
                    continue
                self._epoch_completed()
                if not self._persistent_workers:
                    self._shutdown(SHUTDOWN_GRACE_S)
                raise
            waited = time.perf_counter() - asked
            tags, samples, data, skipped = self._unpack(engine, data)
            loaded = data is not NOTHING_LOADED and not isinstance(data, Failure)
            if self._processes is not None and loaded:
                # Before the refill: where the workers move to processes now,
                # the batch submitted next is theirs, not a thread's beside
                # the training loop.
                self._watch_method(waited, samples)
            # Refill before handing the batch over, as torch does: after k
            # batches the sampler has been advanced exactly as far as torch's.
            self._submit_ready()
            over_budget = self._note_skipped(skipped + self._engine_skipped())
            if over_budget is not None:
                return tags, over_budget
            if data is NOTHING_LOADED:
                # Every sample of the batch was skipped: go on to the next one.
                self._delivered(tags)
                continue
            if isinstance(data, Failure):
                return tags, data
            self._report(samples, waited)
            # Pinned already, off this thread (minato._loader.collate_stage).
            return tags, data

    def _watch_method(self, waited: float, samples: int) -> None:
        """worker_method="auto": measures, decides, and moves the workers to
        processes once the fork server is up (see minato._process.method)."""
        method, processes = self._method, self._processes
        assert processes is not None
        now = time.perf_counter()
        if method.batch_received(now, waited, samples) == "revert":
            self._off_processes()
            self._release_pool()
            return
        if self._trim_after is not None and now >= self._trim_after:
            self._trim_after = None
            give_back_freed_memory_soon()
        if method.wants_processes and not method.processes:
            self._move_when_ready(now)
            return
        if method.decided:
            if (method.left_processes or method.forked_since) and now >= self._next_method_check:
                self._next_method_check = now + SERVER_RELEASE_CHECK_INTERVAL_S
                if release_fork_server():
                    method.left_processes = False
            return
        if method.wants_probe(now):
            method.probe()
        if now < self._next_method_check or self._engine is None:
            return
        self._next_method_check = now + METHOD_CHECK_INTERVAL_S
        verdict = method.observe(self._engine.stats(), can_trial=processes.per_task_switch)
        if verdict is None:
            if method.decided and not method.wants_processes:
                # Threads for good, before any worker process ran.
                release_fork_server()
                self._release_pool()
            return
        # Threads that the GIL runs one at a time load little meanwhile, and
        # take the GIL from this thread for a switch interval at each of its
        # turns: the fork, the spec's pickle and the move ran several times
        # slower beside them (benchmarks/RESULTS.md, session 36). They wait
        # at the door to the user's code until the workers have moved.
        serialised = verdict == "move" and method.threads_serialised
        with out_of_user_code(FORK_QUIET_BOUND_S) if serialised else contextlib.nullcontext():
            # The fork server first, from this thread: the dataset's large
            # arrays and lists go to worker processes as references to its
            # memory only once it has them (minato._process.inherit), so the
            # spec is pickled after, off this thread; a spec that cannot be
            # is found on a later batch (above).
            warm_up(dataset=processes.spec.dataset)
            processes.prepare()
            # Once auto decided on processes, threads whose Python takes the
            # GIL gain nothing from more of them (a PIL pipeline's pool grew
            # at the start, its epoch slower than on num_workers,
            # benchmarks/RESULTS.md): the pool keeps the size processes will
            # have, from now on. Not on a lean ("warm"): a borderline GIL
            # delay leans for up to a second before threads are kept, and an
            # I/O pool held at num_workers that long ran its first epochs at
            # a fraction of its rate (session 25).
            if verdict == "move":
                self._fix_pool()
            wait = method.move_wait()
            if verdict == "move" and wait > 0:
                # A loop that sets the pace runs its next step beside the
                # threads unless the workers move now: worth a wait for the
                # spec's pickle, up to about such a step.
                processes.wait_prepared(wait)
                self._move_when_ready(now)

    def _move_when_ready(self, now: float) -> None:
        """Auto decided on processes: the workers hand their next tasks to
        processes once the spec is pickled and the fork server ready."""
        method, processes = self._method, self._processes
        assert processes is not None
        # The spec is pickled off this thread (ProcessWorkers.prepare).
        modules = processes.prepared()
        if modules is None:
            if processes.unpicklable is not None:
                method.cannot_use_processes(processes.unpicklable)
                release_fork_server()
                self._release_pool()
            return
        if fork_server_ready(modules) and method.ready_for_processes():
            loader = self._loader()
            in_flight = 0 if loader is None else self._batches_in_flight(loader)
            # Only a loader whose workers move between tasks can go back.
            method.activate(in_flight, trial=processes.per_task_switch)
            self._on_processes()
            # By then the threads' last tasks are done.
            self._trim_after = now + TRIM_AFTER_MOVE_S
        elif method.decided:
            # The server not ready yet: its imports under way (asking again
            # for them does nothing), or it failed to start or to import
            # them, and is started and asked again here.
            warm_up(modules)

    def _on_processes(self) -> None:
        """The workers now hand their tasks to processes: the pool stops
        resizing and keeps num_workers (see `_adaptive`)."""
        self._fix_pool()

    def _fix_pool(self) -> None:
        loader = self._loader()
        if self._engine is None or loader is None or loader.max_workers is not None:
            return
        self._engine.fix_workers(self._num_workers)
        self._pool_fixed = True

    def _release_pool(self) -> None:
        """Auto kept threads for good after `_fix_pool` (the signs pointed to
        processes, or a trial ran on them): an adaptive pool resizes again.
        A persistent loader's pool otherwise kept num_workers for its life:
        an I/O dataset's epochs ran at torch's rate, a fraction of its grown
        pool's (benchmarks/RESULTS.md, session 25)."""
        loader = self._loader()
        if not self._pool_fixed or self._engine is None or loader is None:
            return
        self._pool_fixed = False
        if self._adaptive(loader):
            self._engine.adapt_workers()

    def _off_processes(self) -> None:
        """The trial found processes slower: the workers run their next tasks
        themselves (each stops its process first, see ProcessWorkers.runner)."""

    def _end_epoch_early(self) -> None:
        """After the failure budget's error: the epoch is over."""
        if not self._persistent_workers:
            self._shutdown(SHUTDOWN_GRACE_S)
        raise StopIteration

    def _shutdown(self, grace: float) -> None:
        # An engine emptying before a hand-over is still the iterator's engine.
        self._draining = None
        engine = getattr(self, "_engine", None)
        if engine is not None:
            self._engine = None
            _live_iterators.discard(self)
            engine.shutdown(grace)
            self._recorder.engine_stopped(engine)
        processes = getattr(self, "_processes", None)
        if processes is not None:
            self._processes = None
            processes.close()

    def _forked(self) -> None:
        """In a fork child, right after the fork: the engine's threads
        stayed in the parent. The engine is dropped without a call into it
        (the Rust side leaks itself in a child: joining threads that are not
        there, or taking a lock one of them held, would wait for ever); the
        next use starts workers in this process."""
        engine, self._engine = self._engine, None
        self._draining = None  # the same engine
        # Worker processes belong to the parent (each checks its owner's pid).
        self._processes = None
        if engine is None:
            return
        _live_iterators.discard(self)
        self._recorder.engine_lost(engine)
        self._workers_in_parent = True

    def _continue_in_child(self) -> None:
        """The first ``next()`` in a fork child on an iterator whose workers
        are in the parent. Between epochs of a persistent iterator it ends,
        as it would have in the parent (``iter(loader)`` starts workers for
        the next epoch). Mid-epoch, a map-style dataset's epoch goes on with
        workers of this process: the batches the parent's workers held and
        had not delivered are loaded again first, then the sampler goes on.
        An IterableDataset's streams lived in the parent's workers and cannot
        go on: RuntimeError."""
        if self._epoch.ended:
            self._workers_in_parent = False
            return
        loader = self._loader()
        if loader is None or isinstance(self._epoch, IterableStream):
            what = (
                "its DataLoader is gone"
                if loader is None
                else "an IterableDataset's streams were in those threads"
            )
            raise RuntimeError(
                "this DataLoader iterator was in the middle of an epoch when the process "
                "forked; its worker threads stayed in the parent process, and it cannot "
                f"continue the epoch here ({what}). Call iter() on the DataLoader in this "
                "process (or create the DataLoader here) to start an epoch with workers of "
                "its own."
            )
        self._workers_in_parent = False
        self._epoch.requeue_pending()
        self._engine = self._start_engine(loader)
        self._recorder.engine_started(self._engine)
        _live_iterators.add(self)
        self._sampler_done = False
        self._submit_ready()

    def __del__(self) -> None:
        self._shutdown(SHUTDOWN_GRACE_S)


class _WholeBatchDataLoaderIter(_ThreadDataLoaderIter):
    """A reordering loader's whole batches, in order, once an epoch of single
    samples moved none (see minato._loader.whole_batches): the same batches
    and draws, at a task per batch. A wait on a batch as long as a late
    sample would have made sends the loader's next epochs back to single
    samples."""

    def __init__(self, loader: DataLoader, *, in_order: bool = True) -> None:
        super().__init__(loader, in_order=True)

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        # Until every worker delivered its first batch, the pace is their start.
        self._pace = EpochPace(settling=loader.num_workers)
        super()._reset(loader, first_iter)

    def _epoch_completed(self) -> None:
        loader = self._loader()
        if loader is not None:
            loader._whole_batches.whole_epoch_ended(self._pace.batches, self._pace.spent)

    def _report(self, samples: int, waited: float) -> None:
        super()._report(samples, waited)
        self._judge_pace(self._pace, samples, waited)


class _SampleDataLoaderIter(_ThreadDataLoaderIter):
    """Builds each batch from whichever samples are ready first.

    Workers load single samples (runs of them when samples are cheap); a
    batch of the sampler's next size is assembled from finished samples, fast
    ones first, and collated (and pinned) on the engine's collate thread
    (minato._loader.collate_stage): this thread only takes finished batches. A
    sample running past the per-sample timeout is flagged slow: it finishes
    in the background, lands in a later batch, and a replacement worker
    keeps the fast samples flowing.
    """

    def _start_engine(self, loader: DataLoader) -> Engine | SampleEngine:
        engine = self._start_sample_engine(loader)
        if self._method.processes:
            # Before the first epoch's prefetch goes out: its tasks are sized
            # for processes' round trips (rust/engine/sample_scheduler.rs).
            engine.set_task_costs(PROCESS_RUN_TARGET_S, PROCESS_MIN_TIMEOUT_S)
        return engine

    def _start_sample_engine(self, loader: DataLoader) -> SampleEngine:
        batch_size = loader.batch_size or 1
        # Kept for the engine an epoch may hand over to (`_switch_to_whole`):
        # its workers start from the same snapshot of the dataset.
        spec = self._spec = self._worker_spec(loader)
        self._processes = self._process_workers(loader, spec)
        if self._processes is not None and self._collate_fn is default_collate:
            # Samples from worker processes are then stacked from their
            # slots, never made tensors one by one (minato._loader.collate).
            self._collate_fn = fast_default_collate(pin=self._pin_memory)
        if self._processes is not None:
            self._processes.keep_leaves = getattr(self._collate_fn, "takes_slot_leaves", False)
            if self._processes.keep_leaves and not self._pin_memory:
                # Samples may be written into their places in their batch:
                # a batch whose samples kept them is handed out as it lies.
                self._processes.arenas = ArenaPool(batch_size)
        # A user's collate_fn gets samples from worker processes still
        # pickled, to be made on the thread that collates them.
        opens_samples = self._opens_samples = (
            self._processes is not None and not self._processes.keep_leaves
        )
        self._worker_ids = WorkerIds()
        return SampleEngine(
            self._worker_ids.numbered(
                worker_factory(spec, samples=True, processes=self._processes)
            ),
            sample_collator(
                self._collate_fn,
                pin=self._pin_memory,
                device=self._pin_memory_device or None,
                base_seed=int(self._base_seed),
                opens_samples=opens_samples,
                epoch_seed=self._collated_epoch,
                # Never a closure over this iterator: the engine holds the
                # collator, and a cycle through it is never collected.
                worker_info=functools.partial(collate_thread_info, spec, self._method),
            ),
            # A cheap batch of torch's default_collate may be collated here:
            # the collate thread's GIL hand-over would cost this thread more.
            collate_here=(
                sample_collator(
                    self._collate_fn,
                    pin=False,
                    device=None,
                    own_thread=False,
                    opens_samples=opens_samples,
                )
                if not self._pin_memory and draws_no_random(self._collate_fn)
                else None
            ),
            collate_anywhere=self._collates_anywhere(self._method.processes),
            skipped_type=Skipped,
            error_type=ExceptionWrapper,
            # in_order=None: the sampler's order, but for a sample that runs
            # late; in_order=False: whichever samples finish first.
            in_sequence=loader.in_order_given() is None,
            drop_last=self._drop_last,
            num_workers=self._starting_workers(loader),
            max_workers=self._max_workers(loader),
            max_samples_in_flight=self._batches_in_flight(loader) * batch_size,
            max_batch_size=batch_size,
            sample_timeout=loader.sample_timeout,
            timeout_warmup=loader.sample_timeout_warmup,
            max_slow_in_flight=(
                self._starting_workers(loader)
                if loader.max_slow_samples is None
                else loader.max_slow_samples
            ),
            shutdown_grace=SHUTDOWN_GRACE_S,
        )

    def _on_processes(self) -> None:
        super()._on_processes()
        if isinstance(self._engine, SampleEngine):
            self._engine.set_task_costs(PROCESS_RUN_TARGET_S, PROCESS_MIN_TIMEOUT_S)
            self._engine.set_collate_anywhere(self._collates_anywhere(on_processes=True))

    def _off_processes(self) -> None:
        super()._off_processes()
        if isinstance(self._engine, SampleEngine):
            self._engine.set_collate_anywhere(self._collates_anywhere(on_processes=False))

    def _begin_epoch(
        self, loader: DataLoader, epoch_rng: dict[str, Any], *, samples: bool = False
    ) -> None:
        super()._begin_epoch(loader, epoch_rng, samples=samples)
        if not hasattr(self, "_collated_epoch"):
            self._collated_epoch = EpochSeed()
        self._collated_epoch.seed = self._epoch_seed()

    def _collates_anywhere(self, on_processes: bool) -> bool:
        """Whether the worker completing a batch collates it, as torch's
        workers do, rather than the one collate thread, which gets a core as
        seldom as any of many workers (benchmarks/RESULTS.md: at 32 workers,
        batch 256, with the cores busy, the defaults ran at half torch's
        rate). A collate computes the same on any thread where it draws no
        random numbers, or draws from generators seeded for each batch (an
        epoch whose samples are seeded, see EpochSeed). Where workers are
        processes, a user's collate_fn keeps the collate thread (their
        samples are made there, not on the worker threads), and so does
        minato's fast collate (the default's where workers may be
        processes): it stacks the samples from their slots with the GIL
        released, and taking it back among 32 workers slowed them."""
        no_random = draws_no_random(self._collate_fn)
        if not on_processes:
            return no_random or self._collated_epoch.seed is not None
        slot_leaves = getattr(self._collate_fn, "takes_slot_leaves", False)
        return no_random and not self._opens_samples and not slot_leaves

    def _samples_reordered(self) -> bool:
        return True

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        if self._handed_over:
            # Never so far: a persistent iterator that handed over is
            # replaced (`reusable`). Its next epoch starts on single samples.
            self._shutdown(SHUTDOWN_GRACE_S)
            self._handed_over = False
            self._whole_pace = None
        self._moved_before = self._recorder.snapshot().moved_samples
        self._pace = EpochPace(settling=loader.num_workers)
        # Whether this epoch may still hand over to whole batches.
        self._may_switch = not self._skip_errors and loader._whole_batches.eligible(loader)
        # What a hand-over compares whole batches with: the loop's pace from
        # its first batch on. On single samples the pool's start delays that
        # first batch alone (which no pace counts); waiting for another of
        # every worker's kept the epoch on single samples twice as long
        # (benchmarks/RESULTS.md, session 19).
        self._handover_pace = EpochPace(settling=0)
        super()._reset(loader, first_iter)
        # When the epoch began and its first batch came, and the samples the
        # pool had loaded by then (see `_loading_pace`).
        self._loaded_marks: list[tuple[float, int]] = []
        if self._may_switch and isinstance(self._engine, SampleEngine):
            self._loaded_marks.append(self._loaded_mark(self._engine.stats()))
        if self._method.processes:
            self._on_processes()

    # Set once an epoch hands over to whole batches...
    _handed_over = False
    # ...and, once their pool runs, the loop's pace on them.
    _whole_pace: EpochPace | None = None

    def reusable(self) -> bool:
        return not self._handed_over

    def _epoch_completed(self) -> None:
        loader = self._loader()
        if loader is None or not loader._whole_batches.eligible(loader):
            return
        choice = loader._whole_batches
        figures = self._recorder.snapshot()
        moved = figures.moved_samples - self._moved_before
        whole = self._whole_pace
        if self._handed_over:
            # Few or none moved before the hand-over, none that whole batches
            # would have waited on; a sample the old engine moved as it
            # emptied says nothing of whole batches. They are judged
            # on as many batches as the single samples were, at least.
            if whole is not None and whole.batches >= self._handover_pace.batches:
                choice.whole_epoch_ended(whole.batches, whole.spent)
        else:
            # The engine's figures, read once for both judgements.
            live = self._sample_engine_figures()
            few = bool(moved) and self._moved_few_and_short(moved, figures.fetch_p50, live) is True
            loading = None if live is None else self._loading_pace(live)
            choice.samples_epoch_ended(moved, self._pace.batches, self._pace.spent, few, loading)

    def _moved_few_and_short(
        self, moved: int, fetch_p50: float | None, live: dict[str, Any] | None
    ) -> bool | None:
        """Whether this epoch's `moved` samples are few, done, and each
        done within a stall (see moved_few_and_short), by the sample
        engine's figures `live`; None while one still loads."""
        epoch = self._epoch
        if not isinstance(epoch, EpochStream) or live is None or not self._samples_per_batch:
            return False
        return moved_few_and_short(
            moved,
            epoch.next_tag,
            live["moved_stalls"],
            live["moved_running"],
            live["longest_moved"],
            self._samples_per_batch,
            fetch_p50,
        )

    def _report(self, samples: int, waited: float) -> None:
        super()._report(samples, waited)
        if self._handed_over:
            # The emptying engine's batches are neither way's to judge.
            if self._whole_pace is not None:
                self._judge_pace(self._whole_pace, samples, waited)
            return
        self._pace.add()
        if not self._may_switch:
            return
        pace = self._handover_pace
        pace.add()
        if pace.seen == 1 and self._loaded_marks:
            self._loaded_marks.append(self._loaded_mark(self._engine.stats()))
        # The batches in flight count too: those begun are delivered on
        # single samples before whole batches start, a late one among them
        # moving as it would have; those not begun are loaded whole (see
        # SWITCH_AFTER_DELIVERED).
        wanted = SWITCH_AFTER * self._num_workers
        if pace.batches >= SWITCH_AFTER_DELIVERED * self._num_workers and (
            pace.batches >= wanted or pace.batches + self._engine.pending() >= wanted
        ):
            self._consider_switch()

    def _consider_switch(self) -> None:
        """Hands the epoch over to whole batches once its first batches
        moved no sample, or a few that whole batches would not have waited
        on (see minato._loader.whole_batches), on worker
        threads for good: the engine delivers the batches it has begun, a
        new one loads the batches after."""
        loader = self._loader()
        if loader is None or not loader._whole_batches.eligible(loader):
            self._may_switch = False
            return
        method = self._method
        if self._processes is not None and not method.decided:
            return  # auto may still choose processes: asked again next batch
        if method.wants_processes or method.processes or loader._whole_batches.lost:
            self._may_switch = False
            return
        epoch = self._epoch
        assert isinstance(epoch, EpochStream)
        if not self._samples_per_batch or not epoch.runs_whole():
            return
        if self._batches_left(epoch) < SWITCH_ROUNDS_LEFT * self._num_workers:
            self._may_switch = False  # too near the epoch's end to gain
            return
        figures = self._recorder.snapshot()
        moved = figures.moved_samples - self._moved_before
        if moved:
            live = self._sample_engine_figures()
            few_and_short = self._moved_few_and_short(moved, figures.fetch_p50, live)
            if few_and_short is None:
                return  # a moved sample still loads: asked again next batch
            if not few_and_short:
                self._may_switch = False  # this epoch stays on single samples
                return
        if figures.sample_timeout is None:
            return  # no sample could have been late yet
        self._switch_to_whole(loader, moved)

    def _sample_engine_figures(self) -> dict[str, Any] | None:
        """The sample engine's figures now; None where none runs."""
        engine = self._engine
        return engine.stats() if isinstance(engine, SampleEngine) else None

    @staticmethod
    def _loaded_mark(live: dict[str, Any]) -> tuple[float, int]:
        """Now, and the samples the pool had loaded by its figures `live`."""
        return time.perf_counter(), live["samples_loaded"]

    def _loading_pace(self, live: dict[str, Any]) -> float | None:
        """The pool's time per batch's samples loaded since the loop's first
        batch (see WholeBatchChoice.samples_part_ended), or since the
        epoch began where the pool loaded less than a batch since then (the
        loop's first batches taken from samples loaded before them)."""
        if not self._samples_per_batch:
            return None
        now, loaded_now = self._loaded_mark(live)
        for since, loaded_then in reversed(self._loaded_marks):
            loaded = loaded_now - loaded_then
            if loaded >= self._samples_per_batch:
                return (now - since) * self._samples_per_batch / loaded
        return None

    def _batches_left(self, epoch: EpochStream) -> float:
        """The epoch's batches not yet handed to the workers (infinite for a
        sampler of no length)."""
        try:
            batches = len(self._index_sampler)
        except TypeError:
            return float("inf")
        assert self._samples_per_batch
        return batches - epoch.next_tag / self._samples_per_batch

    def _switch_to_whole(self, loader: DataLoader, moved: int = 0) -> None:
        """The old engine gets no more samples, gives back the batches no
        worker has started (they are loaded whole, first), and delivers the
        rest; then its threads go, and a pool of as many loads whole batches
        (`_retire_draining`). One pool at a time: a new thread's allocator
        arena would not reuse what the old threads' samples freed in theirs
        (measured: the process's peak 30-40 MB higher with both running),
        and the new pool's workers all start at once as the old ones finish,
        so none waits for work."""
        old = self._engine
        assert isinstance(old, SampleEngine)
        self._may_switch = False
        pace = self._handover_pace
        live = old.stats()
        loader._whole_batches.samples_part_ended(
            pace.batches, pace.spent, moved, self._loading_pace(live)
        )
        max_workers = self._max_workers(loader)
        workers = whole_pool_start(live, self._num_workers, max_workers is not None)
        # The old pool loads what it has and grows no more as it empties.
        old.fix_workers(workers)
        self._whole_pool = (workers, self._batches_in_flight(loader), max_workers)
        # Their samples stay handed out in the ledger until delivered.
        self._withdrawn = deque(old.withdraw_unstarted())
        self._run_positions: dict[int, list[int]] = {}
        self._handed_over = True
        self._draining = old
        logger.info("minato: %s", loader._whole_batches.reason)

    def _forked(self) -> None:
        super()._forked()
        # The epoch goes on here on single samples (`_continue_in_child`),
        # the batches taken back included: they are pending in the ledger.
        self._handed_over = False
        self._withdrawn = deque()
        self._whole_pace = None
        self._may_switch = False

    def _retire_draining(self) -> None:
        draining, self._draining = self._draining, None
        if draining is None:
            return
        self._engine = None
        draining.shutdown(SHUTDOWN_GRACE_S)
        self._recorder.engine_stopped(draining)
        processes, self._processes = self._processes, None
        if processes is not None:
            processes.close()
        # What the old threads' samples freed goes back to the system.
        give_back_freed_memory_soon()
        workers, in_flight, max_workers = self._whole_pool
        self._engine = Engine(
            self._worker_ids.fresh(worker_factory(self._spec, processes=None)),
            EXHAUSTED,
            num_workers=workers,
            max_in_flight=in_flight,
            max_workers=max_workers,
            in_order=True,
            round_robin=False,
            shutdown_grace=SHUTDOWN_GRACE_S,
        )
        self._recorder.engine_started(self._engine)
        # Until every new worker delivered its first batch, the loop's pace is
        # their start (all at once: a batch's loading time, then a batch each).
        self._whole_pace = EpochPace(settling=workers)
        self._submit_ready()

    def _can_submit(self, engine: Any) -> bool:
        # Nothing more for an engine that is emptying (see `_switch_to_whole`).
        return self._draining is None and bool(engine.can_submit())

    def _unpack(self, engine: Any, data: Any) -> tuple[list[int], int, Any, list[Any]]:
        if isinstance(engine, SampleEngine):
            return self._to_batch(data)
        # A whole batch: delivered, its every sample is.
        tags, samples, batch, skipped = _ThreadDataLoaderIter._to_batch(self, data)
        first = tags[0]
        return self._run_positions.pop(first), samples, batch, skipped

    def _submit_next(self, engine: Any) -> bool:
        epoch = self._epoch
        assert isinstance(epoch, EpochStream)
        if self._handed_over:
            # Each sample draws as on its own, from its position (the first's
            # and those after it), the collate as the sample path's would.
            if self._withdrawn:
                # Taken back from the old engine: at the positions it gave them.
                positions, indices = self._withdrawn.popleft()
            else:
                first, indices = epoch.next_run()
                positions = list(range(first, first + len(indices)))
            first = positions[0]
            self._run_positions[first] = positions
            return bool(engine.submit((first, indices, epoch.seed, positions), len(indices)))
        # The ledger hands the batch's samples out at their positions (in
        # Rust): nothing here is done per sample.
        from_queue, fresh = epoch.next_samples()
        arenas = self._processes.arenas if self._processes is not None else None
        if arenas is not None and fresh:
            arenas.expect(epoch.ledger.next_position, from_queue, len(fresh))
        return bool(engine.submit(epoch.ledger, fresh, epoch.seed, from_queue))

    def _engine_skipped(self) -> list[tuple[int | None, SampleFailure]]:
        engine = self._engine
        if not isinstance(engine, SampleEngine) or not self._skip_errors:
            return []  # nothing is skipped: spare every batch a call into the engine
        return [(skipped.tag, skipped.failure) for skipped in engine.take_skipped()]

    def _close_epoch(self) -> None:
        # Samples skipped this epoch are taken off its last batches.
        if isinstance(self._engine, SampleEngine):
            self._engine.close_epoch()

    def _to_batch(self, data: Any) -> tuple[list[int], int, Any, list[Any]]:
        """The engine delivered a batch collated on its collate thread (see
        minato._loader.collate_stage.sample_collator)."""
        tags, samples, batch, error = data
        if error is not None:
            indices = self._epoch.indices_of(tags)
            error.add_note(f"(collating sample indices {indices} in the loader's collate thread)")
            return tags, 0, Failure(error), []
        return tags, samples, batch, []
