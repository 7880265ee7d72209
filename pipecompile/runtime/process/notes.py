"""Notes and warnings: one line on stderr that a user should know about and that is no error."""

from __future__ import annotations

import sys

__all__ = ["note", "warning"]


def note(text: str) -> None:
    """Print ``pipecompile: note: TEXT`` to stderr at once."""
    print(f"pipecompile: note: {text}", file=sys.stderr, flush=True)


def warning(text: str) -> None:
    """Print ``pipecompile: warning: TEXT`` to stderr at once: something that went through
    but is likely wrong (a prediction far from what was measured)."""
    print(f"pipecompile: warning: {text}", file=sys.stderr, flush=True)
