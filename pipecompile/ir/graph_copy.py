"""Copy a GraphModule so a pass can annotate or rewrite the copy and leave its input untouched."""

from __future__ import annotations

import copy

import torch.fx as fx

__all__ = ["copy_graph_module"]


def copy_graph_module(module: fx.GraphModule) -> fx.GraphModule:
    """A new GraphModule over the same parameters with a copied graph (node meta copied shallowly,
    so each node's ``meta`` dict can be changed without touching the original)."""
    graph = fx.Graph()
    output = graph.graph_copy(module.graph, {})
    graph.output(output)
    for old, new in zip(module.graph.nodes, graph.nodes):
        new.meta = copy.copy(old.meta)
    return fx.GraphModule(module, graph, class_name=type(module).__name__)
