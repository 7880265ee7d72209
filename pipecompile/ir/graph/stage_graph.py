"""The stage graph: one fx graph per stage plus the edges (values) that cross between stages."""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from pipecompile.errors import SplitError
from pipecompile.ir.graph.markers import is_recv, is_send

__all__ = ["Edge", "Stage", "StageGraph"]


@dataclass(frozen=True)
class Edge:
    """Value ``value`` produced by stage ``src`` and read by stage ``dst`` (src < dst)."""

    value: str
    src: int
    dst: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    def __str__(self) -> str:
        shape = "x".join(str(s) for s in self.shape) or "scalar"
        return (
            f"{self.value}: stage {self.src} -> {self.dst}  {self.dtype}[{shape}] {self.nbytes} B"
        )


@dataclass(frozen=True)
class Stage:
    """One stage: its graph (with send/recv markers), ordered inputs and outputs, parameters.

    ``params`` maps each stage parameter/buffer name (as in the stage module's state_dict) to
    the original model's names for it (several when the parameter is tied).
    """

    index: int
    module: fx.GraphModule
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: dict[str, tuple[str, ...]]
    flops: int
    param_bytes: int

    def __str__(self) -> str:
        head = (
            f"stage {self.index}: inputs ({', '.join(self.inputs)}) -> ({', '.join(self.outputs)})"
        )
        return head + "\n" + str(self.module.graph)


@dataclass(frozen=True)
class StageGraph:
    """Every stage in order, the edges between them, and the model's input/output names.

    ``output_spec`` is the serialised pytree spec (``torch.utils._pytree.treespec_dumps``)
    that rebuilds the model's output structure from the last stage's flat outputs.
    """

    stages: tuple[Stage, ...]
    edges: tuple[Edge, ...]
    model_inputs: tuple[str, ...]
    model_outputs: tuple[str, ...]
    output_spec: str
    tracer: str

    def __str__(self) -> str:
        parts = [f"stage graph ({self.tracer}): {len(self.stages)} stages"]
        parts += [str(s) for s in self.stages]
        parts += ["edges:"] + [f"  {e}" for e in self.edges]
        return "\n".join(parts)

    def verify(self) -> None:
        """Check the invariants every later step relies on; raise SplitError with context."""
        last = len(self.stages) - 1
        if self.stages[0].inputs != self.model_inputs:
            raise SplitError(
                f"stage 0 takes {self.stages[0].inputs}, "
                f"expected the model inputs {self.model_inputs}"
            )
        if self.stages[last].outputs != self.model_outputs:
            raise SplitError(
                f"stage {last} returns {self.stages[last].outputs}, "
                f"expected the model outputs {self.model_outputs}"
            )
        for edge in self.edges:
            _verify_edge(self, edge)
        for stage in self.stages:
            _verify_markers(stage, self.edges)


def _verify_edge(graph: StageGraph, edge: Edge) -> None:
    if not 0 <= edge.src < edge.dst < len(graph.stages):
        raise SplitError(f"edge {edge} does not go forward between existing stages")
    if edge.value not in graph.stages[edge.src].outputs:
        raise SplitError(f"edge {edge}: stage {edge.src} does not output {edge.value!r}")
    if edge.value not in graph.stages[edge.dst].inputs:
        raise SplitError(f"edge {edge}: stage {edge.dst} does not take {edge.value!r}")


def _verify_markers(stage: Stage, edges: tuple[Edge, ...]) -> None:
    nodes = list(stage.module.graph.nodes)
    received = {n.args[0] for n in nodes if is_recv(n)}
    sent = {n.args[1] for n in nodes if is_send(n)}
    want_in = {e.value for e in edges if e.dst == stage.index}
    want_out = {e.value for e in edges if e.src == stage.index}
    if received != want_in or sent != want_out:
        raise SplitError(
            f"stage {stage.index}: markers receive {sorted(received)} and send {sorted(sent)}, "
            f"but the edges say {sorted(want_in)} in and {sorted(want_out)} out\n"
            f"{stage.module.graph}"
        )
