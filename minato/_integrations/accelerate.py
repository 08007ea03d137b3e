"""minato loaders kept through Hugging Face Accelerate.

``Accelerator.prepare(loader)`` rebuilds every loader it is given from the
name ``DataLoader`` that ``accelerate.data_loader`` bound to torch's class
at import, passing torch's keyword arguments only: a minato loader would
come back as torch's, its options gone. ``accelerate.skip_first_batches``
(what Trainer resumes with) rebuilds it the same way.

Once a minato loader exists, that name is replaced by `AcceleratedDataLoader`,
which builds minato's class where the loader being rebuilt is a minato
loader (found by the batch sampler or dataset accelerate hands on) and
torch's otherwise. The rest of accelerate's wrapping is kept as it is:
the ``DataLoaderShard`` around the loader, its ``BatchSamplerShard`` (each
process its own batches of the same sequence, as torch's loaders get them
under accelerate), device placement, ``GradientState``. After
``prepare_data_loader`` (a public method, wrapped), the shard carries
minato's ``state_dict()`` in ``save_state``/``load_state``, and a minato
loader without a ``device`` of its own delivers straight to the GPU
accelerate places batches on (its side-stream prefetch).

Both patches check first that accelerate still looks as expected; where it
does not, they warn once and leave accelerate alone (its loaders are then
torch's, as without minato)."""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from types import ModuleType
from typing import Any

import torch
import torch.utils.data

from minato._util.imports import when_imported
from minato._util.warn_once import warn_once

_TorchDataLoader = torch.utils.data.DataLoader

# Live minato loaders, oldest first: what a rebuilt loader may be a copy of.
_loaders: list[weakref.ref[Any]] = []
_lock = threading.Lock()
# The attributes that lead from a wrapping sampler or dataset to the one
# it wraps (BatchSamplerShard, SkipBatchSampler, IterableDatasetShard).
_WRAPPED = ("batch_sampler", "dataset")
_MAX_WRAPPING = 8


def register(loader: Any) -> None:
    """A minato loader was built: accelerate rebuilds it as minato's, once
    (and whenever) accelerate is imported."""
    with _lock:
        _loaders[:] = [ref for ref in _loaders if ref() is not None]
        _loaders.append(weakref.ref(loader))
    when_imported("accelerate.data_loader", _hook_data_loader)
    when_imported("accelerate.accelerator", _hook_accelerator)


def _live_loaders() -> list[Any]:
    """Newest first."""
    with _lock:
        found = [ref() for ref in reversed(_loaders)]
    return [loader for loader in found if loader is not None]


def _wrapped_chain(obj: Any) -> list[Any]:
    """`obj` and what it wraps, outermost first."""
    chain = []
    while obj is not None and len(chain) < _MAX_WRAPPING:
        chain.append(obj)
        obj = next((getattr(obj, name) for name in _WRAPPED if hasattr(obj, name)), None)
    return chain


def _source_of(dataset: Any, kwargs: dict[str, Any]) -> Any:
    """The minato loader accelerate is rebuilding, or None: the one whose
    batch sampler (or sampler given as one) the new loader's wraps; with
    neither given (an IterableDataset's loader), the one whose dataset the
    new dataset is or wraps."""
    samplers = kwargs.get("batch_sampler")
    if samplers is None:
        samplers = kwargs.get("sampler")
    loaders = _live_loaders()
    if samplers is not None:
        chain = {id(obj) for obj in _wrapped_chain(samplers)}
        for loader in loaders:
            own = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
            if id(own) in chain:
                return loader
        return None
    datasets = {id(obj) for obj in _wrapped_chain(dataset)}
    return next((loader for loader in loaders if id(loader.dataset) in datasets), None)


class _Dispatch(type):
    """``AcceleratedDataLoader(...)`` builds minato's class or torch's; it
    reads as torch's class to ``isinstance`` and ``issubclass``."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        dataset = args[0] if args else kwargs.get("dataset")
        source = _source_of(dataset, kwargs)
        if source is None:
            return _TorchDataLoader(*args, **kwargs)
        kwargs = {name: value for name, value in kwargs.items() if name != "dataset"}
        return source._rebuilt(dataset, args[1:], kwargs, _skip_sampler_class())

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _TorchDataLoader)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _TorchDataLoader)


class AcceleratedDataLoader(metaclass=_Dispatch):
    """``accelerate.data_loader.DataLoader`` once minato is hooked in: a
    rebuilt minato loader stays minato's, any other loader is torch's."""


def _skip_sampler_class() -> type | None:
    module = sys.modules.get("accelerate.data_loader")
    found = getattr(module, "SkipBatchSampler", None)
    return found if isinstance(found, type) else None


def _hook_data_loader(module: ModuleType) -> None:
    current = getattr(module, "DataLoader", None)
    if current is AcceleratedDataLoader:
        return
    adapter = getattr(module, "DataLoaderAdapter", None)
    if current is not _TorchDataLoader or not isinstance(adapter, type):
        warn_once(
            "accelerate-data-loader",
            "minato: accelerate.data_loader no longer builds torch's DataLoader by that "
            "name; Accelerator.prepare() will return torch's DataLoader in place of a "
            "minato one (minato's options are not carried over)",
        )
        return
    module.DataLoader = AcceleratedDataLoader  # type: ignore[attr-defined]


def _hook_accelerator(module: ModuleType) -> None:
    accelerator = getattr(module, "Accelerator", None)
    original = getattr(accelerator, "prepare_data_loader", None)
    if accelerator is None or original is None:
        warn_once(
            "accelerate-prepare",
            "minato: accelerate.Accelerator.prepare_data_loader was not found; "
            "save_state() will not carry a minato loader's state_dict()",
        )
        return
    if getattr(original, "_minato_wrapped", None) is not None:
        return

    @functools.wraps(original)
    def prepare_data_loader(self: Any, data_loader: Any, *args: Any, **kwargs: Any) -> Any:
        config = getattr(self, "dataloader_config", None)
        if is_minato_loader(data_loader) and getattr(config, "use_stateful_dataloader", False):
            # With this set, accelerate builds torchdata's StatefulDataLoader
            # by its own import: a minato loader is stateful already.
            config.use_stateful_dataloader = False
            try:
                prepared = original(self, data_loader, *args, **kwargs)
            finally:
                config.use_stateful_dataloader = True
        else:
            prepared = original(self, data_loader, *args, **kwargs)
        adopt(prepared)
        return prepared

    prepare_data_loader._minato_wrapped = original  # type: ignore[attr-defined]
    accelerator.prepare_data_loader = prepare_data_loader


def is_minato_loader(loader: Any) -> bool:
    """Whether `loader` is a minato DataLoader (this module cannot import the
    class: it lies below it)."""
    return hasattr(loader, "_rebuilt")


def base_loader(prepared: Any) -> Any:
    """The loader an accelerate wrapper iterates (itself if none)."""
    return vars(prepared).get("base_dataloader", prepared)


def adopt(prepared: Any) -> None:
    """An accelerate loader over a minato loader: its state goes into
    accelerate's checkpoints, and its batches to accelerate's device."""
    loader = base_loader(prepared)
    if loader is prepared or not is_minato_loader(loader):
        return
    # accelerate's save_state/load_state carry a loader's state_dict() when
    # this is set (torchdata's StatefulDataLoader); minato's always has one.
    prepared.use_stateful_dataloader = True
    device = vars(prepared).get("device")
    if device is not None and loader.device is None and torch.device(device).type == "cuda":
        # minato copies each batch on a side stream ahead of the loop; the
        # shard's send_to_device then finds it on the device already.
        loader.device = torch.device(device)


def rebuilds(loader: Any) -> list[Any]:
    """`loader` and the loaders rebuilt from it (and from those), in order:
    an epoch resumed with ``skip_first_batches`` runs on a rebuilt one."""
    found = [loader]
    for _ in range(_MAX_WRAPPING):
        successor = getattr(found[-1], "_rebuilt_as", None)
        following = successor() if successor is not None else None
        if following is None:
            break
        found.append(following)
    return found
