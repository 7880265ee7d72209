"""Analysis: activation_memory — bytes each stage stores per micro-batch for its backward.

Requires: a verified StageGraph whose markers carry fake values (``meta["val"]``).
Guarantees: per stage, ``saved``: the bytes autograd keeps between forward and backward for
one micro-batch (parameters and buffers excluded, shared storage counted once), measured by
running the stage on fake tensors under ``saved_tensors_hooks``; and ``inputs``: the bytes of
the stage's tensor inputs, all a recomputed forward keeps. The runtime measures the same
two figures on real tensors with the same rule (``ir.saved_bytes``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from pipecompile.ir.lower import lower_stage
from pipecompile.ir.markers import is_recv
from pipecompile.ir.saved_bytes import StageMemory, count_saved, tensor_bytes
from pipecompile.ir.stage_graph import Stage, StageGraph
from pipecompile.ir.swapped_call import functional_call

__all__ = ["StageMemory", "activation_memory"]


def activation_memory(graph: StageGraph) -> tuple[StageMemory, ...]:
    """Per stage, what a plain and a recomputed forward store (see the module docstring)."""
    return tuple(_stage_memory(stage) for stage in graph.stages)


def _stage_memory(stage: Stage) -> StageMemory:
    module = lower_stage(stage)
    values, received = _input_values(stage)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        args = [
            _fake_input(values[name], grad=name in received)
            if isinstance(values[name], torch.Tensor)
            else values[name]
            for name in stage.inputs
        ]
        # The stage runs on fake copies of its parameters and buffers, kept alive here, so
        # the saved-tensor hook can tell them (and views of them) from activations.
        state: dict[str, torch.Tensor] = {
            name: mode.from_tensor(t)
            for name, t in [*module.named_parameters(), *module.named_buffers()]
        }
        with count_saved(list(state.values())) as seen:
            functional_call(module, state, tuple(args))
        inputs = tensor_bytes(args)
    return StageMemory(saved=sum(seen.values()), inputs=inputs)


def _input_values(stage: Stage) -> tuple[dict[str, Any], set[str]]:
    """Each stage input's fake value, and the names received from other stages (the runtime
    makes those leaves that require grad; model inputs come as the user gave them)."""
    values, received = {}, set()
    for node in stage.module.graph.nodes:
        if node.op == "placeholder":
            values[str(node.target)] = node.meta.get("val")
        elif is_recv(node):
            values[str(node.args[0])] = node.meta.get("val")
            received.add(str(node.args[0]))
    return values, received


def _fake_input(value: torch.Tensor, *, grad: bool) -> torch.Tensor:
    """A new fake tensor like ``value`` (called inside the fake mode, so nothing is allocated)."""
    fake = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
    return fake.requires_grad_(grad and fake.is_floating_point())
