"""Python helpers that ``torch.fx.wrap`` keeps as opaque calls, and tracing through them.

A library registers a helper with ``torch.fx.wrap`` (torchvision's ``stochastic_depth`` and
Swin's ``_get_relative_position_bias``) so that fx records one call of it instead of its ops.
A stage file imports only torch, so such a call cannot be written there: the front end finds
these calls and traces the model again with the helpers unregistered, so that their ops are
recorded like any other code.
"""

from __future__ import annotations

import builtins
import contextlib
import operator
from collections.abc import Iterator

import torch.fx as fx
from torch.fx import _symbolic_trace

__all__ = ["opaque_calls", "inlining_wrapped"]

# Modules whose functions fx's generated code writes without importing anything but torch, and
# pipecompile's own markers (split_point), which the compiler removes.
_WRITABLE = ("torch", "_operator", operator.__name__, builtins.__name__, "pipecompile")


def opaque_calls(graph: fx.Graph) -> list[fx.Node]:
    """The ``call_function`` nodes of ``graph`` whose function is not torch's or Python's own."""
    return [
        n
        for n in graph.nodes
        if n.op == "call_function"
        and str(getattr(n.target, "__module__", "") or "").split(".")[0] not in _WRITABLE
    ]


@contextlib.contextmanager
def inlining_wrapped() -> Iterator[None]:
    """While open, fx traces through the functions other libraries than torch registered with
    ``torch.fx.wrap``."""
    registered = _symbolic_trace._wrapped_fns_to_patch
    saved = dict(registered)
    for key, where in saved.items():
        if str(where.get("__name__", "")).split(".")[0] not in _WRITABLE:
            del registered[key]
    try:
        yield
    finally:
        registered.update(saved)
