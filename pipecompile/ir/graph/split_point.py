"""``pipecompile.split_point()``: a stage boundary written inside a model's forward.

Called while pipecompile traces the model with torch.fx, it records a ``split_point`` node;
``balance_stages`` starts a stage at the next op and removes the node. Called at any other
time it does nothing, so the model still runs eagerly. Under the torch.export fallback a
marker cannot be recorded; the front end then refuses the model and suggests ``--split-at``.

A model written for torch.distributed.pipelining marks its boundaries with ``pipe_split()``
(which calls the ``torch.ops.pippy._pipe_split`` op): while pipecompile traces, that op is
``split_point()``, so those boundaries are honoured the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch.fx as fx

from pipecompile.errors import SplitError

__all__ = ["split_point", "recording", "is_split_point", "split_requests"]

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
    peer = _peer_namespace()
    kept = peer.__dict__.get("_pipe_split") if peer is not None else None
    if peer is not None:
        peer._pipe_split = split_point  # pipe_split() looks it up at each call
    try:
        yield _missed
    finally:
        _tracers.pop()
        if peer is not None:
            if kept is None:
                del peer._pipe_split
            else:
                peer._pipe_split = kept


def _peer_namespace() -> Any:
    """``torch.ops.pippy`` where torch.distributed.pipelining defined it (the model imported
    ``pipe_split``), else None."""
    if "torch.distributed.pipelining" not in sys.modules:
        return None
    import torch

    return torch.ops.pippy


def is_split_point(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is split_point


def split_requests(split_at: Sequence[str] | Mapping[str, Any]) -> tuple[str, ...]:
    """``split_at`` as ``[before:|after:]MODULE_PATH`` strings; a mapping is
    torch.distributed.pipelining's ``split_spec`` (module path -> ``SplitPoint.BEGINNING``, a
    stage starts before the module, or ``SplitPoint.END``, after it).

    Raises:
        SplitError: a value of the mapping is no SplitPoint.
    """
    if not isinstance(split_at, Mapping):
        return tuple(split_at)
    where = {"BEGINNING": "before", "END": "after"}
    out = []
    for path, point in split_at.items():
        name = getattr(point, "name", None)
        if name not in where:
            raise SplitError(
                f"split_spec[{path!r}] is {point!r}; give SplitPoint.BEGINNING or "
                "SplitPoint.END (torch.distributed.pipelining), or split_at=('before:PATH', ...)"
            )
        out.append(f"{where[name]}:{path}")
    return tuple(out)
