"""An exception caught in a worker, carried to the training loop's thread.

torch's ``ExceptionWrapper`` formats the traceback where it is built. On
CPython up to 3.11.7, formatting a traceback calls ``ast.parse`` (to draw
its ``^^^^`` markers), and two threads parsing at once can make either one
raise ``SystemError: AST constructor recursion depth mismatch`` (gh-106905).
A worker *process* formats in a process of its own; a worker *thread* would
race with every ``ast.parse`` of the program (pytest's assertion rewriting,
``inspect``, a tokenizer's templates). So a worker thread only extracts the
traceback (its frames' file names, lines and source text, no parsing, no
frames kept alive); the text is formatted where it is read: on the training
loop's thread as the error is raised there, or as a worker process pickles
it for the loader.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from torch._utils import ExceptionWrapper


class WorkerError(ExceptionWrapper):
    """torch's ``ExceptionWrapper`` (same type, ``where`` and ``reraise``),
    its traceback formatted on first use, not on the thread that caught it."""

    def __init__(self, exc_info: Any = None, where: str = "in background") -> None:
        if exc_info is None:
            exc_info = sys.exc_info()
        self.exc_type = exc_info[0]
        self.where = where
        # compact=True, as traceback.format_exception builds it.
        self._extracted: traceback.TracebackException | None = traceback.TracebackException(
            *exc_info, compact=True
        )
        self._formatted: str | None = None

    @property  # type: ignore[override]  # torch's is a plain attribute
    def exc_msg(self) -> str:
        """``traceback.format_exception``'s text, formatted once, here."""
        if self._formatted is None:
            extracted, self._extracted = self._extracted, None
            assert extracted is not None
            self._formatted = "".join(extracted.format())
        return self._formatted

    @exc_msg.setter
    def exc_msg(self, text: str) -> None:
        self._extracted, self._formatted = None, text

    def __getstate__(self) -> dict[str, Any]:
        # Sent as text: a worker process formats it, in a process of its own.
        return {"exc_type": self.exc_type, "where": self.where, "_formatted": self.exc_msg}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.exc_type = state["exc_type"]
        self.where = state["where"]
        self._extracted = None
        self._formatted = state["_formatted"]
