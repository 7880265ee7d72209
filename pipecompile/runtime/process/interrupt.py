"""Ctrl-C and SIGTERM stop a `pipecompile` command alike: one line, exit status 130.

A local and a distributed run stop the same way (docs/DISTRIBUTED.md, "Stopping a run"); their
line names the step that was running and the saved step `--resume` would continue from.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipecompile.files.names import LATEST

__all__ = ["EXIT_INTERRUPTED", "interrupted_line", "sigterm_as_ctrl_c", "user_stop"]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell shows for Ctrl-C; SIGTERM ends alike


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within, SIGTERM raises KeyboardInterrupt as Ctrl-C does, so both stop a command the same
    way (a no-op outside the main thread, where handlers cannot be set).

    Example:
        >>> with sigterm_as_ctrl_c():
        ...     pass  # `kill PID` now interrupts this block like Ctrl-C
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def user_stop(err: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or SIGTERM) behind ``err``: ``err`` itself, or one it was raised while
    handling (torch's file writer, interrupted mid-write, fails again closing the file and
    raises that instead), else None."""
    seen: set[int] = set()
    found: BaseException | None = err
    while found is not None and id(found) not in seen:
        if isinstance(found, KeyboardInterrupt):
            return found
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return None


def interrupted_line(done: int | None, steps: int | None, save: Path | None) -> str:
    """The line to print after an interrupt.

    Args:
        done: training steps finished when the run stopped (None: training had not begun).
        steps: the run's length in steps (None: until the data ends).
        save: the ``--save`` directory, if any.

    Returns:
        e.g. ``pipecompile: interrupted at step 17/100; ck/latest is step_15``.
    """
    where = ""
    if done is not None:
        shown = "?" if steps is None else steps
        running = steps is None or done < steps
        where = f" at step {done + 1}/{shown}" if running else f" after step {done}/{shown}"
    return f"pipecompile: interrupted{where}{_kept(save)}"


def _kept(save: Path | None) -> str:
    if save is None:
        return ""
    pointer = save / LATEST
    try:
        name = pointer.read_text().strip()
    except OSError:
        name = ""
    return f"; {pointer} is {name}" if name else f"; {save} holds no saved step yet"
