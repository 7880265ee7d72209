"""Notes and warnings: one line on stderr that a user should know about and that is no error.

A command run with ``-q`` prints nothing but errors: inside ``quiet()`` notes are left out
(warnings, something that went through but is likely wrong, are still printed)."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator

__all__ = ["note", "warning", "quiet"]

_QUIET = contextvars.ContextVar("pipecompile_quiet_notes", default=False)


def note(text: str) -> None:
    """Print ``pipecompile: note: TEXT`` to stderr at once (not inside ``quiet()``)."""
    if not _QUIET.get():
        print(f"pipecompile: note: {text}", file=sys.stderr, flush=True)


def warning(text: str) -> None:
    """Print ``pipecompile: warning: TEXT`` to stderr at once: something that went through
    but is likely wrong (a prediction far from what was measured)."""
    print(f"pipecompile: warning: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """While the block runs, notes are left out (when ``on``: a command's ``-q``)."""
    token = _QUIET.set(on)
    try:
        yield
    finally:
        _QUIET.reset(token)
