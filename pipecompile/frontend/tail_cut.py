"""Cut a batch-coupled tail off a traced model: the body runs per micro-batch, the tail once.

A model whose mixing op only reaches its outputs (CLIP's image x text logits, a loss over the
batch inside the model: a ``tail`` coupling, ``passes/batch_coupling``) is split in two
graphs. The body is the model up to the values the tail reads: it returns those, batch first,
and the pipeline compiles it as the model (balanced, split into stages, run per micro-batch).
The tail takes them joined along the batch (every micro-batch's rows) and returns the model's
outputs; the runtime runs it once a step on the last stage's device, and the loss on what it
returns (``runtime/state/whole_loss``). A weight the tail reads (CLIP's logit scale) leaves
the body as one copy per row (``weight.expand(rows, ...)``: its gradient sums back over the
rows) and the tail reads the first; values the tail reads that hold no sample (a range over
the batch size) are computed in the tail again, on the whole batch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from pipecompile.errors import MicrobatchError
from pipecompile.frontend.fake_prop import propagate_fake
from pipecompile.ir.graph.graph_copy import copy_graph_module
from pipecompile.ir.graph.tail import Tail
from pipecompile.ir.graph.traced import Traced
from pipecompile.ir.graph.user_frame import op_place

__all__ = ["Tail", "cut_tail"]


def cut_tail(
    traced: Traced,
    starts: list[str],
    kinds: Any,
    micro: list[torch.Tensor],
) -> tuple[Traced, Tail]:
    """The body of ``traced`` and its tail from the nodes ``starts`` (the tail couplings'),
    whose ``kinds`` (``BatchFacts``) say which values are per sample; ``micro`` the inputs
    the trace was made on (the body's values are propagated on them again).

    Raises:
        MicrobatchError: a value the tail reads holds the batch in another dimension than
            the first (it cannot be joined), naming it.
    """
    graph = traced.module.graph
    nodes = list(graph.nodes)
    output = nodes[-1]
    tail = _tail_nodes(nodes, {n for n in nodes if n.name in starts})
    tail |= _read_again(tail, kinds)
    reads = [n for n in nodes if n not in tail and n.op != "output" and set(n.users) & tail]
    flat = list(output.args[0])
    passed = [a for a in flat if isinstance(a, fx.Node) and a not in tail and a not in reads]
    boundary = list(dict.fromkeys([*reads, *passed]))
    for node in boundary:
        if node.op != "get_attr" and not kinds.batch_first(node.name):
            raise MicrobatchError(
                f"{op_place(node)} is read by the part of the model that mixes the samples of "
                "the batch, and its value does not hold the batch in its first dimension, so "
                "the micro-batches' values cannot be joined for it; compile with "
                "--microbatches 1"
            )
    body = _body(traced, tail, boundary, micro)
    module = _tail_graph(traced, tail, boundary, flat)
    names = tuple(a.name if isinstance(a, fx.Node) else str(a) for a in flat)
    return body, Tail(module, tuple(n.name for n in boundary), names, traced.output_spec)


def _tail_nodes(nodes: list[fx.Node], starts: set[fx.Node]) -> set[fx.Node]:
    """The nodes that depend on ``starts`` (the output aside)."""
    tail: set[fx.Node] = set()
    for node in nodes:
        if node.op != "output" and (node in starts or any(n in tail for n in node.all_input_nodes)):
            tail.add(node)
    return tail


def _read_again(tail: set[fx.Node], kinds: Any) -> set[fx.Node]:
    """What the tail computes again on the whole batch rather than read joined: values that
    hold no sample's (a range over the batch size) and per-sample values without the batch
    first (a transpose of an embedding), with what they are computed from, up to values that
    hold the batch first, the inputs and the weights."""
    found: set[fx.Node] = set()
    todo = [n for t in tail for n in t.all_input_nodes if n not in tail]
    while todo:
        node = todo.pop()
        if node in found or node.op in ("placeholder", "get_attr"):
            continue
        if kinds.batch_first(node.name) or node.op == "call_module":
            continue  # read joined (a module's own call keeps its weights in the body)
        found.add(node)
        todo += [n for n in node.all_input_nodes if n not in tail]
    return found


def _body(
    traced: Traced, tail: set[fx.Node], boundary: list[fx.Node], micro: list[torch.Tensor]
) -> Traced:
    """``traced`` without ``tail``, returning ``boundary`` (each weight as a copy per row)."""
    module = copy_graph_module(traced.module)  # the traced graph is left as it was
    names = {n.name: n for n in module.graph.nodes}
    rows_of = next(names[n.name] for n in boundary if n.op != "get_attr")
    out = [n for n in module.graph.nodes if n.op == "output"][0]
    values = []
    with module.graph.inserting_before(out):
        rows = module.graph.call_function(torch.ops.aten.sym_size.int, (rows_of, 0))
        for node in boundary:
            mine = names[node.name]
            if node.op == "get_attr":
                one = module.graph.call_function(torch.ops.aten.unsqueeze.default, (mine, 0))
                shape = [rows, *mine.meta["val"].shape]
                mine = module.graph.call_function(torch.ops.aten.expand.default, (one, shape))
            values.append(mine)
    out.args = (tuple(values),)
    module.graph.eliminate_dead_code()  # the tail's nodes, read by nothing now
    module.recompile()
    propagate_fake(module, micro)
    spec = pytree.tree_flatten(tuple(range(len(values))))[1]
    return replace(traced, module=module, output_spec=spec)


def _tail_graph(
    traced: Traced, tail: set[fx.Node], boundary: list[fx.Node], flat: list[Any]
) -> fx.GraphModule:
    """The tail as a graph of its own: a placeholder per boundary value (a weight's copies:
    the first row), the tail's nodes, the model's flat outputs."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in boundary:
        placeholder = graph.placeholder(node.name)
        placeholder.meta = dict(node.meta)
        if node.op == "get_attr":
            first = graph.call_function(torch.ops.aten.select.int, (placeholder, 0, 0))
            first.meta = dict(node.meta)
            env[node] = first
        else:
            env[node] = placeholder
    for node in traced.module.graph.nodes:
        if node in tail:
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[a] if isinstance(a, fx.Node) else a for a in flat))
    return fx.GraphModule(traced.module, graph)  # the modules its calls name (no weights)
