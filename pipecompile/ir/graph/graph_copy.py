"""Copy a GraphModule so a pass can annotate or rewrite the copy and leave its input untouched."""

from __future__ import annotations

import copy

import torch.fx as fx
from torch import nn

__all__ = ["copy_graph_module", "graph_module"]


def copy_graph_module(module: fx.GraphModule) -> fx.GraphModule:
    """A new GraphModule over the same parameters with a copied graph (node meta copied shallowly,
    so each node's ``meta`` dict can be changed without touching the original)."""
    graph = fx.Graph()
    output = graph.graph_copy(module.graph, {})
    graph.output(output)
    for old, new in zip(module.graph.nodes, graph.nodes):
        new.meta = copy.copy(old.meta)
    return graph_module(module, graph, type(module).__name__)


def graph_module(root: nn.Module, graph: fx.Graph, class_name: str) -> fx.GraphModule:
    """``fx.GraphModule(root, graph)``, which copies only the attributes the graph reads, plus
    ``root``'s own parameters and buffers the graph does not read (a stage holds those of the
    model's that forward never reads, so that its state dict stays whole)."""
    module = fx.GraphModule(root, graph, class_name=class_name)
    persistent = root.state_dict(keep_vars=True)
    for name, param in root.named_parameters(recurse=False):
        if not hasattr(module, name):
            module.register_parameter(name, param)
    for name, buffer in root.named_buffers(recurse=False):
        if not hasattr(module, name):
            module.register_buffer(name, buffer, persistent=name in persistent)
    return module
