"""When the default loader loads whole batches rather than single samples.

A reordering loader (``in_order=None`` over a shuffling sampler) builds its
batches from single samples, so that a sample running late moves to a later
batch instead of holding its own. Every sample then crosses the training
process's engine on its own, which, with many workers on cheap samples,
costs more than whole batches do (benchmarks/RESULTS.md, session 14: whole
batches 1.2-1.5x the samples/s of the sample path at 16 and 32 workers).
An epoch that moved no sample delivered torch's batches in torch's order,
which whole batches in order load as well, each sample drawing the same
random numbers (minato._task.seed). So, from `MIN_WORKERS` workers on, once
an epoch's first batches on single samples moved none (`SWITCH_AFTER` of
every worker's, counting those in flight, with enough of the epoch left),
or only a few that whole batches would not have waited on
(`moved_few_and_short`), the rest of the epoch and the loader's next epochs
load whole batches;
where the training loop then waits on a batch as long as a late sample
would have made it wait (`stalls`), or takes longer per batch
(`EpochPace`) than it did on single samples, the loader's next epochs go
back to single samples for good.
"""

from __future__ import annotations

import time
from typing import Any

# The fewest workers whose loader may move to whole batches: below, the
# sample path's own cost is small beside the samples' and its guarantee is
# kept.
MIN_WORKERS = 8
# An epoch on single samples hands over to whole batches once this many
# batches of every worker's moved no sample, the pool's first ones included
# and those already on their way counted (the engine delivers those begun
# before whole batches start, and gives the others back to be loaded whole:
# waiting for them too, or for more past the pool's start, kept the epoch
# on single samples twice as long, benchmarks/RESULTS.md sessions 16, 18
# and 19)...
SWITCH_AFTER = 2
# ...of which at least this many delivered: the loop's pace on them is what
# whole batches are judged against.
SWITCH_AFTER_DELIVERED = 1
# ...and while at least this many batches of every worker's are left: at
# an epoch's end a whole batch takes a worker a batch's time, where single
# samples share the last batches among all workers.
SWITCH_ROUNDS_LEFT = 4
# A wait on a batch that a sample moved to a later batch would have spared
# the loop: at least this long (a late sample's floor, README "Order and
# slow samples")...
STALL_FLOOR_S = 0.1
# ...and this many times a batch's loading time (its samples at the median
# fetch time). A worker's batches come a batch's time apart, and workers
# that started together deliver theirs together: the loop may wait about
# that long on any batch.
STALL_BATCH_TIMES = 3


# An epoch of whole batches keeps them only if the loop took at most this
# much longer per batch than on the single samples that earned them (a
# share, and seconds beside it for loops that never wait): an epoch that
# moved no sample may still have gained from the whole pool working on the
# next batch (skewed samples: hol.py).
PACE_TOLERANCE = 0.15
PACE_TOLERANCE_S = 0.0005

# An epoch's first batches hand over having moved at most this share of
# its samples, in at most this many separate stalls for each of its samples
# (one at least: tasks that ran at overlapping times are one stall), each
# of which, once done, lasted less than a stall (`stalls`): on cores that
# are taken, threads kept off them for a moment move their samples, several
# at once, where whole batches would have waited as long for them, once,
# and no longer, and an epoch that stayed on single samples for it ran well
# under whole batches' rate (benchmarks/RESULTS.md, sessions 22 and 23).
# Samples that are often, or very, slow keep it on single samples (hol.py's
# every fifth). So does an epoch that ran to its end on single samples earn
# whole batches for the next.
MOVED_SHARE = 0.01
MOVED_STALLS_SHARE = 0.001


def _moved_few(moved: int) -> str:
    samples = "sample" if moved == 1 else "samples"
    return f"moved {moved} {samples}, none that whole batches would have waited on"


def moved_few_and_short(
    moved: int,
    samples: int,
    moved_stalls: int,
    running: int,
    longest: float | None,
    batch_samples: int,
    fetch_p50: float | None,
) -> bool | None:
    """Whether an epoch's `moved` samples of its first `samples`, moved in
    `moved_stalls` separate stalls, leave it free to hand over to whole
    batches: few, in few stalls, none still loading (`running`), and the
    longest stall (`longest`) under what `stalls` calls one; None while one
    still loads (asked again later)."""
    if moved > MOVED_SHARE * samples:
        return False
    if running:
        return None
    if moved_stalls > max(1.0, MOVED_STALLS_SHARE * samples):
        return False
    return longest is not None and not stalls(longest, batch_samples, fetch_p50)


class WholeBatchChoice:
    """One loader's choice, kept across its epochs and iterators."""

    def __init__(self) -> None:
        self.earned = False
        self.lost = False
        # The loop's time per batch over the single samples that earned
        # whole batches (see EpochPace).
        self.samples_pace: float | None = None
        # Why the loader loads as it does now, for stats().
        self.reason: str | None = None

    @staticmethod
    def eligible(loader: Any) -> bool:
        """Whether the loader's options leave the choice to minato: the
        default order and sample timeout, and enough workers."""
        return (
            loader.in_order_given() is None
            and loader.sample_timeout == "auto"
            and loader.num_workers >= MIN_WORKERS
        )

    def wanted(self, loader: Any) -> bool:
        return self.earned and not self.lost and self.eligible(loader)

    def samples_epoch_ended(
        self,
        moved: int,
        batches: int,
        spent: float,
        few_and_short: bool = False,
        loading_pace: float | None = None,
    ) -> None:
        """An epoch on single samples ran to its end, having moved `moved`
        samples (`few_and_short`: none that whole batches would have waited
        on, see moved_few_and_short); the loop took `spent` seconds over its
        `batches` (see EpochPace), the pool `loading_pace` seconds to load
        each batch's samples (judged as in `samples_part_ended`: a short
        epoch's batches may all have been loaded ahead of the loop)."""
        if self.lost or batches == 0:
            return
        self.earned = moved == 0 or few_and_short
        if self.earned:
            self.samples_pace = max(spent / batches, loading_pace or 0.0)
            what = "moved no sample" if moved == 0 else _moved_few(moved)
            self.reason = f"an epoch of {batches} batches {what}: whole batches, in order"

    def samples_part_ended(
        self, batches: int, spent: float, moved: int = 0, loading_pace: float | None = None
    ) -> None:
        """An epoch's first `batches` on single samples (past the settling
        ones) moved no sample, or `moved` that whole batches would not have
        waited on, the loop taking `spent` seconds over them and the pool
        `loading_pace` seconds to load each batch's samples meanwhile: the
        rest of the epoch loads whole batches.

        Whole batches are then judged against the slower of the two paces.
        The loop's pace alone reads fast where the pool's start left samples
        ready: the first batch waits for the last thread to start while the
        others load ahead, and the batches after it come at once (with many
        workers on busy cores it read well under whole batches' steady pace,
        which then lost them: benchmarks/RESULTS.md, session 23). The pool's
        pace alone reads fast where the loop sets the pace and the pool fills
        its queue."""
        self.earned = True
        self.samples_pace = max(spent / batches, loading_pace or 0.0)
        what = "moved no sample" if moved == 0 else _moved_few(moved)
        self.reason = (
            f"{batches} batches of an epoch on single samples {what}: whole "
            "batches, in order, from its next batch"
        )

    def whole_epoch_ended(self, batches: int, spent: float) -> None:
        """An epoch of whole batches ran to its end; the loop took `spent`
        seconds over its `batches`."""
        if self.lost or batches == 0 or self.samples_pace is None:
            return
        pace = spent / batches
        if pace > self.samples_pace * (1 + PACE_TOLERANCE) + PACE_TOLERANCE_S:
            self.lost = True
            self.reason = (
                f"the loop took {pace * 1e3:.1f} ms a batch on whole batches against "
                f"{self.samples_pace * 1e3:.1f} ms on single samples: single samples again"
            )

    def stalled(self, waited: float) -> None:
        """An epoch of whole batches kept the loop waiting as a late sample would."""
        self.lost = True
        self.reason = (
            f"the loop waited {waited * 1e3:.0f} ms on a batch of whole samples: "
            "single samples again, a late one moving to a later batch"
        )


class EpochPace:
    """The loop's time per batch over an epoch (from one batch handed to it
    to the next: its own step and its wait together), once its first
    `settling` batches (the workers starting, in every epoch of a loader
    without persistent workers) are in: what the two ways of loading are
    compared by. Not the wait alone: on single samples many workers take
    the GIL from the training thread between its waits, which the wait
    does not show and the pace does."""

    def __init__(self, settling: int) -> None:
        self.settling = settling
        self.seen = 0
        self.batches = 0
        self.spent = 0.0
        self._last: float | None = None

    def add(self) -> bool:
        """Counts a batch handed to the loop now; whether it is past the
        settling batches."""
        now = time.perf_counter()
        last, self._last = self._last, now
        self.seen += 1
        if self.seen <= self.settling or last is None:
            return False
        self.batches += 1
        self.spent += now - last
        return True


def whole_pool_start(figures: dict[str, Any], num_workers: int, adaptive: bool) -> int:
    """The size a pool of whole batches starts at when an epoch hands over
    to it, given the sample pool's `figures` (its engine's stats).

    A fixed pool keeps its size. An adaptive one goes on from the count its
    controller stands by, not from a growth step still to be judged: that
    step would be kept unjudged (a controller shrinks a pool only while its
    queue stays full: 32 threads doubled to 64 just before the hand-over
    stayed at 64 for the epoch, benchmarks/RESULTS.md, session 26). Its
    growth starts by doubling again: a doubling that did not pay on single
    samples may on whole batches, which cost the training process less per
    sample (16 workers of 3 ms: 64 threads)."""
    if not adaptive:
        return num_workers
    return max(1, figures["settled_workers"] or figures["workers"])


def stalls(waited: float, samples: int, fetch_p50: float | None) -> bool:
    """Whether a wait on a batch of whole samples is one a late sample would
    have made: past the floor and a few of the batch's loading times."""
    batch_time = samples * (fetch_p50 or 0.0)
    return waited > max(STALL_FLOOR_S, STALL_BATCH_TIMES * batch_time)
