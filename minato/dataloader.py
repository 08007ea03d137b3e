"""minato.DataLoader: torch's DataLoader, with worker threads run by a Rust engine."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch.utils.data
from torch.utils.data import Dataset, Sampler

from minato._iterator import _ThreadDataLoaderIter


class DataLoader(torch.utils.data.DataLoader):
    """A drop-in replacement for :class:`torch.utils.data.DataLoader`.

    The signature, defaults, validation and attributes are torch's (2.15),
    with one difference: ``in_order`` defaults to ``None``, which for now
    behaves as ``True`` (torch's order exactly).

    ``num_workers=0`` loads in the calling thread, exactly as torch does.
    ``num_workers=N`` runs N worker *threads* owned by minato's Rust engine;
    no subprocess is started, so ``multiprocessing_context`` is validated as
    torch does but otherwise unused. In a worker thread, ``get_worker_info()``
    returns that thread's own ``WorkerInfo`` (``worker_method="thread"``), with
    ``seed = base_seed + id`` and per-thread generators in ``rng`` (which
    ``torch.thread_safe_generator()`` returns); the process-wide ``random``,
    ``torch`` and numpy generators are left alone, since threads share them
    with the training loop. ``WorkerInfo.dataset`` is the dataset itself, not
    a copy. Exceptions from a worker read ``Caught {Type} in DataLoader worker
    thread {id} (sample index {idx})``.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
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
    ) -> None:
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
            in_order=True if in_order is None else in_order,
        )
        # Kept as given: Lightning re-creates loaders from these attributes.
        self.in_order = in_order  # type: ignore[assignment]  # torch declares bool

    def _get_iterator(self) -> torch.utils.data.dataloader._BaseDataLoaderIter:
        if self.num_workers == 0:
            return super()._get_iterator()
        return _ThreadDataLoaderIter(self)

    def check_worker_number_rationality(self) -> None:
        # torch warns when worker processes outnumber the cores. Threads that
        # wait on I/O or run GIL-free code are worth having beyond the core
        # count, so minato does not warn.
        return None
