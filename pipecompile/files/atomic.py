"""Writing a file whole or not at all: into a hidden temporary file beside it, then renamed over
it (``os.replace`` replaces a file at once on one file system), so that a reader never sees
half a file and a write that fails leaves the file as it was."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["replace_atomically", "write_atomically"]


def write_atomically(path: Path, text: str, *, unique: bool = False) -> None:
    """Write ``text`` to ``path`` whole or not at all. ``unique``: the temporary file is named
    for this process and thread too (several writers of one path at once)."""
    replace_atomically(path, lambda tmp: tmp.write_text(text), unique=unique)


def replace_atomically(
    path: Path, write: Callable[[Path], object], *, unique: bool = False
) -> None:
    """Let ``write`` write a temporary file beside ``path``, then rename it over ``path``; the
    temporary file is removed when ``write`` fails."""
    path = Path(path)
    mine = f".{os.getpid()}.{threading.get_ident()}" if unique else ""
    tmp = path.with_name(f".{path.name}{mine}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
