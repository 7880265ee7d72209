"""Pass: split_stages — one GraphModule per stage, with explicit send/recv markers between them.

Requires: balance_stages has run (NodeInfo.stage on every op).
Guarantees: a verified StageGraph. Stage 0 takes the model inputs; the last stage returns the
model outputs; every tensor read by a later stage is sent once by its producer (to all its
consumer stages) and received by each consumer; constants (shapes, dtypes) crossing a
boundary are written into the consumer instead. Parameters live in each stage that uses them;
a parameter used by several stages appears in each, listing the same original names. A
parameter or persistent buffer forward never reads is held by stage 0, so the pipeline's state
dict (saved train state, export, ``--check``) has every tensor of the model's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from pipecompile.ir.graph import markers
from pipecompile.ir.graph.graph_copy import graph_module
from pipecompile.ir.graph.node_info import info
from pipecompile.ir.graph.param_names import alias_names, attribute_name
from pipecompile.ir.graph.size_values import size_sources
from pipecompile.ir.graph.stage_graph import Edge, Stage, StageGraph
from pipecompile.ir.graph.traced import Traced
from pipecompile.ir.graph.values import literal

__all__ = ["split_stages"]


def split_stages(
    module: fx.GraphModule, *, traced: Traced, sizes_follow: bool = False, stages: int = 0
) -> StageGraph:
    """Cut a balanced module into a StageGraph.

    Args:
        module: the output of balance_stages.
        traced: the front end's result (model inputs, output structure, original model).
        sizes_follow: a number computed from tensor sizes (``x.size(1)``, ``B * T``) that a
            later stage reads is computed again there, from the tensors it was read from
            (received if the stage has them not), instead of written in as a constant: the
            sizes may change from batch to batch (``--dynamic``).
        stages: the stage count, where the last stages hold no op (a graph plan's output
            stage); by default one more than the last op's stage.
    """
    nodes = list(module.graph.nodes)
    stage_of = _stage_of(nodes)
    count = max(max(stage_of.values()) + 1, stages)
    output = nodes[-1]
    returned: tuple[fx.Node, ...] = output.args[0]  # type: ignore[assignment]
    model_outputs = [value_name(n) for n in returned]
    consumers = _consumers(nodes, stage_of, set(returned), count - 1)
    if sizes_follow:
        _read_for_sizes(nodes, stage_of, consumers)
    aliases = alias_names(traced.root)
    builders = [_StageBuilder(j, module, aliases, sizes_follow=sizes_follow) for j in range(count)]
    for node in nodes:
        if node.op == "placeholder":
            builders[0].add_input(node)
        elif node.op in ("call_function", "call_method", "call_module"):
            builders[stage_of[node]].copy(node, stage_of)
    for node in nodes:
        if consumers.get(node):
            builders[stage_of[node]].send(node, consumers[node])
    builders[-1].finish(list(returned), stage_of)
    for builder in builders[:-1]:
        builder.finish([], stage_of)
    _hold_unread(builders, traced.root)
    stages = tuple(b.build(tuple(traced.input_names) if b.index == 0 else None) for b in builders)
    edges = tuple(
        _edge(node, stage_of[node], dst) for node in nodes for dst in consumers.get(node, ())
    )
    graph = StageGraph(
        stages,
        edges,
        tuple(traced.input_names),
        tuple(model_outputs),
        pytree.treespec_dumps(traced.output_spec),
        traced.tracer,
    )
    graph.verify()
    return graph


def value_name(node: fx.Node) -> str:
    """The name a value travels under: a model input's parameter name, else the node name."""
    return str(node.target) if node.op == "placeholder" else node.name


def _stage_of(nodes: list[fx.Node]) -> dict[fx.Node, int]:
    stage_of = {}
    for node in nodes:
        if node.op == "placeholder":
            stage_of[node] = 0
        elif node.op in ("call_function", "call_method", "call_module"):
            stage = info(node).stage
            assert stage is not None, f"{node.name} has no stage; run balance_stages first"
            stage_of[node] = stage
    return stage_of


def _consumers(
    nodes: list[fx.Node], stage_of: dict[fx.Node, int], outputs: set[fx.Node], last: int
) -> dict[fx.Node, tuple[int, ...]]:
    """For each tensor value, the later stages that read it (model outputs are read by the last)."""
    result = {}
    for node in nodes:
        if node not in stage_of or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        readers = {stage_of[u] for u in node.users if u in stage_of}
        if node in outputs:
            readers.add(last)
        later = tuple(sorted(r for r in readers if r > stage_of[node]))
        if later:
            result[node] = later
    return result


def _read_for_sizes(
    nodes: list[fx.Node], stage_of: dict[fx.Node, int], consumers: dict[fx.Node, tuple[int, ...]]
) -> None:
    """Add to ``consumers`` the later stages that compute a size number again from a tensor."""
    for node in nodes:
        if node not in stage_of or isinstance(node.meta.get("val"), torch.Tensor):
            continue
        sources = size_sources(node)
        readers = {stage_of[u] for u in node.users if stage_of.get(u, -1) > stage_of[node]}
        if not readers or sources is None:
            continue
        for source in sources:
            later = {r for r in readers if r > stage_of[source]}
            if later:
                consumers[source] = tuple(sorted({*consumers.get(source, ()), *later}))


def _hold_unread(builders: list[_StageBuilder], root: nn.Module) -> None:
    """Give stage 0 every tensor of ``root``'s state dict that no stage holds."""
    held = {id(t) for b in builders for t in b.root.state_dict(keep_vars=True).values()}
    for name, tensor in root.state_dict(keep_vars=True).items():
        if id(tensor) not in held:
            builders[0].hold(name, tensor)
            held.add(id(tensor))


def _edge(node: fx.Node, src: int, dst: int) -> Edge:
    val = node.meta["val"]
    nbytes = val.numel() * val.element_size()
    return Edge(
        value_name(node), src, dst, tuple(val.shape), str(val.dtype).removeprefix("torch."), nbytes
    )


@dataclass
class _StageBuilder:
    """Builds one stage's graph node by node; keeps the maps from original nodes to its own."""

    index: int
    source: fx.GraphModule
    aliases: dict[int, tuple[str, ...]]
    graph: fx.Graph = field(default_factory=fx.Graph)
    root: nn.Module = field(default_factory=nn.Module)
    env: dict[fx.Node, fx.Node] = field(default_factory=dict)
    attrs: dict[str, str] = field(default_factory=dict)  # original target -> stage attribute
    sizes_follow: bool = False  # numbers of sizes are computed again here (split_stages)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    flops: int = 0

    def add_input(self, node: fx.Node) -> None:
        self.env[node] = self.graph.placeholder(value_name(node))
        self.env[node].meta["val"] = node.meta.get("val")

    def copy(self, node: fx.Node, stage_of: dict[fx.Node, int]) -> None:
        copied = self.graph.node_copy(node, self._lookup(stage_of))
        if node.op == "call_module":
            copied.target = self._attribute(
                str(node.target), self.source.get_submodule(str(node.target))
            )
        self.env[node] = copied
        self.flops += info(node).flops

    def send(self, node: fx.Node, dsts: tuple[int, ...]) -> None:
        name = value_name(node)
        self.graph.call_function(markers.send, (self.env[node], name, dsts))
        self.outputs.append(name)

    def hold(self, target: str, tensor: torch.Tensor) -> None:
        """Keep a tensor forward never reads as an attribute of this stage."""
        self._attribute(target, tensor)

    def finish(self, model_outputs: list[fx.Node], stage_of: dict[fx.Node, int]) -> None:
        lookup = self._lookup(stage_of)
        self.graph.output(tuple(lookup(n) for n in model_outputs))
        self.outputs.extend(value_name(n) for n in model_outputs)

    def build(self, model_inputs: tuple[str, ...] | None) -> Stage:
        module = graph_module(self.root, self.graph, f"Stage{self.index}")
        state = {
            **dict(module.named_parameters(remove_duplicate=False)),
            **dict(module.named_buffers(remove_duplicate=False)),
        }
        params = {name: self.aliases.get(id(t), (name,)) for name, t in state.items()}
        unique = {id(t): t for t in state.values()}
        param_bytes = sum(t.numel() * t.element_size() for t in unique.values())
        inputs = model_inputs if model_inputs is not None else tuple(self.inputs)
        return Stage(
            self.index, module, inputs, tuple(self.outputs), params, self.flops, param_bytes
        )

    def _lookup(self, stage_of: dict[fx.Node, int]) -> Callable[[fx.Node], Any]:
        def lookup(arg: fx.Node) -> Any:
            if arg in self.env:
                return self.env[arg]
            if arg.op == "get_attr":
                return self._get_attr(arg)
            if not isinstance(arg.meta.get("val"), torch.Tensor):
                if self.sizes_follow and size_sources(arg) is not None:
                    return self._size_again(arg, lookup)
                return literal(arg.meta.get("val"))  # a constant crossing the boundary
            return self._recv(arg, stage_of[arg])

        return lookup

    def _size_again(self, node: fx.Node, lookup: Callable[[fx.Node], Any]) -> fx.Node:
        """``node`` (a number of sizes) computed in this stage from the tensors it reads."""
        if node in self.env:
            return self.env[node]

        def arg(a: fx.Node) -> Any:
            is_tensor = isinstance(a.meta.get("val"), torch.Tensor)
            return lookup(a) if is_tensor or a in self.env else self._size_again(a, lookup)

        self.env[node] = self.graph.node_copy(node, arg)
        return self.env[node]

    def _recv(self, node: fx.Node, src: int) -> fx.Node:
        name = value_name(node)
        received = self.graph.call_function(markers.recv, (name, src))
        received.meta["val"] = node.meta["val"]
        self.env[node] = received
        self.inputs.append(name)
        return received

    def _get_attr(self, node: fx.Node) -> fx.Node:
        target = str(node.target)
        owner, _, leaf = target.rpartition(".")
        value = getattr(self.source.get_submodule(owner) if owner else self.source, leaf)
        attr = self._attribute(target, value)
        fetched = self.graph.get_attr(attr)
        fetched.meta["val"] = node.meta.get("val")
        return fetched

    def _attribute(self, target: str, value: object) -> str:
        if target not in self.attrs:
            canonical = self.aliases.get(id(value), (target,))[0]
            name = attribute_name(canonical, taken=set(self.attrs.values()))
            if isinstance(value, nn.Module):
                self.root.add_module(name, value)
            elif isinstance(value, nn.Parameter):
                self.root.register_parameter(name, value)
            elif isinstance(value, torch.Tensor):
                self.root.register_buffer(name, value)
            else:
                raise TypeError(f"attribute {target!r} is a {type(value).__name__}")
            self.attrs[target] = name
        return self.attrs[target]
