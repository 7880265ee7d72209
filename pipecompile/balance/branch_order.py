"""Analysis: branch_order — topological orders of a branching graph that keep branches together.

Requires: a traced module.
Guarantees: ``candidate_orders`` lists the graph's op order first, then, if different, the
depth-first orders: a topological sort that always continues with the op that most recently
became ready, so a branch runs to its end (or to a join still waiting for another branch)
before the next branch starts; once taking a fork's users in order, once in reverse. Every
order is a valid topological order of the ops. ``reordered`` returns a copy of the module
whose graph lists its ops in a given order (placeholders and attributes first, output last).
A graph with an op that mutates its inputs or has side effects keeps its own order only.

Why: a stage boundary carries every value alive across it. Tracing records branches in the
order forward() wrote them, which may interleave independent branches (two towers computed
layer by layer) so every boundary carries both; the depth-first orders finish one branch
first, so a boundary inside it carries that branch's value and the other's input only.
The balancer solves the exact split for each candidate and keeps the best.
"""

from __future__ import annotations

import torch.fx as fx

from pipecompile.ir.graph.mutation import mutates

__all__ = ["candidate_orders", "reordered", "may_reorder"]

_OPS = ("call_function", "call_method", "call_module")


def candidate_orders(graph: fx.Graph) -> list[tuple[str, list[fx.Node]]]:
    """The op order of ``graph``, then distinct depth-first orders (see the module doc),
    each with its name."""
    ops = [n for n in graph.nodes if n.op in _OPS]
    orders = [("graph", ops)]
    if not may_reorder(ops):
        return orders
    for name, reverse in (("depth-first", False), ("depth-first, later branch first", True)):
        order = _depth_first(ops, reverse)
        if all(order != seen for _, seen in orders):
            orders.append((name, order))
    return orders


def may_reorder(ops: list[fx.Node]) -> bool:
    """No op mutates a value or has side effects, so any topological order computes the same."""
    return not any(mutates(n) for n in ops)


def _depth_first(ops: list[fx.Node], reverse: bool) -> list[fx.Node]:
    position = {n: k for k, n in enumerate(ops)}
    waiting = {n: sum(1 for a in set(n.all_input_nodes) if a in position) for n in ops}
    ready = [n for n in reversed(ops) if waiting[n] == 0]
    if reverse:
        ready.reverse()
    order: list[fx.Node] = []
    while ready:
        node = ready.pop()
        order.append(node)
        users = sorted((u for u in node.users if u in position), key=position.__getitem__)
        fresh = []
        for user in users:
            waiting[user] -= 1
            if waiting[user] == 0:
                fresh.append(user)
        ready.extend(fresh if reverse else reversed(fresh))
    assert len(order) == len(ops), "graph has a cycle"
    return order


def reordered(module: fx.GraphModule, order: list[fx.Node]) -> fx.GraphModule:
    """A copy of ``module`` whose ops appear in ``order`` (nodes of ``module``)."""
    nodes = list(module.graph.nodes)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    first = [n for n in nodes if n.op == "placeholder"] + [n for n in nodes if n.op == "get_attr"]
    for node in [*first, *order, *(n for n in nodes if n.op == "output")]:
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.lint()
    return fx.GraphModule(module, graph, class_name=type(module).__name__)
