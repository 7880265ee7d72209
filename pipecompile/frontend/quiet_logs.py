"""Silence torch's own logs of a failure that the caller reports in one line of its own."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator

__all__ = ["quiet_logs", "held_stderr"]


@contextlib.contextmanager
def quiet_logs(*names: str) -> Iterator[None]:
    """While open, the loggers ``names`` print nothing below CRITICAL."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def held_stderr() -> Iterator[None]:
    """What is printed to sys.stderr while open is held back, and printed when the block
    succeeds (its warnings); dropped when it raises (torch.export prints a failing graph)."""
    held = io.StringIO()
    with contextlib.redirect_stderr(held):
        yield
    sys.stderr.write(held.getvalue())
