"""Split a traced decoding step (``step_trace``) into stages at block boundaries.

Stage ``k`` runs blocks ``bounds[k]`` (a range, possibly empty), the embedding on the first
stage and the head on the last. Each op goes where its data puts it:

- an op inside block ``i`` (by its recorded module path) runs on block ``i``'s stage, and
  block ``i``'s keys and values are that stage's inputs (its cache);
- an op that reads only the positions, the mask and buffers (rotary tables, sizes)
  and writes nothing is *free*: every stage that needs it computes it, nothing is sent for it;
- any other op runs on the latest stage among its inputs', or on the last stage where it
  follows the last block (the final norm, the head).

A stage's inputs are the values an earlier stage made that it or a later one reads (carried
down the chain: ``carried``), then ``positions``, ``mask`` and its blocks' caches
(``keys_<i>``, ``values_<i>``); it returns what later stages read, the last stage the logits.
Pure: the step's graph is not changed."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch import nn

from pipecompile.generation.step_trace import GenerateError
from pipecompile.ir.graph.graph_copy import copy_graph_module
from pipecompile.ir.graph.mutation import mutates

__all__ = ["StepStage", "split_step", "block_of", "STEP_INPUTS"]

STEP_INPUTS = ("positions", "mask")
_DROPPED = ("_assert", "sym_constrain_range")


@dataclass
class StepStage:
    """One stage of a step: its module (flat parameters and buffers), input and output names,
    and for each of its tensors the model's name (``params``) or, for a tensor the model's
    state dict lacks (a non-persistent buffer, a constant), its value (``constants``)."""

    index: int
    module: fx.GraphModule
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    layers: tuple[int, ...]
    params: dict[str, str] = field(default_factory=dict)
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    constant_names: dict[str, str] = field(default_factory=dict)  # each one's name in the model


def block_of(node: fx.Node, prefix: str) -> int | None:
    """The block (its index in the list at ``prefix``) whose module made ``node``, if any."""
    for path, _ in (node.meta.get("nn_module_stack") or {}).values():
        if path.startswith(prefix):
            head = path[len(prefix) :].split(".")[0]
            if head.isdigit():
                return int(head)
    return None


def _clean(gm: fx.GraphModule) -> fx.Graph:
    """The step's graph without export's guards and assertions, and with every size read off
    the token ids (or a cache's rows) read off the positions instead (the same sizes: a stage
    past the first has no ids, and a stage has only its own blocks' caches)."""
    graph = gm.graph
    for node in reversed(list(graph.nodes)):
        name = getattr(node.target, "__name__", str(node.target))
        if node.op == "call_module" and node.target == "_guards_fn":
            graph.erase_node(node)
        elif node.op == "call_function" and name.startswith(_DROPPED) and not node.users:
            graph.erase_node(node)
    holders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    ids, positions = holders["ids"], holders["positions"]
    for node in graph.nodes:  # ids and positions have one shape, a cache as many rows
        if node.target is not torch.ops.aten.sym_size.int:
            continue
        source, dim = node.args[0], node.args[1]
        if source is ids or (source.name.startswith("kv_") and dim == 0):
            node.args = (positions, dim)
    return graph


def _assign(
    graph: fx.Graph, gm: fx.GraphModule, prefix: str, layer_stage: list[int], last: int
) -> tuple[dict[fx.Node, int], set[fx.Node]]:
    """Each op's stage, and the free ops (computed wherever they are read)."""
    stage: dict[fx.Node, int] = {}
    free: set[fx.Node] = set()
    after: set[fx.Node] = set()  # ops that follow the last block
    final = len(layer_stage) - 1
    params = {name for name, _ in gm.named_parameters()}
    for node in graph.nodes:
        if node.op == "placeholder":
            if node.name in STEP_INPUTS:
                free.add(node)
            elif node.name.startswith("kv_"):
                stage[node] = layer_stage[int(node.name[3:]) // 2]
            else:
                stage[node] = 0
            continue
        if node.op == "get_attr":  # a buffer is free; a parameter goes where it is read
            if node.target not in params:
                free.add(node)
            continue
        if node.op == "output":
            continue
        inputs = node.all_input_nodes
        block = block_of(node, prefix)
        if all(i in free for i in inputs) and not mutates(node):
            free.add(node)  # (a size a block reads first, and later blocks again)
        elif block is not None and block < len(layer_stage):
            stage[node] = layer_stage[block]
            if block == final:
                after.add(node)
        elif any(i in after for i in inputs):
            stage[node] = last
            after.add(node)
        else:
            stage[node] = max((stage[i] for i in inputs if i in stage), default=0)
    return stage, free


def split_step(
    gm: fx.GraphModule,
    *,
    prefix: str,
    bounds: tuple[tuple[int, int], ...],
    model_names: set[str],
    kind: str,
) -> list[StepStage]:
    """``gm`` (a traced step) as ``len(bounds)`` stages; ``prefix`` is the module path of
    the block list in the step (``model.<blocks>.``), ``model_names`` the model's state-dict
    names (a tensor of another name is kept as a constant).

    Raises:
        GenerateError: an op reads a value of a later stage (a block reads what a later
            block makes), naming it.
    """
    layer_stage = [k for k, (a, b) in enumerate(bounds) for _ in range(a, b)]
    last = len(bounds) - 1
    gm = copy_graph_module(gm)
    graph = _clean(gm)
    stage, free = _assign(graph, gm, prefix, layer_stage, last)
    ops = [n for n in graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    for node in ops:
        for i in node.all_input_nodes:
            if i in stage and node in stage and stage[i] > stage[node]:
                raise GenerateError(
                    f"the {kind} step's op {node.name} on stage {stage[node]} reads "
                    f"{i.name} of stage {stage[i]}: its blocks do not run in order; "
                    "compile without --generate"
                )
    output = next(n for n in graph.nodes if n.op == "output")
    (result,) = [a for a in output.all_input_nodes]
    readers: dict[fx.Node, int] = {}  # the latest stage reading each non-free value
    for node in [*ops, output]:
        at = stage.get(node, last)
        for i in node.all_input_nodes:
            if i in stage:
                readers[i] = max(readers.get(i, -1), at)
    order = {n: k for k, n in enumerate(graph.nodes)}
    out = []
    carried: list[fx.Node] = []
    for k in range(len(bounds)):
        mine = [n for n in ops if stage.get(n) == k]
        made = [n for n in graph.nodes if stage.get(n) == k and n.op == "placeholder"]
        leaving = sorted(
            (n for n in [*carried, *mine, *made] if readers.get(n, -1) > k and n is not result),
            key=order.__getitem__,
        )
        ends = leaving if k < last else [result]
        odd = next((n for n in ends if not isinstance(n.meta.get("val"), torch.Tensor)), None)
        if odd is not None:
            raise GenerateError(
                f"the {kind} step hands {odd.name} ({odd.meta.get('val')!r}, not a tensor) "
                f"from stage {k} to a later one: read that size where it is used instead; "
                "compile without --generate"
            )
        out.append(_stage_module(gm, graph, k, carried, mine, free, ends, model_names, bounds))
        carried = leaving
    return out


def _needed_free(nodes: list[fx.Node], free: set[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    todo = [i for n in nodes for i in n.all_input_nodes if i in free]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += [i for i in n.all_input_nodes if i in free]
    return seen


def _stage_module(
    gm: fx.GraphModule,
    graph: fx.Graph,
    k: int,
    carried: list[fx.Node],
    mine: list[fx.Node],
    free: set[fx.Node],
    leaving: list[fx.Node],
    model_names: set[str],
    bounds: tuple[tuple[int, int], ...],
) -> StepStage:
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    root = nn.Module()
    step = StepStage(k, None, (), (), tuple(range(*bounds[k])))  # type: ignore[arg-type]
    holders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    starts = carried if k > 0 else [holders["ids"]]
    for n in starts:
        env[n] = _placeholder(new, n, n.name)
    for name in STEP_INPUTS:
        env[holders[name]] = _placeholder(new, holders[name], name)
    for layer in step.layers:
        for part, word in ((0, "keys"), (1, "values")):
            node = holders[f"kv_{2 * layer + part}"]
            env[node] = _placeholder(new, node, f"{word}_{layer}")
    wanted = set(mine) | _needed_free([*mine, *leaving], free)
    wanted |= {i for n in mine for i in n.all_input_nodes if i.op == "get_attr"}
    for node in graph.nodes:
        if node in env or node not in wanted or node.op == "placeholder":
            continue
        if node.op == "get_attr":
            env[node] = _attribute(new, root, gm, node, step, model_names)
            continue
        env[node] = new.node_copy(node, lambda a: env[a])
    for node in leaving:
        if node not in env:  # a value passing through: it arrived as an input
            raise AssertionError(f"stage {k} lacks {node.name}")
    outs = [env[n] for n in leaving]
    new.output(outs[0] if k == len(bounds) - 1 else tuple(outs))
    new.lint()
    step.module = fx.GraphModule(root, new, f"Stage{k}")
    step.inputs = tuple(p.name for p in new.nodes if p.op == "placeholder")
    step.outputs = tuple(n.name for n in leaving)
    return step


def _placeholder(graph: fx.Graph, old: fx.Node, name: str) -> fx.Node:
    node = graph.placeholder(name)
    node.meta = dict(old.meta)
    return node


def _attribute(
    graph: fx.Graph,
    root: nn.Module,
    gm: fx.GraphModule,
    node: fx.Node,
    step: StepStage,
    model_names: set[str],
) -> fx.Node:
    target = str(node.target)
    name = target.removeprefix("model.")
    attr = name.replace(".", "_")
    tensor = operator.attrgetter(target)(gm)
    if not hasattr(root, attr):
        if isinstance(tensor, nn.Parameter):
            root.register_parameter(attr, nn.Parameter(tensor.detach(), requires_grad=False))
        else:
            root.register_buffer(attr, tensor)
        if name in model_names:
            step.params[attr] = name
        else:
            step.constants[attr] = tensor
            step.constant_names[attr] = name
    out = graph.get_attr(attr)
    out.meta = dict(node.meta)
    return out
