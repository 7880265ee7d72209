"""Make an exported graph's views independent of the strides it was traced with.

``x.permute(...).contiguous().view(...)`` in the model reaches torch.export's graph as
``aten.view(permute)`` when the traced tensor happened to be contiguous after the permute:
``contiguous()`` of a contiguous tensor is the tensor itself, so nothing is recorded for it.
Whether it was depends on the kernel that made the tensor, and kernels choose their output
layout per device: torchvision's attention (``scaled_dot_product_attention``, then ``permute``)
is contiguous on the CPU that traced it and not on a GPU, where the stage's ``view`` then
fails. A stage also receives its inputs from another stage, in whatever layout arrived.

``aten.reshape`` is a view wherever a view is possible and a copy where it is not, with the
same values and gradients, so every view becomes a reshape, except a view that an op writes
into (or that views a value an op writes into): there the alias is what the model meant.
"""

from __future__ import annotations

import torch
import torch.fx as fx

__all__ = ["views_as_reshapes"]

_VIEW = torch.ops.aten.view.default
_RESHAPE = torch.ops.aten.reshape.default


def views_as_reshapes(module: fx.GraphModule) -> int:
    """Rewrite ``module``'s ``aten.view`` calls into ``aten.reshape`` in place, except those
    aliased by a write; returns how many were rewritten."""
    written = _written(module.graph)
    rewritten = 0
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target is _VIEW and node not in written:
            if node.args[0] not in written:
                node.target = _RESHAPE
                rewritten += 1
    if rewritten:
        module.recompile()
    return rewritten


def _written(graph: fx.Graph) -> set[fx.Node]:
    """Nodes whose value an op mutates, directly or through a view of it."""
    written: set[fx.Node] = set()
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        rest = schema.arguments[len(node.args) :]
        values = [*node.args, *(node.kwargs.get(a.name) for a in rest)]
        for argument, value in zip(schema.arguments, values):
            alias = argument.alias_info
            if alias is not None and alias.is_write and isinstance(value, fx.Node):
                written.add(value)
    grew = True
    while grew:  # a view's base is written when the view is, and the other way round
        grew = False
        for node in graph.nodes:
            if node.op == "call_function" and node.target is _VIEW:
                base = node.args[0]
                if (node in written) != (base in written):
                    written.update((node, base))  # type: ignore[arg-type]
                    grew = True
    return written
