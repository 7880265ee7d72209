"""Analysis: activation_memory — bytes each stage stores per micro-batch for its backward.

Requires: a verified StageGraph whose markers carry fake values (``meta["val"]``).
Guarantees: per stage, ``saved``: the bytes autograd keeps between forward and backward for
one micro-batch (parameters and buffers excluded, shared storage counted once), measured by
running the stage on fake tensors under ``saved_tensors_hooks``; and ``inputs``: the bytes of
the stage's tensor inputs, all a recomputed forward keeps. The runtime measures the same
two figures on real tensors with the same rule (``ir.saved_bytes``). A stage whose sizes follow
its data (a count read with ``.item()``, as LLaVA's image tokens) is bounded instead: every
value it computes, at the example's sizes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from pipecompile.ir.graph.lower import lower_stage
from pipecompile.ir.graph.markers import is_recv
from pipecompile.ir.graph.saved_bytes import StageMemory, count_saved, tensor_bytes
from pipecompile.ir.graph.stage_graph import Stage, StageGraph
from pipecompile.ir.graph.swapped_call import functional_call

__all__ = ["StageMemory", "activation_memory"]


def activation_memory(graph: StageGraph) -> tuple[StageMemory, ...]:
    """Per stage, what a plain and a recomputed forward store (see the module docstring)."""
    return tuple(_stage_memory(stage) for stage in graph.stages)


def _stage_memory(stage: Stage) -> StageMemory:
    if not _reads_data(stage):
        return _measured(stage)
    try:  # fake tensors cannot always follow a size read from the data
        return _measured(stage)
    except Exception:  # noqa: BLE001 - any failure of fake propagation past a data read
        return _upper_bound(stage)


_DATA_READS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "unique"}


def _reads_data(stage: Stage) -> bool:
    """Whether the stage reads a value from its data (``.item()``, ``nonzero``): sizes after
    it follow the data, which fake tensors do not hold."""
    for node in stage.module.graph.nodes:
        name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        if node.op in ("call_function", "call_method") and name in _DATA_READS:
            return True
    return False


def _measured(stage: Stage) -> StageMemory:
    module = lower_stage(stage)
    values, received = _input_values(stage)
    # a shape environment: a value read from data (``.item()``) becomes a symbol, not an error
    with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()) as mode:
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
        inputs = _concrete(tensor_bytes(args))
        saved = _concrete(sum(seen.values()))
    if saved is None or inputs is None:  # sizes that follow the data (a count read by .item())
        return _upper_bound(stage)
    return StageMemory(saved=saved, inputs=inputs)


def _concrete(value: Any) -> int | None:
    """``value`` as an int: a symbolic size by its example's value, None where it has none
    (a size read from the data)."""
    if isinstance(value, int):
        return value
    hint = getattr(getattr(value, "node", None), "hint", None)
    return int(hint) if hint is not None else None


def _upper_bound(stage: Stage) -> StageMemory:
    """What the stage could store at most, where a size follows the data: every value it
    computes, at the example's sizes (each ``meta["val"]`` the trace recorded)."""
    computed = [n.meta.get("val") for n in stage.module.graph.nodes if n.op.startswith("call")]
    received = [n.meta.get("val") for n in stage.module.graph.nodes if n.op == "placeholder"]
    received += [n.meta.get("val") for n in stage.module.graph.nodes if is_recv(n)]
    return StageMemory(saved=_bytes(computed), inputs=_bytes(received))


def _bytes(values: list[Any]) -> int:
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            count = _concrete(value.numel())
            total += (count or 0) * value.element_size()
    return total


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
