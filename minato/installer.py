"""``minato.install()``: one line that makes a whole program's loaders
minato's, those that libraries build included.

Libraries such as transformers' ``Trainer``, webdataset's ``WebLoader`` or
a user's own helpers call ``torch.utils.data.DataLoader(...)`` themselves,
under whatever name they imported it by. After ``install()``, such a call
builds a minato DataLoader instead (`LibraryDataLoader`, a subclass of
minato's, itself a subclass of torch's): torch's class gets a ``__new__``
that hands out minato's, so every name bound to torch's class builds
minato's, and ``isinstance(loader, torch.utils.data.DataLoader)`` stays
true. What it leaves alone:

- subclasses of torch's DataLoader (torchdata's ``StatefulDataLoader``,
  litdata's ``StreamingDataLoader``, Lightning's and timm's own): they are
  built as themselves, since they run torch's iterator machinery;
- loaders built before ``install()``, and copies of torch's loaders
  (``copy``, ``pickle``);
- the process's other libraries: nothing is imported.

transformers' Trainer also gets a callback that saves the training loader's
position with each checkpoint and resumes it exactly
(minato._integrations.transformers). ``uninstall()`` undoes all of it.
``import minato`` installs nothing."""

from __future__ import annotations

import inspect
import threading
from typing import Any

import torch.utils.data

from minato._integrations import transformers as transformers_hooks
from minato._util.imports import forget, when_imported
from minato.dataloader import DataLoader

_TorchDataLoader = torch.utils.data.DataLoader
_lock = threading.Lock()
# The options install() was given, while installed; None while not.
_options: dict[str, Any] | None = None


class LibraryDataLoader(DataLoader[Any]):
    """A minato DataLoader built by a call to torch's class after
    ``minato.install()``: options given to ``install()`` are its defaults,
    and the call's own arguments win over them."""

    _takes_torch_arguments = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = _options or {}
        super().__init__(*args, **{**options, **kwargs})


def _new(cls: type, *args: Any, **kwargs: Any) -> Any:
    # A call with arguments builds a loader; copy and pickle call __new__
    # with none, and get torch's class back.
    if cls is _TorchDataLoader and (args or kwargs) and _options is not None:
        cls = LibraryDataLoader
    return object.__new__(cls)


_new._minato = True  # type: ignore[attr-defined]

# DataLoader keyword arguments install() accepts as defaults.
_ACCEPTED = frozenset(inspect.signature(DataLoader.__init__).parameters) - {
    "self",
    "dataset",
}


def install(**options: Any) -> None:
    """Make every ``torch.utils.data.DataLoader(...)`` call build a minato
    DataLoader, with `options` (any of its keyword arguments, e.g.
    ``on_error="skip"``) as defaults that a call's own arguments override.
    Calling it again replaces the options. See the module's docstring for
    its scope; ``uninstall()`` undoes it."""
    global _options
    unknown = sorted(set(options) - _ACCEPTED)
    if unknown:
        raise TypeError(f"install() got unexpected keyword arguments {unknown}")
    with _lock:
        current = _TorchDataLoader.__dict__.get("__new__")
        if current is not None and not getattr(current, "_minato", False):
            raise RuntimeError(
                "minato.install(): this torch's DataLoader defines __new__ itself; "
                "build minato.DataLoader directly instead"
            )
        _options = dict(options)
        _TorchDataLoader.__new__ = _new  # type: ignore[method-assign, assignment]
    when_imported("transformers.trainer", transformers_hooks.add_callback)


def uninstall() -> None:
    """Undo ``install()``: torch's class builds torch's loaders again (those
    built meanwhile stay minato's), and new Trainers get no callback."""
    global _options
    with _lock:
        # The __new__ stays, handing out torch's class again: deleting it
        # would leave CPython's constructor slot pointing to a __new__ that
        # rejects the loader's arguments.
        _options = None
    forget("transformers.trainer", transformers_hooks.add_callback)
    import sys

    trainer_module = sys.modules.get("transformers.trainer")
    if trainer_module is not None:
        transformers_hooks.remove_callback(trainer_module)


def installed() -> bool:
    """Whether ``install()`` is in effect."""
    return _options is not None
