"""Type stubs for minato's private extension module."""

from collections.abc import Callable
from typing import Any, final

import numpy

__all__ = [
    "ArenaBatch",
    "ArenaLeases",
    "ArenaPool",
    "ArenaWriter",
    "DEFAULT_MAX_PIXELS",
    "DecodeError",
    "Engine",
    "SampleEngine",
    "SampleLedger",
    "SlotLeaf",
    "SlotMap",
    "SlotRing",
    "Wire",
    "WireError",
    "_HAS_VIDEO",
    "_arena_batch",
    "_before_fork",
    "_cores_busy_time",
    "_decode_image",
    "_decode_images_into",
    "_decode_video",
    "_epoch_seed",
    "_gil_takes",
    "_load_npy",
    "_load_npz",
    "_own_status_bytes",
    "_private_dirty_bytes",
    "_runnable_wait",
    "_same_items",
    "_sample_begins",
    "_sample_seed",
    "_scalar_items_bytes",
    "_stack_into",
    "_thread_runnable_wait",
    "_uniform_leaves",
]

@final
class Engine:
    """Worker threads running ``make_worker(id)(epoch, payload)`` for each submitted payload."""

    def __new__(
        cls,
        make_worker: Callable[[int], Callable[[int, Any], Any]],
        exhausted: object,
        *,
        num_workers: int,
        max_in_flight: int,
        in_order: bool,
        round_robin: bool,
        shutdown_grace: float,
        max_workers: int | None = None,
    ) -> Engine: ...
    @property
    def num_workers(self) -> int: ...
    def can_submit(self) -> bool: ...
    def pending(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...
    def submit(self, payload: Any, samples: int = 1) -> bool: ...
    def next(self, timeout: float) -> Any: ...
    def fix_workers(self, workers: int) -> None: ...
    def adapt_workers(self) -> None: ...
    def new_epoch(self) -> None: ...
    def shutdown(self, grace: float) -> int: ...

@final
class SampleEngine:
    """Worker threads loading single samples (``make_worker(id)(epoch, indices)``),
    delivering batches built from whichever samples are ready first, each
    made by ``collate(tags, samples, error)`` on the engine's collate thread
    or, with ``collate_anywhere``, on the worker thread that completes it;
    or, where ``collate_here`` is given, a cheap batch by
    ``collate_here(tags, samples, error)`` on the consumer's thread (the
    workers' ``(tag, sample)`` pairs split, and ``error`` the first sample that
    is an ``error_type``, or None)."""

    def __new__(
        cls,
        make_worker: Callable[[int], Callable[[int, list[Any]], list[Any]]],
        collate: Callable[[list[int], list[Any], Any], Any],
        *,
        collate_here: Callable[[list[int], list[Any], Any], Any] | None,
        skipped_type: type,
        error_type: type,
        in_sequence: bool,
        num_workers: int,
        max_samples_in_flight: int,
        max_batch_size: int,
        sample_timeout: float | str | None,
        timeout_warmup: int,
        max_slow_in_flight: int,
        shutdown_grace: float,
        max_workers: int | None = None,
        drop_last: bool = False,
        collate_anywhere: bool = False,
    ) -> SampleEngine: ...
    @property
    def num_workers(self) -> int: ...
    @property
    def sample_timeout(self) -> float | None: ...
    @property
    def slow_samples(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...
    def can_submit(self) -> bool: ...
    def pending(self) -> int: ...
    def submit(
        self, ledger: SampleLedger, fresh: Any, seed: int | None, from_queue: int = 0
    ) -> bool: ...
    def withdraw_unstarted(self) -> list[tuple[list[int], list[Any]]]: ...
    def next(self, timeout: float) -> Any: ...
    def close_epoch(self) -> None: ...
    def set_task_costs(self, run_target: float, min_timeout: float) -> None: ...
    def take_skipped(self) -> list[Any]: ...
    def fix_workers(self, workers: int) -> None: ...
    def adapt_workers(self) -> None: ...
    def set_collate_anywhere(self, anywhere: bool) -> None: ...
    def new_epoch(self) -> None: ...
    def shutdown(self, grace: float) -> int: ...

class DecodeError(ValueError):
    """Data that minato.io cannot decode."""

# --- the worker-process wire (rust/bindings/wire.rs) ---

@final
class Wire:
    """One end of a worker process's socket, taken over from a ``socket.socket``."""

    def __new__(cls, sock: Any) -> Wire: ...
    def fileno(self) -> int: ...
    def send(self, data: bytes, fds: list[int]) -> None: ...
    def receive(self, timeout: float | None = None) -> tuple[bytes, list[int]]: ...
    def call(
        self, pid: int, data: bytes, fds: list[int], timeout: float | None = None
    ) -> tuple[bytes, list[int]]: ...
    def shutdown(self) -> None: ...

@final
class SlotRing:
    """A worker process's ring of sample slots (rust/bindings/slots.rs)."""

    def __new__(cls) -> SlotRing: ...
    def take(self, nbytes: int) -> tuple[int, tuple[int, int, int, int] | None] | None: ...
    def write(self, slot: int, data: Any) -> None: ...
    def give_back(self, slots: list[int], unannounce: list[int] = ...) -> None: ...
    def task_begins(self) -> bool: ...
    @property
    def free(self) -> int: ...
    @property
    def segments(self) -> int: ...
    @property
    def segment_slots(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...

@final
class SlotMap:
    """The loader's mapping of one worker process's ring."""

    def __new__(cls) -> SlotMap: ...
    def map(self, segment: int, fd: int, size: int, slot_bytes: int) -> None: ...
    def leaf(self, slot: int, nbytes: int, dtype: Any, shape: Any, is_array: bool) -> SlotLeaf: ...
    def take_freed(self) -> list[int]: ...

@final
class SlotLeaf:
    """A sample's tensor or array bytes in a slot (a buffer); its slot goes back when it goes."""

    @property
    def dtype(self) -> Any: ...
    @property
    def shape(self) -> Any: ...
    @property
    def is_array(self) -> bool: ...
    @property
    def nbytes(self) -> int: ...

def _uniform_leaves(batch: Any) -> bool: ...

# --- Batch arenas (rust/bindings/arenas.rs) ---

@final
class ArenaLeases:
    """The arenas a task holds lent until its answer is read."""

@final
class ArenaPool:
    """The loader's batch arenas: samples written into their places in their batch."""

    def __new__(cls, places: int) -> ArenaPool: ...
    def offer_layout(self, leaf_bytes: list[int]) -> None: ...
    def expect(self, first: int, offset: int, count: int) -> None: ...
    def new_epoch(self) -> None: ...
    def place(
        self, worker: int, task: Any
    ) -> tuple[
        list[tuple[int, int, int] | None],
        ArenaLeases,
        list[tuple[int, int, int, int, list[int]]],
        list[int],
    ]: ...
    def unannounce(self, worker: int, ids: list[int]) -> None: ...
    def forget_worker(self, worker: int) -> None: ...
    def leaf(
        self,
        arena: int,
        generation: int,
        place: int,
        leaf: int,
        nbytes: int,
        dtype: Any,
        shape: Any,
        is_array: bool,
    ) -> SlotLeaf: ...
    @property
    def free_arenas(self) -> int: ...
    @property
    def lent_arenas(self) -> int: ...

@final
class ArenaWriter:
    """A worker process's mapped batch arenas."""

    def __init__(self) -> None: ...
    def map(self, arena: int, fd: int, size: int, places: int, leaf_bytes: list[int]) -> None: ...
    def forget(self, arenas: list[int]) -> None: ...
    def place(self, arena: int, generation: int, place: int, leaf: int, data: Any) -> bool: ...

@final
class ArenaBatch:
    """One leaf of a whole batch as it lies in its arena (a buffer)."""

def _arena_batch(batch: Any) -> ArenaBatch | None: ...

# --- forks kept apart from threads' first attach (rust/bindings/fork_gate.rs) ---

def _before_fork() -> None: ...

# --- a dataset's registered lists, items untouched (rust/bindings/inherit.rs) ---

def _same_items(items: Any, snapshot: tuple[Any, ...]) -> bool: ...
def _scalar_items_bytes(items: Any) -> int: ...

# --- GIL takes counted (rust/bindings/gil_takes.rs) ---

def _gil_takes() -> int: ...

# --- whether cores are spare (rust/bindings/spare_cores.rs) ---

def _cores_busy_time() -> float | None: ...
def _runnable_wait() -> float | None: ...
def _thread_runnable_wait() -> float | None: ...

# --- memory figures from /proc (rust/bindings/proc_status.rs) ---

def _own_status_bytes(field: str) -> int | None: ...
def _private_dirty_bytes(pid: int) -> int | None: ...

# --- a run's samples reported as each begins (rust/bindings/sample_progress.rs) ---

def _sample_begins() -> None: ...

class WireError(ConnectionError):
    """A worker process sent something that is not a message of minato's wire."""

# --- per-sample seeds (rust/bindings/sample_seed.rs) ---

def _epoch_seed(base_seed: int, epoch: int) -> int: ...
def _sample_seed(epoch_seed: int, position: int) -> int: ...

@final
class SampleLedger:
    """An epoch's pending indices, each at its position in the epoch."""

    def __new__(
        cls,
        next_position: int = 0,
        carried_positions: list[int] = ...,
        carried: list[Any] = ...,
    ) -> SampleLedger: ...
    @property
    def queued(self) -> int: ...
    @property
    def next_position(self) -> int: ...
    def hand_out(self, from_queue: int, fresh: Any) -> list[tuple[int, Any]]: ...
    def delivered(self, positions: list[int]) -> None: ...
    def skipped(self, position: int) -> None: ...
    def indices_of(self, positions: list[int]) -> list[Any]: ...
    def requeue_pending(self) -> None: ...
    def undelivered(self) -> tuple[list[int], list[Any]]: ...

# --- collate fast path (rust/bindings/collate.rs) ---

def _stack_into(samples: list[Any], out: Any) -> None: ...

# --- minato.io: images (rust/bindings/io_image.rs) ---

DEFAULT_MAX_PIXELS: int

def _decode_image(
    data: Any,
    *,
    size: tuple[int, int] | None = None,
    mode: str = "RGB",
    max_pixels: int = ...,
) -> numpy.ndarray[Any, numpy.dtype[numpy.uint8]]: ...
def _decode_images_into(
    sources: list[Any],
    out: Any,
    *,
    size: tuple[int, int],
    mode: str = "RGB",
    max_pixels: int = ...,
) -> None: ...

# --- minato.io: arrays (rust/bindings/io_array.rs) ---

def _load_npy(
    data: Any, /
) -> tuple[
    numpy.ndarray[Any, numpy.dtype[numpy.uint8]] | None, int, tuple[str, tuple[int, ...], bool]
]: ...
def _load_npz(
    data: Any, /, max_bytes: int = ..., check_crc: bool = True
) -> tuple[
    numpy.ndarray[Any, numpy.dtype[numpy.uint8]] | None,
    list[
        tuple[
            str,
            numpy.ndarray[Any, numpy.dtype[numpy.uint8]] | None,
            int,
            int,
            tuple[str, tuple[int, ...], bool] | None,
        ]
    ],
]: ...

# --- minato.io: video (rust/bindings/io_video.rs) ---

_HAS_VIDEO: bool

def _decode_video(
    data: Any,
    *,
    num_frames: int,
    start: int = 0,
    stride: int = 1,
    size: tuple[int, int] | None = None,
    max_pixels: int | None = None,
) -> numpy.ndarray[Any, numpy.dtype[numpy.uint8]]: ...
