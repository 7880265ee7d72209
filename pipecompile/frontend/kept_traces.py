"""Traces kept for the length of a ``with traces_kept():`` block: a model compiled several
times with the same example (``--tune``'s candidate plans, a plan at several stage counts) is
traced once. Tracing through torch.export takes seconds a model; the passes after it copy the
traced graph and never change it (``pipecompile.ir.graph.graph_copy``).

A trace is reused only for the same model object in the same state (its module tree, each
module's class, mode and hooks, each parameter and buffer object with its shape, dtype and
device), the same example shapes and the same tracing options; anything else traces anew.
Outside such a block nothing is kept, so no model outlives the compiles that asked for it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from pipecompile.ir.graph.traced import Traced

__all__ = ["kept_trace", "traces_kept"]

_KEPT: ContextVar[dict[Hashable, Traced] | None] = ContextVar("pipecompile_traces", default=None)


@contextmanager
def traces_kept() -> Iterator[None]:
    """Within the block, ``kept_trace`` reuses a trace of the same model and example."""
    if _KEPT.get() is not None:  # nested: the outer block's traces serve
        yield
        return
    token = _KEPT.set({})
    try:
        yield
    finally:
        _KEPT.reset(token)


def kept_trace(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    options: Hashable,
    make: Callable[[], Traced],
) -> Traced:
    """``make()``, or within ``traces_kept`` the trace it gave earlier for ``model`` in the same
    state, ``inputs`` of the same shapes and the same ``options``."""
    kept = _KEPT.get()
    if kept is None:
        return make()
    key = (_state(model), _example(inputs), options, torch.is_grad_enabled())
    if key not in kept:
        kept[key] = make()
    return kept[key]


def _state(model: nn.Module) -> Hashable:
    """What a trace of ``model`` depends on besides its code and its tensors' values. The
    objects' ids are unique while the kept trace holds them (it references the model)."""
    modules = tuple(
        (
            name,
            id(m),
            type(m),
            m.training,
            id(m.__dict__.get("forward")),
            tuple(m._forward_hooks),
            tuple(m._forward_pre_hooks),
        )
        for name, m in model.named_modules(remove_duplicate=False)
    )
    tensors = tuple(
        (name, id(t), tuple(t.shape), t.dtype, t.device, t.requires_grad)
        for name, t in (
            *model.named_parameters(remove_duplicate=False),
            *model.named_buffers(remove_duplicate=False),
        )
    )
    return id(model), modules, tensors


def _example(inputs: dict[str, torch.Tensor]) -> Hashable:
    return tuple(
        (name, tuple(t.shape), t.dtype, t.device, t.requires_grad) for name, t in inputs.items()
    )
