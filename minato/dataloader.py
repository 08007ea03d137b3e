"""minato.DataLoader: torch's DataLoader, with worker threads run by a Rust engine."""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch.utils.data
from torch.utils.data import Dataset, Sampler

from minato._integrations import accelerate as accelerate_hooks
from minato._loader.device import resolve_device
from minato._loader.iterator import (
    _CallingThreadDataLoaderIter,
    _SampleDataLoaderIter,
    _ThreadDataLoaderIter,
    _WholeBatchDataLoaderIter,
)
from minato._loader.resume import LoaderProgress
from minato._loader.stats import LoaderStats, StatsRecorder
from minato._loader.whole_batches import WholeBatchChoice
from minato._process.method import (
    WorkerMethod,
    check_worker_method,
    exec_server_wanted,
    fresh_start_method,
)
from minato._process.workers import warm_up
from minato._task.failures import check_failure_options
from minato._util.priority import DEFAULT_WORKER_NICE, check_worker_nice

# Samples profiled before sample_timeout="auto" sets its first timeout.
DEFAULT_TIMEOUT_WARMUP = 64
# The adaptive pool's default bound. I/O-bound datasets (remote storage,
# sleeps in decoders) want dozens of threads whatever the core count; where
# more threads stop paying (the cores are busy, or the dataset holds the
# GIL), the controller's throughput check stops growth well below it.
DEFAULT_MAX_WORKERS = 64

_T_co = TypeVar("_T_co", covariant=True)

# Orders the state_dict() calls of every loader in the process.
_states_taken = itertools.count(1)

# minato's own keyword arguments, beyond torch's: what a copy of a loader
# keeps when a library re-creates it from torch's arguments alone.
MINATO_OPTIONS = (
    "sample_timeout",
    "sample_timeout_warmup",
    "max_slow_samples",
    "adaptive",
    "max_workers",
    "log_interval",
    "device",
    "device_prefetch",
    "on_error",
    "max_failures",
    "worker_method",
    "sample_hard_timeout",
    "worker_nice",
)


def sampler_shuffles(sampler: object) -> bool:
    """Whether a sampler draws its indices in random order: torch's random
    samplers, and any sampler with a true ``shuffle`` attribute (as
    DistributedSampler has) — a custom sampler declares it that way."""
    random_samplers = (
        torch.utils.data.RandomSampler,
        torch.utils.data.SubsetRandomSampler,
        torch.utils.data.WeightedRandomSampler,
    )
    return isinstance(sampler, random_samplers) or getattr(sampler, "shuffle", False) is True


class _DefaultOrder:
    """``in_order`` as a minato loader keeps it when none was given.

    minato reads it as its default, ``None``. torch reads it as ``True``,
    batches in the sampler's order. This matters when a library re-creates
    the loader as torch's class from its attributes, as Accelerate does: the
    copy gets torch's order, never the reordering that torch's iterator
    would make of a plain ``None``. Re-created as minato's class, as
    Lightning does, it keeps minato's default."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "minato.dataloader.DEFAULT_ORDER"

    def __reduce__(self) -> str:
        return "DEFAULT_ORDER"  # the module's one instance


DEFAULT_ORDER = _DefaultOrder()


_TORCH_MULTIPROCESSING_CONTEXT = torch.utils.data.DataLoader.multiprocessing_context


class DataLoader(torch.utils.data.DataLoader[_T_co]):
    """A drop-in replacement for :class:`torch.utils.data.DataLoader`.

    The signature, defaults, validation and attributes are torch's (2.15),
    with one difference: ``in_order`` defaults to ``None`` (kept as
    ``DEFAULT_ORDER``, which torch's own class reads as ``True``): torch's batches
    in torch's order, except that when the sampler shuffles a sample that
    runs late (8 times the median fetch time, at least 100 ms, or
    ``sample_timeout`` when given) joins a later batch instead of holding
    its own (``stats().moved_samples``). Each sample's random draws are
    seeded from the epoch's seed and its position, so a seeded run repeats
    itself whichever worker loads what. With
    ``torch.are_deterministic_algorithms_enabled()`` batches keep torch's
    order and go to the workers in turn, each with torch's per-worker
    generators: torch's batches bit for bit. ``in_order=False`` builds each
    batch from whichever samples finish first.

    ``num_workers=0`` loads in the calling thread, exactly as torch does.
    ``num_workers=N`` runs N worker *threads* owned by minato's Rust engine
    (with ``worker_method``, each may hand its work to a worker process);
    ``multiprocessing_context`` is validated as torch does; a "spawn" or
    "forkserver" one (or one set as multiprocessing's start method, see the
    README) starts worker processes from a fresh interpreter, as torch's: auto then
    keeps threads (its processes are forked), and forced ones come from a
    fresh interpreter of the iterator's own (set as the loader is built or
    assigned later). Otherwise forced worker processes are forked from the
    training process as each epoch starts, as torch's. Each worker thread has what a worker
    process would have of its own: a copy of the dataset that shares its
    data (``WorkerInfo.dataset``, what ``__getitem__``/``__iter__`` run on),
    and the process-wide ``random``, numpy (legacy) and torch generators,
    seeded as torch seeds them (there, ``torch.initial_seed()`` is
    ``base_seed + id`` and ``torch.thread_safe_generator()`` the torch one);
    the training loop's generators are never touched. ``get_worker_info()``
    returns the thread's own ``WorkerInfo`` (``worker_method="thread"``).
    Exceptions from a worker read ``Caught {Type} in DataLoader worker
    thread {id} (sample index {idx})``.

    minato's own options (keyword-only, each kept as a public attribute):

    - ``sample_timeout``, ``sample_timeout_warmup``, ``max_slow_samples``: the
      per-sample timeout of out-of-order batching (see the README).
    - ``adaptive`` (default True): resize the worker pool while running,
      starting from ``num_workers``: grow (doubling, quadrupling while the
      work scales linearly, then by at most 2 at a time once a doubling did
      not pay) while the training loop waits for data and each step raises
      samples/s without slowing the loop's own steps by more than 10%
      (unless its waits shrank more); shrink while batches pile up unused.
      Map-style datasets only: each worker of an IterableDataset owns a
      stream, so its count stays fixed.
      ``num_workers`` keeps the value given; ``stats().workers`` is the live
      count.
    - ``max_workers`` (default ``max(num_workers, 64)``): the adaptive bound.
    - ``log_interval`` (seconds, default None): log a one-line summary through
      the ``minato`` logger at most this often while iterating.
    - ``device`` (``"cuda"``, ``"cuda:1"``, a ``torch.device``; default None):
      batches come out already on that GPU. Each is collated into page-locked
      memory and copied on a side CUDA stream, ``device_prefetch`` (default 2)
      batches ahead; the training loop's stream waits only for its own batch's
      copy. A bare ``"cuda"`` is the local rank's GPU under torchrun. Without
      CUDA, a CUDA device raises ``RuntimeError`` here; ``"cpu"`` or None
      leaves batches in CPU memory.
    - ``on_error`` (``"raise"``, the default, as torch; or ``"skip"``) and
      ``max_failures`` (None, a count, or a float below 1: a fraction of the
      epoch's samples): with ``"skip"`` a sample whose loading raises is left
      out, logged once through the ``minato`` logger, and listed in
      ``stats().failures`` and in ``state_dict()`` (a resumed epoch does not
      load it again). When batches are built from single samples (the
      default for a shuffling sampler), the batch is filled from the next
      ready sample, so every batch keeps torch's size but the epoch's last,
      which is shorter by the samples skipped (with ``drop_last`` a last
      batch left short is dropped); an IterableDataset's worker fills it
      from its stream's next items. Where a batch's indices are fixed (the
      sampler's order kept, a ``batch_sampler``, ``num_workers=0``), it is
      delivered without the samples skipped, and not at all when all were.
      Once an epoch skipped more than ``max_failures``, ``next()`` raises
      ``minato.TooManyFailures`` and the epoch ends.

    - ``worker_method`` (``"auto"``, the default; ``"thread"``;
      ``"multiprocessing"``): how workers run. ``"multiprocessing"`` hands
      each worker thread's tasks to a worker process of its own, set up as
      torch sets up its workers (``get_worker_info().worker_method ==
      "multiprocessing"``), forked from minato's fork server, never from
      this process; everything else stays the engine's. ``"auto"`` starts on
      threads and tries processes when the dataset's Python serialises the
      threads or slows the training loop, keeping them only if the loop
      received batches at least as fast on them (see the README);
      ``stats().worker_method`` and ``.worker_method_reason`` tell.
    - ``sample_hard_timeout`` (seconds per sample, default None): a worker
      process whose task runs past it is killed and the sample fails
      (``RuntimeError``; skipped with ``on_error="skip"``); a new process
      takes the worker's next task. Needs processes: ``ValueError`` with
      ``worker_method="thread"``.
    - ``worker_nice`` (0 to 19, default 10): worker processes run this much
      above the training loop's nice value, so that where both want a core
      the kernel runs the loop first (the workers still get every cycle it
      leaves). 0 runs them at the loop's priority, as torch does. Worker
      threads keep the loop's priority (they share its GIL).

    When batches are pinned (``pin_memory`` active, or ``device`` a GPU) and
    ``collate_fn`` is the default, tensors and numpy arrays of one shape and
    dtype are stacked straight into a page-locked batch tensor by Rust threads
    with the GIL released; the result is ``default_collate``'s. Batches are
    collated and pinned off the training loop's thread: by the worker that
    loaded a whole batch, or, for batches built from single samples, on the
    loader's collate thread (which has random generators of its own); only
    a batch that ``default_collate`` collates in microseconds is collated
    by the consumer itself.

    ``stats()`` tells where the time goes; ``print(loader.stats())`` shows a table.
    ``state_dict()`` / ``load_state_dict()`` resume an interrupted epoch with
    exactly the indices it had not delivered (Lightning saves them itself).
    """

    def __init__(
        self,
        dataset: Dataset[_T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool | None = None,
        sample_timeout: float | str | None = "auto",
        sample_timeout_warmup: int = DEFAULT_TIMEOUT_WARMUP,
        max_slow_samples: int | None = None,
        adaptive: bool = True,
        max_workers: int | None = None,
        log_interval: float | None = None,
        device: str | int | torch.device | None = None,
        device_prefetch: int = 2,
        on_error: str = "raise",
        max_failures: int | float | None = None,
        worker_method: str = "auto",
        sample_hard_timeout: float | None = None,
        worker_nice: int = DEFAULT_WORKER_NICE,
    ) -> None:
        check_failure_options(on_error, max_failures)
        check_worker_nice(worker_nice)
        check_worker_method(worker_method)
        _check_hard_timeout(sample_hard_timeout, worker_method)
        _check_minato_options(sample_timeout, sample_timeout_warmup, max_slow_samples)
        _check_adaptive_options(adaptive, max_workers, log_interval, num_workers)
        if isinstance(device_prefetch, bool) or not isinstance(device_prefetch, int):
            raise TypeError(
                f"device_prefetch should be a positive integer, but got {device_prefetch!r}"
            )
        if device_prefetch < 1:
            raise ValueError(
                "device_prefetch option should be positive, "
                f"but got device_prefetch={device_prefetch}"
            )
        # Fails here, not at the first batch, when the device cannot be had.
        resolve_device(device)
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=True if in_order is None or in_order is DEFAULT_ORDER else in_order,
        )
        # Kept as given (Lightning re-creates loaders from these attributes),
        # the default as DEFAULT_ORDER: None to minato, True to torch.
        self.in_order = DEFAULT_ORDER if in_order is None else in_order
        self.sample_timeout = sample_timeout
        self.sample_timeout_warmup = sample_timeout_warmup
        self.max_slow_samples = max_slow_samples
        self.adaptive = adaptive
        self.max_workers = max_workers
        self.log_interval = log_interval
        self.device = device
        self.device_prefetch = device_prefetch
        self.on_error = on_error
        self.max_failures = max_failures
        self.worker_method = worker_method
        self.sample_hard_timeout = sample_hard_timeout
        self.worker_nice = worker_nice
        self._worker_method = self._new_worker_method()
        self._stats_recorder = StatsRecorder()
        self._stats_recorder.method = self._worker_method if num_workers > 0 else None
        self._progress = LoaderProgress()
        self._whole_batches = WholeBatchChoice()
        # (base seed, epochs begun) of a persistent iterator replaced, for its successor.
        self._carried_iteration: tuple[int, int] | None = None
        # The state_dict() last returned, and the loader a library rebuilt
        # this one as (minato._integrations.transformers reads both).
        self._last_state_dict: dict[str, Any] | None = None
        self._last_state_taken = 0
        self._rebuilt_as: weakref.ref[DataLoader[Any]] | None = None
        method = self._worker_method
        if (
            num_workers > 0
            and method.uses_fork_server
            and (method.wants_processes or exec_server_wanted())
            and not method.forks_at_start
        ):
            # The shared fork server, forked from this process now, while no
            # worker of this loader runs: ready before the first samples
            # need it. Auto, undecided, forks it once its measurements point
            # to processes (a loader that keeps threads never forks it); a
            # fresh interpreter shares no pages and takes seconds to start:
            # it starts now, in the background. Processes forced or decided
            # are forked from this process as each epoch starts instead.
            warm_up(dataset=dataset)
        accelerate_hooks.register(self)

    @property
    def multiprocessing_context(self) -> Any:
        return _TORCH_MULTIPROCESSING_CONTEXT.fget(self)  # type: ignore[misc]

    @multiprocessing_context.setter
    def multiprocessing_context(self, multiprocessing_context: Any) -> None:
        _TORCH_MULTIPROCESSING_CONTEXT.fset(self, multiprocessing_context)  # type: ignore[misc]
        if "_worker_method" in self.__dict__:
            # Assigned after construction (as a library may choose "spawn"):
            # torch's next workers start in it, so the choice is made again
            # for the next iterator; a persistent one keeps its workers.
            self._worker_method = self._new_worker_method()
            self._stats_recorder.method = self._worker_method if self.num_workers > 0 else None

    def _new_worker_method(self) -> WorkerMethod:
        """A choice of worker method of its own, as the loader is built (or copied)."""
        return WorkerMethod(
            self.worker_method, type(self.dataset), fresh_start_method(self.multiprocessing_context)
        )

    def __getstate__(self) -> dict[str, Any]:
        """What pickling and ``copy.deepcopy`` copy, as torch's DataLoader: the
        configuration (dataset, sampler, options), never a live iterator or
        its workers. The copy starts fresh: its own stats, its own automatic
        worker-method choice, and no epoch in progress; a state loaded with
        ``load_state_dict`` and not yet iterated is carried over, so the
        copy resumes from it."""
        state = self.__dict__.copy()
        state["_iterator"] = None
        method = self._new_worker_method()
        recorder = StatsRecorder()
        recorder.method = method if self.num_workers > 0 else None
        state["_worker_method"] = method
        state["_stats_recorder"] = recorder
        state["_progress"] = self._progress.fresh_copy()
        state["_whole_batches"] = WholeBatchChoice()
        state["_carried_iteration"] = None
        state["_last_state_dict"] = None
        state["_last_state_taken"] = 0
        state["_rebuilt_as"] = None
        return state

    def minato_options(self) -> dict[str, Any]:
        """minato's own options as this loader has them (``MINATO_OPTIONS``)."""
        return {name: getattr(self, name) for name in MINATO_OPTIONS}

    def _rebuilt(
        self,
        dataset: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        skip_sampler_class: type | None,
    ) -> DataLoader[Any]:
        """This loader as a library rebuilds it from torch's arguments
        (``accelerate.data_loader``): minato's class, with this loader's
        minato options. Where the library skips the batches an interrupted
        epoch delivered (``skip_first_batches``) and this loader holds a
        loaded ``state_dict()``, the copy resumes from the state instead:
        exactly the samples not delivered, reordered or not, each with the
        random draws it would have had."""
        kwargs = dict(kwargs)
        batch_sampler = kwargs.get("batch_sampler")
        resume = (
            skip_sampler_class is not None
            and isinstance(batch_sampler, skip_sampler_class)
            and getattr(batch_sampler, "batch_sampler", None) is self.batch_sampler
            and self._progress.has_loaded_state()
        )
        if resume:
            kwargs["batch_sampler"] = self.batch_sampler
        cls = type(self) if _rebuilds_as_itself(type(self)) else DataLoader
        loader = cls(dataset, *args, **{**self.minato_options(), **kwargs})
        if resume:
            # The copy resumes the epoch; this loader's next epoch starts afresh.
            loader._progress, self._progress = self._progress, LoaderProgress()
        self._rebuilt_as = weakref.ref(loader)
        return loader

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is, for ``load_state_dict`` after a restart.

        In the middle of an epoch, a loader restored from it delivers exactly
        the indices of this epoch not yet delivered (batches reordered or not,
        slow samples in flight or not), then goes on with the same sampler
        sequence as an uninterrupted run. It holds the sampler's position (its
        own ``state_dict`` where it has one), the indices in flight, the
        generators' states and the dataset's ``state_dict`` where it has one;
        it can be saved with ``torch.save``. An IterableDataset's workers'
        streams are resumed by loading and dropping what each had delivered.
        """
        state = self._progress.state_dict(self)
        self._last_state_dict, self._last_state_taken = state, next(_states_taken)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; the next ``iter(loader)`` resumes there."""
        self._progress.load_state_dict(self, state_dict)

    def stats(self) -> LoaderStats:
        """Where the time went since this loader was first iterated."""
        snapshot = self._stats_recorder.snapshot()
        return dataclasses.replace(snapshot, whole_batches_reason=self._whole_batches.reason)

    def effective_max_workers(self) -> int:
        """The adaptive pool's bound: ``max_workers``, or its default."""
        if self.max_workers is not None:
            return self.max_workers
        return max(self.num_workers, DEFAULT_MAX_WORKERS)

    def in_order_given(self) -> bool | None:
        """``in_order`` as given, None where it was not (see DEFAULT_ORDER)."""
        return None if self.in_order is DEFAULT_ORDER else self.in_order

    def reorders(self) -> bool:
        """Whether batches may leave the sampler's order: ``in_order=False``,
        or ``in_order=None`` with a shuffling sampler, where a late sample
        may join a later batch (evaluation loops with a sequential sampler
        often rely on the order, so it is kept)."""
        if self.in_order_given() is not None:
            return not self.in_order
        if torch.are_deterministic_algorithms_enabled():
            return False
        # A batch sampler of the user's (given, or swapped in after
        # construction, as timm's MultiEpochsDataLoader swaps in an endless
        # one) decides what a batch and an epoch are: its order is kept.
        return sampler_shuffles(self.sampler) and self._batches_from_own_sampler()

    def _batches_from_own_sampler(self) -> bool:
        """Whether batches are torch's ``BatchSampler`` over this loader's
        own sampler (or single samples, without auto-collation), as the
        loader is now: only then may single samples move between batches."""
        batch_sampler = self.batch_sampler
        return batch_sampler is None or (
            type(batch_sampler) is torch.utils.data.BatchSampler
            and batch_sampler.sampler is self.sampler
        )

    def deals_in_turn(self) -> bool:
        """Whether batches go to a fixed pool of workers in turn, as torch
        deals them: for an IterableDataset (each worker owns a stream), and
        in deterministic mode, where which worker loads a batch decides its
        random augmentations (each worker has its own generators)."""
        if isinstance(self.dataset, torch.utils.data.IterableDataset):
            return True
        return not self.reorders() and torch.are_deterministic_algorithms_enabled()

    def __iter__(self) -> torch.utils.data.dataloader._BaseDataLoaderIter:
        # torch reuses a persistent iterator; one that no longer fits the
        # loader as it is now (a batch sampler swapped in since, an epoch
        # handed over to whole batches) is replaced.
        iterator = self._iterator
        if isinstance(iterator, _ThreadDataLoaderIter) and (
            iterator.kind != self._iterator_kind() or not iterator.reusable()
        ):
            self._iterator = None
            iterator._shutdown(0.0)
            # The new one goes on with its seeds, drawing none of its own.
            self._carried_iteration = iterator.carried()
        return super().__iter__()

    def _iterator_kind(self) -> tuple[type, bool]:
        """The iterator an epoch of this loader, as it is now, runs on: its
        class and whether whole batches keep the sampler's order."""
        if self.num_workers == 0:
            return _CallingThreadDataLoaderIter, True
        if self._reorders_samples():
            # A loaded mid-epoch state is resumed as it was loaded; the
            # loader's next epochs choose afresh (minato._loader.whole_batches).
            loaded = self._progress.loaded_samples()
            whole = self._whole_batches.wanted(self) if loaded is None else not loaded
            if whole:
                return _WholeBatchDataLoaderIter, True
            return _SampleDataLoaderIter, False
        # A user's batch_sampler decides each batch's composition, an
        # iterable dataset's workers decide theirs: only whole batches move.
        return _ThreadDataLoaderIter, not self.reorders()

    def _get_iterator(self) -> torch.utils.data.dataloader._BaseDataLoaderIter:
        kind, in_order = self._iterator_kind()
        if kind is _CallingThreadDataLoaderIter:
            return _CallingThreadDataLoaderIter(self)
        if self.prefetch_factor is not None and self.prefetch_factor <= 0:
            # torch's constructor lets 0 through; its worker iterator refuses it.
            raise AssertionError(
                "prefetch_factor must be greater than 0 for MultiProcessingDataLoaderIter"
            )
        return kind(self, in_order=in_order)

    def _reorders_samples(self) -> bool:
        """Whether iterating moves single samples between batches: with
        workers, when reordering, and only where torch's batch sampler over
        the loader's own sampler decides the batches. Asked as each iterator
        starts, of the loader as it is then."""
        return (
            self.num_workers > 0
            and self.reorders()
            and self._auto_collation
            and self._batches_from_own_sampler()
            and not isinstance(self.dataset, torch.utils.data.IterableDataset)
        )

    def check_worker_number_rationality(self) -> None:
        # torch warns when worker processes outnumber the cores. Threads that
        # wait on I/O or run GIL-free code are worth having beyond the core
        # count, so minato does not warn.
        return None


def _rebuilds_as_itself(cls: type) -> bool:
    """Whether a library may rebuild a loader of class `cls` by calling it
    with torch's keyword arguments: minato's class, or a subclass that keeps
    its ``__init__`` (or declares that it takes them)."""
    return cls.__init__ is DataLoader.__init__ or bool(
        getattr(cls, "_takes_torch_arguments", False)
    )


def _check_minato_options(
    sample_timeout: object, sample_timeout_warmup: object, max_slow_samples: object
) -> None:
    if sample_timeout is not None and sample_timeout != "auto":
        if isinstance(sample_timeout, bool) or not isinstance(sample_timeout, (int, float)):
            raise TypeError(
                f'sample_timeout should be "auto", a number of seconds or None, '
                f"but got sample_timeout={sample_timeout!r}"
            )
        if not sample_timeout > 0:
            raise ValueError(
                f"sample_timeout option should be positive, but got sample_timeout={sample_timeout}"
            )
    if (
        isinstance(sample_timeout_warmup, bool)
        or not isinstance(sample_timeout_warmup, int)
        or sample_timeout_warmup < 1
    ):
        raise ValueError(
            "sample_timeout_warmup option should be a positive integer, "
            f"but got sample_timeout_warmup={sample_timeout_warmup!r}"
        )
    if max_slow_samples is not None and (
        isinstance(max_slow_samples, bool)
        or not isinstance(max_slow_samples, int)
        or max_slow_samples < 0
    ):
        raise ValueError(
            "max_slow_samples option should be a non-negative integer or None, "
            f"but got max_slow_samples={max_slow_samples!r}"
        )


def _check_adaptive_options(
    adaptive: object, max_workers: object, log_interval: object, num_workers: int
) -> None:
    if not isinstance(adaptive, bool):
        raise TypeError(f"adaptive should be a bool, but got adaptive={adaptive!r}")
    if max_workers is not None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(
                "max_workers option should be a positive integer or None, "
                f"but got max_workers={max_workers!r}"
            )
        if isinstance(num_workers, int) and max_workers < num_workers:
            raise ValueError(
                "max_workers option should be at least num_workers, but got "
                f"max_workers={max_workers} and num_workers={num_workers}"
            )
    if log_interval is not None and (
        isinstance(log_interval, bool)
        or not isinstance(log_interval, (int, float))
        or not log_interval > 0
    ):
        raise ValueError(
            "log_interval option should be a positive number of seconds or None, "
            f"but got log_interval={log_interval!r}"
        )


def _check_hard_timeout(sample_hard_timeout: object, worker_method: object) -> None:
    if sample_hard_timeout is None:
        return
    if isinstance(sample_hard_timeout, bool) or not isinstance(sample_hard_timeout, (int, float)):
        raise TypeError(
            "sample_hard_timeout should be a number of seconds or None, "
            f"but got sample_hard_timeout={sample_hard_timeout!r}"
        )
    if not sample_hard_timeout > 0:
        raise ValueError(
            "sample_hard_timeout option should be positive, "
            f"but got sample_hard_timeout={sample_hard_timeout}"
        )
    if worker_method == "thread":
        raise ValueError(
            "sample_hard_timeout stops worker processes; a thread cannot be stopped: use "
            'worker_method="multiprocessing" or "auto", or leave sample_hard_timeout=None'
        )
