"""Whether a ``@pipecompile.pipeline`` model runs its own forward() or its compiled pipeline.

While pipecompile traces a model, and while ``run --check`` computes the eager reference, a
decorated model must run the forward its class defines; the decorator reads ``TRACING``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["TRACING", "tracing"]

TRACING: contextvars.ContextVar[bool] = contextvars.ContextVar("pipecompile_tracing", default=False)


@contextmanager
def tracing() -> Iterator[None]:
    """Within the block, a ``@pipecompile.pipeline`` module runs its own forward() (so it
    can be traced) instead of its compiled pipeline."""
    token = TRACING.set(True)
    try:
        yield
    finally:
        TRACING.reset(token)
