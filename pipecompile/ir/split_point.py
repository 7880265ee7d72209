"""``pipecompile.split_point()``: a stage boundary written inside a model's forward.

Called while pipecompile traces the model with torch.fx, it records a ``split_point`` node;
``balance_stages`` starts a stage at the next op and removes the node. Called at any other
time it does nothing, so the model still runs eagerly. Under the torch.export fallback a
marker cannot be recorded; the front end then refuses the model and suggests ``--split-at``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.fx as fx

__all__ = ["split_point", "recording", "is_split_point"]

_tracers: list[fx.Tracer] = []
_missed: list[int] = []  # calls while export traced the model


def split_point() -> None:
    """Start a new pipeline stage here (see the module docstring).

    Example:
        >>> def forward(self, x):                                   # doctest: +SKIP
        ...     x = self.encoder(x)
        ...     pipecompile.split_point()
        ...     return self.decoder(x)
    """
    if _tracers and _tracers[-1] is not None:
        _tracers[-1].create_node("call_function", split_point, (), {}, name="split_point")
    elif _tracers:
        _missed.append(1)


@contextmanager
def recording(tracer: fx.Tracer | None) -> Iterator[list[int]]:
    """Within the block, ``split_point()`` adds a node to ``tracer``'s graph; with None
    (another tracer runs the model) the calls are counted in the yielded list instead."""
    _tracers.append(tracer)  # type: ignore[arg-type]
    _missed.clear()
    try:
        yield _missed
    finally:
        _tracers.pop()


def is_split_point(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is split_point
