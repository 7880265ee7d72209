"""One run at a time in a train state directory: a run that saves there holds a lock on
``DIR/.pipecompile-run.lock`` (``fcntl.flock``, released by the system however the run ends),
and a second run asking for the same ``--save`` is refused, naming the first."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from pipecompile.errors import EmitError

__all__ = ["LOCK", "holding"]

LOCK = ".pipecompile-run.lock"


@contextlib.contextmanager
def holding(root: Path, flag: str = "--save") -> Iterator[None]:
    """Hold ``root`` (created if missing) for this run.

    Raises:
        EmitError: another live run holds it; the message names its process.
    """
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise EmitError(
                f"{flag} {root} is in use by another run ({holder}); wait for it to end, or "
                f"give this run another {flag}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, since {time.strftime('%H:%M:%S')}".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
