"""Run a function on a module once it is imported: now, if it is already,
or right after its code ran, if it is imported later.

minato adapts a few libraries (Accelerate, transformers) to its loaders,
and must not import them itself: importing transformers takes seconds, and
a program that does not use them should not pay for them."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]

_hooks: dict[str, list[Hook]] = {}
_lock = threading.RLock()
_searching = threading.local()


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once the module `name` is imported (at once if
    it is). A hook is called once per module; adding it again does nothing."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            hooks = _hooks.setdefault(name, [])
            if hook not in hooks:
                hooks.append(hook)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    hook(module)


def forget(name: str, hook: Hook) -> None:
    """A hook added with `when_imported` and not yet called is not called."""
    with _lock:
        hooks = _hooks.get(name, [])
        if hook in hooks:
            hooks.remove(hook)
        if not hooks:
            _hooks.pop(name, None)


class _HookedLoader(importlib.abc.Loader):
    """The module's own loader, then the hooks waiting for it."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module's own loader, as its code expects to find it.
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        with _lock:
            hooks = _hooks.pop(self.name, [])
        for hook in hooks:
            hook(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of a module some hook waits for."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _hooks or getattr(_searching, "active", False):
            return None
        _searching.active = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            _searching.active = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, fullname)
        return spec


_finder = _Finder()
