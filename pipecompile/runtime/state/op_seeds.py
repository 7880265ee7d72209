"""Put ``seed_op`` calls into a loaded stage's forward, one before each random op.

The stage file stays as emitted (standalone, importing only torch); at load time the runtime
traces its forward with torch.fx, finds the random nodes (``ir/graph/random_ops``, the same test the
compiler used to write the stage's ``random_ops``; ``torch.get_default_device()`` stays a call),
inserts ``seed_op(name)`` before each and
binds the regenerated forward to the stage module itself, so its parameters (and those
``functional_call`` swaps in for weight stashing) are the ones read.
"""

from __future__ import annotations

import types
import warnings

import torch
import torch.fx as fx
from torch import nn

from pipecompile.ir.graph.random_ops import random_nodes
from pipecompile.runtime.state.random_state import seed_op

__all__ = ["seed_random_ops"]


def seed_random_ops(stage: nn.Module, names: list[str], label: str) -> bool:
    """Make ``stage``'s forward seed each of its random ops, ``names`` (the manifest's
    ``random_ops``, in order) from its name; returns whether it could. Where it cannot (the
    stage no longer traces, or an edit changed its random ops) it warns: that stage's random
    numbers then depend on the stage split, though recomputation still replays them."""
    if not names:
        return True
    try:
        traced = fx.GraphModule(stage, _StageTracer().trace(stage))
    except Exception as err:  # an edited stage that fx cannot trace: still runs, unseeded
        _warn(label, f"its forward does not trace ({type(err).__name__}: {err})")
        return False
    nodes = random_nodes(traced)
    if len(nodes) != len(names):
        _warn(label, f"it has {len(nodes)} random ops where the manifest lists {len(names)}")
        return False
    for node, name in zip(nodes, names):
        with traced.graph.inserting_before(node):
            traced.graph.call_function(seed_op, (name,))
    traced.recompile()
    _constants_as_buffers(stage)
    stage.forward = types.MethodType(type(traced).forward, stage)  # type: ignore[method-assign]
    return True


def _constants_as_buffers(stage: nn.Module) -> None:
    """The tensors fx kept as plain attributes of ``stage`` while tracing (constants the
    forward makes without reading an input, a parameter or a buffer) become non-persistent
    buffers, so moving the stage to a GPU moves them; the weights file never holds them."""
    for name, value in list(vars(stage).items()):
        if isinstance(value, torch.Tensor) and name.startswith("_tensor_constant"):
            delattr(stage, name)
            stage.register_buffer(name, value, persistent=False)


class _StageTracer(fx.Tracer):
    """fx's tracer, keeping the stage's ``torch.get_default_device()`` a call (fx would run it
    while tracing and bake the device it returns into the graph), and its buffers read when
    the forward runs: fx would run a computation on buffers alone while tracing and keep its
    result as a plain tensor attribute, a copy that neither a later load into the buffers
    (resumed state, weight stashing) nor a move to a GPU would reach."""

    proxy_buffer_attributes = True

    def trace(self, root: object, concrete_args: dict | None = None) -> fx.Graph:
        real = torch.get_default_device

        def default_device() -> object:
            return self.create_proxy("call_function", real, (), {})

        torch.get_default_device = default_device  # type: ignore[assignment]
        try:
            return super().trace(root, concrete_args)  # type: ignore[arg-type]
        finally:
            torch.get_default_device = real


def _warn(label: str, why: str) -> None:
    warnings.warn(
        f"{label}: random ops are seeded per stage, not per op, because {why}; its random "
        "numbers then depend on how the model is split (recompile to restore)",
        stacklevel=3,
    )
