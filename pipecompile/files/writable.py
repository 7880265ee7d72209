"""Checks, before any work starts, that a place pipecompile will write can be written: no file
where a directory is needed (or the reverse), no file above it, and a directory in which a
file can be created (probed by creating one and removing it: permission bits, read-only and
immutable mounts, and root all answer the same way)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pipecompile.errors import EmitError
from pipecompile.files.disk import disk_message

__all__ = ["check_directory", "check_file", "inside"]


def check_directory(path: Path, what: str) -> None:
    """Refuse a directory ``path`` that cannot be created or written into.

    ``what`` completes "cannot write ... to": e.g. "train state".

    Raises:
        EmitError: naming ``path`` and why.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise EmitError(f"cannot write {what} to {path}: it is a file; name a directory")
    _probe(path, what, path)


def check_file(path: Path, what: str, *, append: bool = False) -> None:
    """Refuse a file ``path`` that cannot be written (replaced, or with ``append`` appended
    to), or whose directory cannot be created.

    Raises:
        EmitError: naming ``path`` and why.
    """
    path = Path(path)
    if path.is_dir():
        raise EmitError(f"cannot write {what} to {path}: it is a directory; name a file")
    _probe(path.parent, what, path)
    if append and path.exists():
        try:
            with open(path, "ab"):
                pass
        except OSError as err:
            raise EmitError(disk_message(f"write {what} to", path, err)) from None


def _probe(directory: Path, what: str, shown: Path) -> None:
    """Create and remove a file in ``directory`` (or, where it does not exist yet, a directory
    in its nearest existing ancestor)."""
    base = directory
    while not base.exists() and base != base.parent:
        base = base.parent
    if base.exists() and not base.is_dir():
        raise EmitError(
            f"cannot write {what} to {shown}: {base} is a file, not a directory; choose "
            "another place"
        )
    try:
        if base == directory:
            handle, name = tempfile.mkstemp(prefix=".pipecompile-probe-", dir=base)
            os.close(handle)
            os.unlink(name)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".pipecompile-probe-", dir=base))
    except OSError as err:  # the probe's own name says nothing to the user
        bare = OSError(err.errno, err.strerror)
        raise EmitError(disk_message(f"write {what} to", shown, bare)) from None


def inside(path: Path, directory: Path) -> bool:
    """Whether ``path`` is ``directory`` or lies under it (after resolving links)."""
    path, directory = Path(path).resolve(), Path(directory).resolve()
    return path == directory or directory in path.parents
