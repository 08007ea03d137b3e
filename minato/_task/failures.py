"""The failure policy: what a loader does with a sample whose loading raised.

``on_error="raise"`` (the default) is torch's behaviour: the exception
reaches the training loop in its batch's turn. ``on_error="skip"`` drops the
sample: the worker hands back a `Skipped` record in its place, the iterator
logs it once, keeps it in ``stats()`` and in ``state_dict()`` (a resumed run
does not load it again), and raises `TooManyFailures` once the epoch's
skipped samples exceed ``max_failures``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minato._minato import _sample_begins
from minato._util.log import logger

ON_ERROR_CHOICES = ("raise", "skip")


@dataclass(frozen=True)
class SampleFailure:
    """One sample a loader skipped (``on_error="skip"``)."""

    index: Any
    """The sample's index; None for an IterableDataset's item (a stream has no index)."""
    worker: int | None
    """The worker thread that loaded it; None for the calling thread (``num_workers=0``)."""
    type: str
    """The exception's type, qualified by its module unless a builtin."""
    message: str
    """``str()`` of the exception."""

    def as_state(self) -> tuple[Any, int | None, str, str]:
        """Plain values only: a checkpoint loads with ``torch.load(weights_only=True)``."""
        return (self.index, self.worker, self.type, self.message)

    @classmethod
    def from_state(cls, state: Any) -> SampleFailure:
        index, worker, type_name, message = state
        return cls(index, worker, type_name, message)

    def describe(self) -> str:
        where = "the calling thread" if self.worker is None else f"worker thread {self.worker}"
        what = "an item of the stream" if self.index is None else f"sample index {self.index!r}"
        return f"{self.type} in {where} ({what}): {self.message}"


class TooManyFailures(RuntimeError):
    """More samples failed in one epoch than ``max_failures`` allows."""


class Skipped:
    """What a worker hands back in place of a sample it skipped."""

    __slots__ = ("failure", "tag")

    def __init__(self, tag: int | None, failure: SampleFailure) -> None:
        self.tag = tag
        self.failure = failure


class _AllSkipped:
    __slots__ = ()

    def __reduce__(self) -> str:
        return "NOTHING_LOADED"  # one object in every process: pickled by name

    def __repr__(self) -> str:
        return "NOTHING_LOADED"


# Where a batch would be when every sample of it was skipped: the loop goes
# on to the next batch. Not None: a collate_fn (or an unbatched dataset's
# sample) may be None, and torch yields it.
NOTHING_LOADED = _AllSkipped()


def _type_name(error: BaseException) -> str:
    kind = type(error)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def current_failure(index: Any, worker: int | None) -> SampleFailure:
    """The failure being handled (call inside ``except``)."""
    error = sys.exc_info()[1]
    assert error is not None, "call inside an except block"
    try:
        message = str(error)
    except Exception:  # an exception whose __str__ fails still gets reported
        message = f"<{_type_name(error)}: str() failed>"
    return SampleFailure(index, worker, _type_name(error), message)


def check_failure_options(on_error: object, max_failures: object) -> None:
    """Raises torch's kind of error for an invalid failure policy."""
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(
            f'on_error option should be "raise" or "skip", but got on_error={on_error!r}'
        )
    if max_failures is None:
        return
    if on_error != "skip":
        raise ValueError(
            'max_failures applies to skipped samples: set on_error="skip", '
            f"or leave max_failures=None (got max_failures={max_failures!r})"
        )
    if isinstance(max_failures, bool) or not isinstance(max_failures, (int, float)):
        raise TypeError(
            "max_failures should be None, a count (int) or a fraction of the epoch's "
            f"samples (a float below 1), but got max_failures={max_failures!r}"
        )
    if isinstance(max_failures, float) and not (0.0 <= max_failures < 1.0):
        raise ValueError(
            "max_failures as a float is a fraction of the epoch's samples and should be "
            f"in [0, 1), but got max_failures={max_failures!r}; pass an int for a count"
        )
    if isinstance(max_failures, int) and max_failures < 0:
        raise ValueError(
            f"max_failures option should be non-negative, but got max_failures={max_failures}"
        )


def epoch_samples(loader: Any) -> int | None:
    """Samples in an epoch, for a budget given as a fraction; None when unsized."""
    for sized in (loader.sampler, loader.dataset):
        try:
            return len(sized)
        except TypeError:
            continue
    return None


def failure_budget(max_failures: int | float | None, samples: int | None) -> int | None:
    """Failures an epoch of `samples` (None: unsized) may skip before the
    loader stops; None for no limit."""
    if max_failures is None or isinstance(max_failures, int):
        return max_failures
    if samples is None:
        raise TypeError(
            f"max_failures={max_failures!r} is a fraction of the epoch's samples, but this "
            "loader's dataset and sampler have no len(): pass a count (an int) instead"
        )
    return math.floor(max_failures * samples)


def budget_exceeded(
    max_failures: int | float, failures: list[SampleFailure], budget: int, epoch_size: int | None
) -> TooManyFailures:
    """The error that ends an epoch over its budget, naming the budget and the last failure."""
    of = "" if epoch_size is None else f" of {epoch_size}"
    return TooManyFailures(
        f"DataLoader skipped {len(failures)}{of} samples this epoch, more than "
        f"max_failures={max_failures!r} allows ({budget}); the last: "
        f"{failures[-1].describe()}. loader.stats().failures lists them all."
    )


def load_skipping(
    dataset: Any,
    getitems: Any,
    indices: list[Any],
    worker: int | None,
    run: Any = None,
    settle: Callable[[int, Any], Any] | None = None,
) -> list[Any]:
    """Loads `indices` (with ``__getitems__`` when the dataset has one): for
    each, its sample, or its `SampleFailure` when loading it raised.
    `run`: the samples' seeding (a minato._task.seed.SampleRun), moved on
    before each is loaded; `settle`: see `load_each`."""
    if getitems is not None:
        if run is not None:
            run.begin(0)
        try:
            return list(getitems(indices))
        except Exception:
            pass  # load one by one below to find which samples fail
    return load_each(dataset, indices, run, lambda index: current_failure(index, worker), settle)


def load_each(
    dataset: Any,
    indices: list[Any],
    run: Any,
    failed: Callable[[Any], Any],
    settle: Callable[[int, Any], Any] | None = None,
) -> list[Any]:
    """Loads `indices` one by one: for each, its sample, or what `failed`
    makes of its index, called while the exception is being handled.
    `run`: the samples' seeding (a minato._task.seed.SampleRun, or None),
    moved on before each is loaded. Each sample is reported to the engine
    as it begins: a run of samples on a worker thread is judged late by the
    sample it is on (rust/bindings/sample_progress.rs). `settle(ordinal,
    sample)`, where given, takes each sample as it is loaded and gives what
    the run keeps of it (a worker process writes its large leaves into
    their place at once, so that a run does not hold them all)."""
    loaded: list[Any] = []
    for ordinal, index in enumerate(indices):
        _sample_begins()
        if run is not None:
            run.begin(ordinal)
        try:
            sample = dataset[index]
        except Exception:
            loaded.append(failed(index))
        else:
            loaded.append(sample if settle is None else settle(ordinal, sample))
            del sample  # not held through the next sample's loading
    return loaded


def split_failures(loaded: list[Any]) -> tuple[list[Any], list[SampleFailure]]:
    """What `load_skipping` returned, as (the samples, the failures)."""
    samples = [item for item in loaded if not isinstance(item, SampleFailure)]
    failures = [item for item in loaded if isinstance(item, SampleFailure)]
    return samples, failures


def next_skipping(
    iterator: Any, count: int, worker: int | None, *, drop_last: bool
) -> tuple[list[Any], list[SampleFailure], bool]:
    """Up to `count` items of an IterableDataset's stream, skipping the
    items whose ``next()`` raises: (the items, the failures, whether the
    stream ended). A generator that raised has ended: its stream ends there.
    With `drop_last`, fewer than `count` items at the stream's end are none."""
    items: list[Any] = []
    failures: list[SampleFailure] = []
    while len(items) < count:
        try:
            items.append(next(iterator))
        except StopIteration:
            return ([] if drop_last else items), failures, True
        except Exception:
            failures.append(current_failure(None, worker))
            if getattr(iterator, "gi_frame", True) is None:
                logger.warning(
                    "minato: the stream of %s ended at a skipped failure: a generator "
                    "cannot go on after raising. To skip an item and keep the stream, "
                    "catch its error inside __iter__, or implement __next__.",
                    "the calling thread" if worker is None else f"worker thread {worker}",
                )
                return ([] if drop_last else items), failures, True
    return items, failures, False
