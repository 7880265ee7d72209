"""A note: one line on stderr that a user should know about and that is no error."""

from __future__ import annotations

import sys

__all__ = ["note"]


def note(text: str) -> None:
    """Print ``pipecompile: note: TEXT`` to stderr at once."""
    print(f"pipecompile: note: {text}", file=sys.stderr, flush=True)
