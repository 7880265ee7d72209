"""Lower a stage's send/recv markers: received values become positional inputs, sent values
join the output tuple, in the stage's declared input and output order."""

from __future__ import annotations

import operator

import torch.fx as fx

from pipecompile.ir.graph.graph_copy import graph_module
from pipecompile.ir.graph.markers import is_recv, is_send
from pipecompile.ir.graph.stage_graph import Stage

__all__ = ["lower_stage"]


def lower_stage(stage: Stage) -> fx.GraphModule:
    """A GraphModule with ``forward(*stage.inputs) -> tuple(stage.outputs)`` and no markers."""
    source = stage.module.graph
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    by_name: dict[str, fx.Node] = {}
    for name in stage.inputs:
        by_name[name] = graph.placeholder(name)
    sent: dict[str, fx.Node] = {}
    for node in source.nodes:
        if node.op == "placeholder":
            env[node] = by_name[str(node.target)]
        elif is_recv(node):
            env[node] = by_name[str(node.args[0])]
        elif is_send(node):
            sent[str(node.args[1])] = env[node.args[0]]  # type: ignore[index]
        elif node.op == "output":
            returned = [env[n] for n in node.args[0]]  # type: ignore[union-attr, index]
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    values = [sent[name] for name in stage.outputs[: len(sent)]] + returned
    graph.output(tuple(values))
    _drop_unused_lookups(graph)
    return graph_module(stage.module, graph, f"Stage{stage.index}")


def _drop_unused_lookups(graph: fx.Graph) -> None:
    """Remove unused indexing and size queries (pure), which tracing leaves behind."""
    changed = True
    while changed:
        changed = False
        for node in reversed(graph.nodes):
            pure = node.target in (operator.getitem, getattr) or node.target in ("size", "dim")
            if pure and not node.users and node.op in ("call_function", "call_method"):
                graph.erase_node(node)
                changed = True
