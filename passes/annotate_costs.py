"""Pass: annotate_costs — record each node's forward FLOPs, parameter bytes and activation bytes.

Requires: every node carries ``meta["val"]`` (fake values, attached by the front end).
Guarantees: a copy of the module whose nodes carry a NodeInfo with flops, param_bytes and
activation_bytes; the input module is left untouched.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from pipecompile.balance.flops import is_contraction, is_convolution, node_flops
from pipecompile.ir.graph.graph_copy import copy_graph_module
from pipecompile.ir.graph.node_info import with_info

__all__ = ["annotate_costs"]


def annotate_costs(module: fx.GraphModule, *, root: nn.Module) -> fx.GraphModule:
    """Return a copy of ``module`` whose nodes carry FLOPs and byte counts.

    Args:
        module: a traced graph module whose nodes have ``meta["val"]``.
        root: the module that owns the graph's parameters (the original model).

    Returns:
        A new GraphModule; ``pipecompile.ir.graph.node_info.info(node)`` reads the annotation.
    """
    out = copy_graph_module(module)
    for node in out.graph.nodes:
        with_info(
            node,
            flops=node_flops(node, out),
            contraction=is_contraction(node, out),
            convolution=is_convolution(node, out),
            param_bytes=_param_bytes(node, out),
            activation_bytes=_value_bytes(node.meta.get("val")) if node.op != "get_attr" else 0,
        )
    return out


def _param_bytes(node: fx.Node, module: fx.GraphModule) -> int:
    if node.op == "get_attr":
        return _value_bytes(_fetch(module, str(node.target)))
    if node.op == "call_module":
        return sum(
            _value_bytes(t) for t in module.get_submodule(str(node.target)).state_dict().values()
        )
    return 0


def _fetch(module: nn.Module, target: str) -> object:
    owner, _, name = target.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, name)


def _value_bytes(value: object) -> int:
    return sum(
        t.numel() * t.element_size()
        for t in pytree.tree_leaves(value)
        if isinstance(t, torch.Tensor)
    )
