"""Exact resume for ``transformers.Trainer`` with minato's loaders.

Trainer checkpoints no loader state: resuming mid-epoch, it skips as many
batches as were trained (``accelerate.skip_first_batches``). With minato
that would give each later sample another position in the epoch (so other
random draws) and, where batches were reordered, deliver samples twice or
never. `ResumeCallback` keeps the training loader's ``state_dict()`` in the
checkpoint's ``trainer_state.json`` (as an ``ExportableState`` callback's
state, which Trainer saves with every checkpoint) and loads it into the
loader when a run resumes; the loader accelerate then rebuilds to skip
batches resumes from that state instead (minato._integrations.accelerate).

The callback class subclasses transformers' own, so it is made only once
transformers is imported (`callback_class`)."""

from __future__ import annotations

import base64
import io
from types import ModuleType
from typing import Any

import torch

from minato._integrations import accelerate as accelerate_hooks
from minato._util.warn_once import warn_once

# The callback's name in trainer_state.json.
CALLBACK_NAME = "MinatoResumeCallback"

_made: dict[str, type] = {}


def _encode(state: dict[str, Any]) -> str:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _decode(text: str) -> dict[str, Any]:
    data = io.BytesIO(base64.b64decode(text.encode("ascii")))
    state: dict[str, Any] = torch.load(data, weights_only=True)
    return state


def _minato_loader(train_dataloader: Any) -> Any:
    """The minato loader under Trainer's training loader, or None."""
    if train_dataloader is None:
        return None
    loader = accelerate_hooks.base_loader(train_dataloader)
    return loader if accelerate_hooks.is_minato_loader(loader) else None


def callback_class(trainer_callback: Any) -> type:
    """The callback, made from ``transformers.trainer_callback`` (once)."""
    made = _made.get("callback")
    if made is not None:
        return made

    class MinatoResumeCallback(trainer_callback.TrainerCallback, trainer_callback.ExportableState):  # type: ignore[misc, name-defined]
        """Saves the training loader's ``state_dict()`` with each Trainer
        checkpoint and resumes the loader from it (minato.install() adds it
        to every Trainer)."""

        def __init__(self, loader_state: str | None = None) -> None:
            self.loader_state = loader_state
            self._loader: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            train_dataloader = kwargs.get("train_dataloader")
            loader = _minato_loader(train_dataloader)
            self._loader = loader
            saved = (state.stateful_callbacks or {}).get(CALLBACK_NAME)
            encoded = (saved or {}).get("attributes", {}).get("loader_state")
            if loader is None or not encoded or state.global_step == 0:
                return
            # Resuming: the epoch goes on from the checkpoint's position.
            train_dataloader.load_state_dict(_decode(encoded))

        def state(self) -> dict[str, Any]:
            return {"args": {}, "attributes": {"loader_state": self._current_state()}}

        def _current_state(self) -> str | None:
            if self._loader is None:
                return None
            # The loader the epoch runs on (after a restart, the one rebuilt
            # to resume runs the first epoch and the original the rest), and
            # the state its accelerate wrapper last took: the wrapper reads
            # one batch ahead, and takes the state just before.
            loaders = accelerate_hooks.rebuilds(self._loader)
            loader = max(loaders, key=lambda each: each._last_state_taken)
            state = loader._last_state_dict
            if state is None:
                state = loader.state_dict()
            return _encode(state)

    MinatoResumeCallback.__qualname__ = CALLBACK_NAME
    _made["callback"] = MinatoResumeCallback
    return MinatoResumeCallback


def add_callback(trainer_module: ModuleType) -> None:
    """Every Trainer made from now on has the callback."""
    defaults = getattr(trainer_module, "DEFAULT_CALLBACKS", None)
    from_module = getattr(trainer_module, "TrainerCallback", None)
    if not isinstance(defaults, list) or from_module is None:
        warn_once(
            "transformers-callbacks",
            "minato: transformers.trainer.DEFAULT_CALLBACKS was not found; a Trainer "
            "resumed mid-epoch skips batches as it does with torch's DataLoader",
        )
        return
    import transformers.trainer_callback as trainer_callback

    callback = callback_class(trainer_callback)
    if callback not in defaults:
        defaults.append(callback)


def remove_callback(trainer_module: ModuleType) -> None:
    defaults = getattr(trainer_module, "DEFAULT_CALLBACKS", None)
    callback = _made.get("callback")
    if isinstance(defaults, list) and callback in defaults:
        defaults.remove(callback)
