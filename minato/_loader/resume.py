"""Exact resume: which of an epoch's indices reached the training loop, and
what a DataLoader's ``state_dict`` keeps to deliver the rest after a restart.

Batches are reordered (fast samples first), so "k batches delivered" does not
say which indices are done. Every batch (or, for the sample-level iterator,
every sample) the sampler hands out gets a tag, its position in the epoch; it
stays *pending* from the moment it is handed to the workers until its batch
is handed to the loop. The positions and pending indices are kept in Rust
(``minato._minato.SampleLedger``, rust/engine/sample_ledger.rs), which the
engine hands a batch's samples out through: the training thread does no
per-sample bookkeeping. A checkpoint therefore needs only the sampler's position and the
pending indices: after a restart those are loaded first, then the sampler
goes on from where it was. Pending indices are bounded by the work in
flight, so the state stays small whatever the epoch's length.

The sampler's position is kept in one of three ways, tried in order:

- ``"iterator"``: the index sampler's iterator has ``state_dict`` (torchdata's
  stateful batch sampler): its state is saved and loaded into a new iterator.
- ``"sampler"``: the batch sampler or sampler has ``state_dict`` (torchdata's
  ``StatefulDistributedSampler``, a user's own): saved, then loaded before
  the epoch's iterator is made.
- ``"replay"``: anything else. The torch generators the sampler draws from
  (the loader's ``generator``, the samplers' ``generator`` attributes, torch's
  global generator) and the samplers' ``epoch`` are captured when the epoch's
  iterator is made; a resume restores them, makes the iterator again and
  skips the batches already taken. Torch's own samplers are deterministic
  given those, so the epoch repeats exactly, and the generators end the epoch
  in the state an uninterrupted run leaves them in: later epochs match too.
  torch's global generator is restored only while the resumed iterator draws
  its first batch, then put back: it belongs to the training program.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data.dataloader import _DatasetKind

from minato._minato import SampleLedger
from minato._task.failures import SampleFailure
from minato._util.fork import ForkSafeLock

# Bumped when the layout of the state changes; a state of another version is refused.
STATE_VERSION = 1
_FORMAT = "minato.DataLoader"


def _has_state(obj: object) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _distinct(candidates: dict[str, Any], kind: type) -> dict[str, Any]:
    """The candidates of type `kind` (None never is one), by attribute path,
    each object once (under the first path that reaches it)."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    for name, candidate in candidates.items():
        if candidate is not None and isinstance(candidate, kind) and id(candidate) not in seen:
            seen.add(id(candidate))
            found[name] = candidate
    return found


def _samplers(loader: Any) -> dict[str, Any]:
    """The loader's samplers by attribute path, each object once."""
    batch_sampler = loader.batch_sampler
    candidates = {
        "sampler": loader.sampler,
        "batch_sampler": batch_sampler,
        "batch_sampler.sampler": getattr(batch_sampler, "sampler", None),
    }
    return _distinct(candidates, object)


def _generators(loader: Any) -> dict[str, torch.Generator]:
    """The torch generators an epoch's order may draw from, by attribute path."""
    candidates = {"generator": loader.generator}
    for name, sampler in _samplers(loader).items():
        candidates[f"{name}.generator"] = getattr(sampler, "generator", None)
    return _distinct(candidates, torch.Generator)


def _generator_states(loader: Any) -> dict[str, torch.Tensor]:
    return {name: generator.get_state() for name, generator in _generators(loader).items()}


def _set_generator_states(loader: Any, states: dict[str, torch.Tensor]) -> None:
    generators = _generators(loader)
    for name, state in states.items():
        if name in generators:
            generators[name].set_state(state)


def _sampler_epochs(loader: Any) -> dict[str, int]:
    return {
        name: sampler.epoch
        for name, sampler in _samplers(loader).items()
        if isinstance(getattr(sampler, "epoch", None), int)
    }


def _set_sampler_epochs(loader: Any, epochs: dict[str, int]) -> None:
    samplers = _samplers(loader)
    for name, epoch in epochs.items():
        if name in samplers:
            samplers[name].epoch = epoch


def _stateful_sampler(loader: Any) -> tuple[str, Any] | None:
    """The sampler that keeps its own position (batch sampler first), if any."""
    for name, sampler in _samplers(loader).items():
        if name != "batch_sampler.sampler" and _has_state(sampler):
            return name, sampler
    return None


def capture_epoch_rng(loader: Any) -> dict[str, Any]:
    """What the epoch's sampler iterator will draw from; call just before making it."""
    return {
        "generators": _generator_states(loader),
        "global": torch.get_rng_state(),
        "epochs": _sampler_epochs(loader),
    }


@contextlib.contextmanager
def _global_rng(state: torch.Tensor) -> Iterator[None]:
    """torch's global generator set to ``state`` inside, the program's own after."""
    own = torch.get_rng_state()
    torch.set_rng_state(state)
    try:
        yield
    finally:
        torch.set_rng_state(own)


class EpochStream:
    """The epoch's batches of indices, each unit with its position in the
    epoch, and those not yet delivered.

    ``samples=True`` (the sample-level iterator) gives single samples their
    positions and cuts the stream into batches of ``batch_size`` (what
    torch's batch sampler does); otherwise each batch the index sampler
    yields is one unit. The positions and the pending units are kept by a
    `SampleLedger` (Rust), which the engine hands a sample-level batch to
    whole: the training thread does no per-sample bookkeeping. Indices
    carried over from a checkpoint come first.
    """

    def __init__(
        self,
        batches: Iterator[Any],
        *,
        samples: bool,
        batch_size: int,
        seed: int | None = None,
        carried: list[Any] | None = None,
        carried_tags: list[int] | None = None,
        next_tag: int = 0,
        pulled: int = 0,
        failures: list[SampleFailure] | None = None,
    ) -> None:
        self._batches = batches
        self._samples = samples
        self._batch_size = batch_size
        # The epoch's seed (minato._task.seed): with a position, what seeds
        # a sample's (or a batch's) random draws; None where workers keep
        # their own streams.
        self.seed = seed
        # Indices carried over from a checkpoint keep their positions (older
        # states had none: they get new ones).
        carried = list(carried or ())
        if carried and (carried_tags is None or len(carried_tags) != len(carried)):
            carried_tags = list(range(next_tag, next_tag + len(carried)))
            next_tag += len(carried)
        self.ledger = SampleLedger(next_tag, list(carried_tags or ()), carried)
        # Samples of a batch taken from the sampler, not yet handed out
        # (their positions follow the ledger's next one, in order).
        self._buffer: list[Any] = []
        # Samples skipped this epoch (on_error="skip"), in the order reported.
        self.failures: list[SampleFailure] = list(failures or ())
        self.pulled = pulled
        self.exhausted = False
        # A checkpoint may be taken from another thread (an async checkpoint
        # callback): it must see the sampler's position and the pending
        # indices at one moment.
        self.lock = ForkSafeLock()
        # Set once the loop was told the epoch is over: only then is it complete
        # (a checkpoint after the last batch, before StopIteration, resumes an
        # empty rest of the epoch, as an uninterrupted loop would see).
        self.ended = False

    @property
    def sampler_iterator(self) -> Iterator[Any]:
        return self._batches

    def _pull(self) -> Any:
        try:
            batch = next(self._batches)
        except StopIteration:
            self.exhausted = True
            raise
        self.pulled += 1
        return batch

    @property
    def next_tag(self) -> int:
        """The position of the next sample (batch) taken from the sampler."""
        return self.ledger.next_position + len(self._buffer)

    def next_batch(self) -> tuple[list[int], Any]:
        """The next batch to load, a whole-batch unit: (its position, as a
        one-item list, and its list of indices)."""
        with self.lock:
            if self.ledger.queued:
                ((position, index),) = self.ledger.hand_out(1, ())
            else:
                ((position, index),) = self.ledger.hand_out(0, (self._pull(),))
            return [position], index

    def next_samples(self) -> tuple[int, list[Any]]:
        """The next sample-level batch, for the engine to hand out through
        the ledger: (how many of its samples are queued in the ledger, the
        fresh indices that follow them). StopIteration at the epoch's end."""
        with self.lock:
            return self._next_samples()

    def runs_whole(self) -> bool:
        """Whether the next sample-level batches are the batch sampler's own,
        at consecutive positions from a multiple of the batch size: nothing
        queued or carried over ahead of them."""
        with self.lock:
            ledger = self.ledger
            return (
                not ledger.queued
                and not self._buffer
                and ledger.next_position % self._batch_size == 0
            )

    def next_run(self) -> tuple[int, list[Any]]:
        """The next sample-level batch handed out whole (see `runs_whole`):
        the position of its first sample and its indices, the others at the
        positions that follow. StopIteration at the epoch's end."""
        with self.lock:
            from_queue, fresh = self._next_samples()
            assert from_queue == 0, "a whole run follows no queued sample"
            first = self.ledger.next_position
            self.ledger.hand_out(0, fresh)
            return first, fresh

    def _next_samples(self) -> tuple[int, list[Any]]:
        # Under the lock.
        size = self._batch_size
        from_queue = min(self.ledger.queued, size)
        wanted = size - from_queue
        fresh = self._buffer
        while len(fresh) < wanted and not self.exhausted:
            try:
                fresh.extend(self._pull())
            except StopIteration:
                break
        fresh, self._buffer = fresh[:wanted], fresh[wanted:]
        if not from_queue and not fresh:
            raise StopIteration
        return from_queue, fresh

    def delivered(self, tags: list[int]) -> None:
        with self.lock:
            self.ledger.delivered(tags)

    def skipped(self, tag: int | None, failure: SampleFailure) -> None:
        """A sample was skipped: it is done with (a resume does not load it
        again) and its failure is part of the epoch's state."""
        with self.lock:
            if self._samples and tag is not None:
                self.ledger.skipped(tag)
            self.failures.append(failure)

    def indices_of(self, tags: list[int]) -> list[Any]:
        """The indices of tags not yet delivered (for error messages)."""
        with self.lock:
            return self.ledger.indices_of(tags)

    def requeue_pending(self) -> None:
        """The workers that had the pending indices are gone (they stayed in
        the parent of a fork child): those indices are loaded again, first,
        in the sampler's order, at the same positions."""
        with self.lock:
            self.ledger.requeue_pending()

    def undelivered(self) -> tuple[list[int], list[Any]]:
        """Indices taken from the sampler and not delivered, and their
        positions in the epoch, in the sampler's order."""
        positions, indices = self.ledger.undelivered()
        following = self.ledger.next_position
        positions.extend(range(following, following + len(self._buffer)))
        indices.extend(self._buffer)
        return positions, indices


class IterableStream:
    """An IterableDataset's epoch: each stream's batches delivered so far.

    Each worker (the calling thread with ``num_workers=0``) owns one stream of
    the dataset and loads its batches in turn, so what was delivered from a
    stream is always a prefix of it. A resume replays each stream: its worker
    loads and drops that many batches first (exact for deterministic streams).
    """

    def __init__(
        self,
        batches: Iterator[Any],
        delivered: dict[int, int] | None = None,
        failures: list[SampleFailure] | None = None,
    ) -> None:
        self._batches = batches
        self.failures: list[SampleFailure] = list(failures or ())
        self.delivered_per_stream: dict[int, int] = dict(delivered or {})
        self._skips = dict(self.delivered_per_stream)
        self.ended = False
        self.lock = ForkSafeLock()

    def next_batch(self) -> tuple[list[int], Any]:
        return [], next(self._batches)

    def delivered(self, streams: list[int]) -> None:
        with self.lock:
            for stream in streams:
                self.delivered_per_stream[stream] = self.delivered_per_stream.get(stream, 0) + 1

    def skipped(self, stream: int | None, failure: SampleFailure) -> None:
        """An item was skipped; the batch it was drawn for counts as delivered
        when it is (or, when every item of it was skipped, by the iterator)."""
        with self.lock:
            self.failures.append(failure)

    def indices_of(self, tags: list[int]) -> list[Any]:
        return [None for _ in tags]

    def take_skip(self, stream: int) -> int:
        """Batches the stream must drop before its first one this epoch (once)."""
        return self._skips.pop(stream, 0)


class LoaderProgress:
    """A loader's position in its current epoch, kept across its iterators."""

    def __init__(self) -> None:
        self._stream: EpochStream | IterableStream | None = None
        self._epoch_rng: dict[str, Any] | None = None
        # A mid-epoch state loaded by load_state_dict, used by the next epoch start.
        self._resume: dict[str, Any] | None = None

    def fresh_copy(self) -> LoaderProgress:
        """For a copy of the loader: no epoch in progress, the loaded state
        (if any, not yet used) carried over."""
        copy = LoaderProgress()
        copy._resume = self._resume
        return copy

    def has_loaded_state(self) -> bool:
        """Whether a mid-epoch state was loaded and no epoch began since."""
        return self._resume is not None

    def loaded_samples(self) -> bool | None:
        """Whether the loaded mid-epoch state's epoch ran on single samples
        (False for an IterableDataset's streams); None where none is loaded."""
        resume = self._resume
        return None if resume is None else bool(resume["samples"])

    # -- the iterators' side -------------------------------------------------

    def begin_epoch(
        self,
        loader: Any,
        sampler_iter: Iterator[Any],
        epoch_rng: dict[str, Any],
        *,
        samples: bool,
        seed: int | None = None,
    ) -> EpochStream | IterableStream:
        """The stream of a new epoch: ``sampler_iter`` fresh, or the rest of a
        checkpointed epoch when a state was loaded (with that epoch's seed,
        where it kept one, in place of `seed`)."""
        resume, self._resume = self._resume, None
        batch_size = loader.batch_size or 1
        failures = None
        if resume is not None:
            failures = [SampleFailure.from_state(f) for f in resume.get("failures", ())]
        if loader._dataset_kind == _DatasetKind.Iterable:
            delivered = None if resume is None else resume["delivered_per_stream"]
            self._stream = IterableStream(sampler_iter, delivered, failures)
            return self._stream
        if resume is None:
            stream = EpochStream(sampler_iter, samples=samples, batch_size=batch_size, seed=seed)
        else:
            epoch_rng = resume.get("epoch_rng") or epoch_rng
            saved_seed = resume.get("seed")
            stream = EpochStream(
                self._resumed_sampler_iter(loader, resume),
                samples=samples,
                batch_size=batch_size,
                seed=seed if seed is None or saved_seed is None else saved_seed,
                carried=list(resume["undelivered"]),
                carried_tags=resume.get("undelivered_tags"),
                next_tag=resume.get("next_tag", 0),
                pulled=resume["pulled"],
                failures=failures,
            )
        self._stream, self._epoch_rng = stream, epoch_rng
        return stream

    def _resumed_sampler_iter(self, loader: Any, resume: dict[str, Any]) -> Iterator[Any]:
        index_sampler = loader._index_sampler
        mode = resume["mode"]
        if mode == "iterator":
            sampler_iter = iter(index_sampler)
            sampler_iter.load_state_dict(resume["sampler_state"])  # type: ignore[attr-defined]
            return sampler_iter
        if mode == "sampler":
            # Loaded by load_state_dict; the sampler goes on from there.
            return iter(index_sampler)
        epoch_rng = resume["epoch_rng"]
        _set_generator_states(loader, epoch_rng["generators"])
        _set_sampler_epochs(loader, epoch_rng["epochs"])
        with _global_rng(epoch_rng["global"]):
            sampler_iter = iter(index_sampler)
            # Draws the epoch's seed (torch's samplers draw on the first batch).
            taken = list(itertools.islice(sampler_iter, resume["pulled"] + 1))
        return itertools.chain(taken[resume["pulled"] :], sampler_iter)

    # -- state_dict / load_state_dict ---------------------------------------

    def state_dict(self, loader: Any) -> dict[str, Any]:
        state: dict[str, Any] = {
            "format": _FORMAT,
            "version": STATE_VERSION,
            "generators": _generator_states(loader),
            "sampler_epochs": _sampler_epochs(loader),
            "dataset_state": None,
            "epoch": None,
            "loader": _shape_of(loader),
        }
        if _has_state(loader.dataset):
            state["dataset_state"] = loader.dataset.state_dict()
        stream = self._stream
        if self._resume is not None:
            # Loaded and not yet iterated: hand the same state on.
            state["epoch"] = self._resume
        elif stream is not None and not stream.ended:
            with stream.lock:
                state["epoch"] = self._epoch_state(loader, stream)
        return state

    def take_stream_skip(self, stream: int) -> int:
        """For an IterableDataset's worker starting an epoch: batches to drop first."""
        current = self._stream
        return current.take_skip(stream) if isinstance(current, IterableStream) else 0

    def _epoch_state(self, loader: Any, stream: EpochStream | IterableStream) -> dict[str, Any]:
        # Skipped samples, as plain values: counted against the budget after
        # a resume, and (being done with) not loaded again.
        failures = [failure.as_state() for failure in stream.failures]
        if isinstance(stream, IterableStream):
            return {
                "mode": "streams",
                "samples": False,
                "streams": max(1, loader.num_workers),
                "delivered_per_stream": dict(stream.delivered_per_stream),
                "failures": failures,
            }
        positions, undelivered = stream.undelivered()
        epoch: dict[str, Any] = {
            "failures": failures,
            "undelivered": undelivered,
            # Positions in the epoch, and the epoch's seed: a resumed sample
            # draws what it would have (minato._task.seed).
            "undelivered_tags": positions,
            "next_tag": stream.next_tag,
            "seed": stream.seed,
            "pulled": stream.pulled,
            "samples": bool(stream._samples),
            "epoch_rng": None,
            "sampler_name": None,
            "sampler_state": None,
        }
        sampler_iter = stream.sampler_iterator
        stateful = _stateful_sampler(loader)
        if _has_state(sampler_iter):
            epoch["mode"] = "iterator"
            epoch["sampler_state"] = sampler_iter.state_dict()  # type: ignore[attr-defined]
        elif stateful is not None:
            # A sampler's own state tells its position in an epoch; between
            # epochs torch's samplers start over at iter(), so none is kept.
            epoch["mode"] = "sampler"
            epoch["sampler_name"], sampler = stateful
            epoch["sampler_state"] = sampler.state_dict()
        else:
            epoch["mode"] = "replay"
            epoch["epoch_rng"] = self._epoch_rng
        return epoch

    def load_state_dict(self, loader: Any, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(
                "load_state_dict expects a state from minato.DataLoader.state_dict(), "
                f"but got {type(state).__name__}"
                + (f" with keys {sorted(map(str, state))}" if isinstance(state, dict) else "")
            )
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"this state was saved by minato state format version {state.get('version')}; "
                f"this minato reads version {STATE_VERSION}"
            )
        _check_well_formed(state)
        _check_fits(state.get("loader"), _shape_of(loader))
        epoch = state["epoch"]
        # A reordering loader's epoch may have run on whole batches
        # (minato._loader.whole_batches): it resumes on them.
        reorders = loader._reorders_samples()
        resumes_whole_batches = reorders and loader._whole_batches.eligible(loader)
        if (
            epoch is not None
            and epoch["samples"] != reorders
            and not (resumes_whole_batches and not epoch["samples"])
        ):
            kinds = {True: "reorders single samples", False: "keeps whole batches"}
            raise ValueError(
                f"this state was saved by a loader that {kinds[epoch['samples']]}; this "
                f"loader {kinds[not epoch['samples']]}: build it with the same batch_size, "
                "sampler, in_order and num_workers>0"
            )
        if epoch is not None and epoch["mode"] == "streams":
            streams = max(1, loader.num_workers)
            if loader._dataset_kind != _DatasetKind.Iterable or epoch["streams"] != streams:
                raise ValueError(
                    f"this state was saved by a loader of an IterableDataset with "
                    f"{epoch['streams']} streams (num_workers, or 1 for num_workers=0); "
                    f"this loader has {streams}: each worker's stream is resumed on its own"
                )
        _set_generator_states(loader, state["generators"])
        _set_sampler_epochs(loader, state["sampler_epochs"])
        if epoch is not None and epoch["mode"] == "sampler":
            sampler = _samplers(loader).get(epoch["sampler_name"])
            if not _has_state(sampler):
                raise ValueError(
                    f"this state holds the state of loader.{epoch['sampler_name']}, "
                    "but this loader's has no load_state_dict"
                )
            sampler.load_state_dict(epoch["sampler_state"])
        if state["dataset_state"] is not None and _has_state(loader.dataset):
            loader.dataset.load_state_dict(state["dataset_state"])
        self._resume = epoch
        self._stream = None


# -- does a state fit the loader? -----------------------------------------------

# What a mid-epoch state needs, by how the epoch is resumed.
_EPOCH_KEYS = {
    "streams": ("samples", "streams", "delivered_per_stream", "failures"),
    "iterator": ("samples", "undelivered", "pulled", "failures", "sampler_state"),
    "sampler": ("samples", "undelivered", "pulled", "failures", "sampler_name", "sampler_state"),
    "replay": ("samples", "undelivered", "pulled", "failures", "epoch_rng"),
}
_STATE_KEYS = ("generators", "sampler_epochs", "dataset_state", "epoch")


def _malformed(what: str) -> ValueError:
    return ValueError(f"this minato DataLoader state is malformed: {what}")


def _check_well_formed(state: dict[str, Any]) -> None:
    """Every key the state will be read for, now rather than at ``iter()``."""
    for key in _STATE_KEYS:
        if key not in state:
            raise _malformed(f"the key {key!r} is missing")
    epoch = state["epoch"]
    if epoch is None:
        return
    if not isinstance(epoch, dict):
        raise _malformed(f"'epoch' should be a dict or None, not {type(epoch).__name__}")
    mode = epoch.get("mode")
    if mode not in _EPOCH_KEYS:
        raise _malformed(f"unknown epoch mode {mode!r}")
    for key in _EPOCH_KEYS[mode]:
        if key not in epoch:
            raise _malformed(f"the epoch's key {key!r} is missing")
    if mode == "replay" and not isinstance(epoch["epoch_rng"], dict):
        raise _malformed("the epoch's 'epoch_rng' should be a dict")
    if mode != "streams" and not (
        isinstance(epoch["undelivered"], list) and isinstance(epoch["pulled"], int)
    ):
        raise _malformed("the epoch's 'undelivered' should be a list and 'pulled' an int")


def _length(sized: Any) -> int | None:
    try:
        return len(sized)
    except TypeError:
        return None


def _shape_of(loader: Any) -> dict[str, Any]:
    """What a saved position means only for the same loader: its batches
    (batch_size, drop_last), its dataset's length and its samplers' kinds."""
    batch_sampler = loader.batch_sampler
    return {
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "dataset_length": _length(loader.dataset),
        "sampler": type(loader.sampler).__qualname__,
        "batch_sampler": None if batch_sampler is None else type(batch_sampler).__qualname__,
    }


def _check_fits(saved: Any, here: dict[str, Any]) -> None:
    """A state from another loader would resume another epoch: indices
    delivered twice or never. States saved before this check are taken as
    they are."""
    if saved is None:
        return
    if not isinstance(saved, dict):
        raise _malformed(f"'loader' should be a dict, not {type(saved).__name__}")
    what = {
        "batch_size": "batch_size",
        "drop_last": "drop_last",
        "dataset_length": "len(dataset)",
        "sampler": "sampler type",
        "batch_sampler": "batch_sampler type",
    }
    for key, name in what.items():
        if key in saved and saved[key] != here[key]:
            raise ValueError(
                f"this state was saved by a DataLoader with {name} {saved[key]!r}; this one "
                f"has {here[key]!r}: a position in another loader's epoch would deliver "
                "samples twice or never. Restore it into a DataLoader built the same way."
            )
