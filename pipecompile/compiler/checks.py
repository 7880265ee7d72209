"""The driver's checks of the IR a pass produced: a cheap one after every pass, an expensive one
after every pass under ``verify_each`` (and after the last pass always).

Each check reads the driver's named IR values (``ir["graph"]`` ...) and raises on a broken IR;
the driver reports the failure as an InternalError naming the pass it ran after.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from pipecompile.errors import MicrobatchError
from pipecompile.frontend.fake_prop import propagate_fake
from pipecompile.ir.graph.graph_copy import copy_graph_module
from pipecompile.ir.graph.node_info import info
from pipecompile.ir.graph.stage_graph import StageGraph
from pipecompile.ir.graph.user_frame import op_place
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.topology import Topology, topology
from pipecompile.ir.programs.verify_program import verify_program
from pipecompile.ir.records.batch_coupling import Coupling, mixes
from pipecompile.passes.balance_stages import compute_nodes

__all__ = [
    "lint_traced",
    "lint_annotated",
    "check_balanced",
    "check_stage_graph",
    "check_memory",
    "check_program",
    "repropagate",
    "lint_stages",
    "verify_compute",
    "verify_linked",
]

IR = dict[str, Any]


def lint_traced(ir: IR) -> None:
    """The traced graph is well formed (fx's lint: defined before used, one output)."""
    ir["traced"].module.graph.lint()


def lint_annotated(ir: IR) -> None:
    """Well formed, and its ops' costs are non-negative."""
    _lint_costs(ir["annotated"])


def check_balanced(ir: IR) -> None:
    """Well formed; every op has a stage, stages run 0, 1, ... in graph order without gaps
    (a graph plan's input and output stages may hold no op); the report counts the same ops
    per stage."""
    module, report = ir["balanced"], ir["balance"]
    _lint_costs(module)
    stages = [info(n).stage for n in compute_nodes(module.graph)]
    if None in stages:
        raise AssertionError("an op has no stage")
    graph = report.shape == "graph"  # its input and output stages may have no ops
    count = len(report.stage_ops) if graph else max(stages, default=-1) + 1  # type: ignore[type-var]
    counts = [stages.count(j) for j in range(count)]
    if stages != sorted(stages) or (0 in counts and not graph):  # type: ignore[type-var]
        raise AssertionError(f"stages are not contiguous in graph order: {stages}")
    if tuple(counts) != report.stage_ops:
        raise AssertionError(f"ops per stage {counts}, the report says {list(report.stage_ops)}")


def check_stage_graph(ir: IR) -> None:
    """The stage graph's invariants (``StageGraph.verify``)."""
    ir["graph"].verify()


def check_memory(ir: IR) -> None:
    """One non-negative StageMemory per stage."""
    memory, stages = ir["memory"], len(ir["graph"].stages)
    if len(memory) != stages or any(m.saved < 0 or m.inputs < 0 for m in memory):
        raise AssertionError(f"{len(memory)} stage memories for {stages} stages: {memory}")


def check_program(program: Program) -> None:
    """Well formed: the device list matches the placement, every instruction names an existing
    stage and micro-batch and runs on its stage's device."""
    if not program.stage_device or len(program.devices) != max(program.stage_device) + 1:
        raise AssertionError(
            f"{len(program.devices)} devices for the placement {list(program.stage_device)}"
        )
    for d, k, x in program.instructions():
        bad_batch = x.microbatch is not None and not 0 <= x.microbatch < program.microbatches
        if not 0 <= x.stage < program.num_stages or bad_batch:
            raise AssertionError(f"no such stage or micro-batch\n{program.show_around(d, k)}")
        if program.stage_device[x.stage] != d:
            raise AssertionError(f"on the wrong device\n{program.show_around(d, k)}")


def repropagate(module: fx.GraphModule) -> None:
    """Run the graph again on fake inputs and compare every tensor's shape and dtype with the
    recorded ``meta["val"]``: the graph still computes what its annotations say."""
    copy = copy_graph_module(module)
    places = [n for n in copy.graph.nodes if n.op == "placeholder"]
    before = {n.name: n.meta.get("val") for n in copy.graph.nodes}
    propagate_fake(copy, [_zeros_like(n.meta["val"]) for n in places])
    for node in copy.graph.nodes:
        old, new = before[node.name], node.meta.get("val")
        if isinstance(old, torch.Tensor) and (
            not isinstance(new, torch.Tensor) or (old.shape, old.dtype) != (new.shape, new.dtype)
        ):
            raise AssertionError(f"{node.name}: recorded {_describe(old)}, now {_describe(new)}")


def lint_stages(graph: StageGraph) -> None:
    """Every stage's graph is well formed."""
    for stage in graph.stages:
        stage.module.graph.lint()


def verify_compute(program: Program) -> None:
    """A compute-only program (no messages yet): counts, order, versions, and it runs to the
    end (``verify_program`` against stages that exchange nothing)."""
    verify_program(program, Topology(program.num_stages, frozenset()))


def verify_linked(program: Program, graph: StageGraph) -> None:
    """A program with its messages: ``verify_program`` against the stage graph's topology."""
    verify_program(program, topology(graph))


def _lint_costs(module: fx.GraphModule) -> None:
    module.graph.lint()
    for node in compute_nodes(module.graph):
        facts = info(node)
        if min(facts.flops, facts.param_bytes, facts.activation_bytes, facts.time_ns) < 0:
            raise AssertionError(f"{node.name}: negative cost {facts}")


def _zeros_like(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.zeros(value.shape, dtype=value.dtype, device=value.device)
    return value


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{list(value.shape)}"
    return type(value).__name__


def refuse_mixed_batches(
    couplings: tuple[Coupling, ...],
    microbatches: int,
    replicas: tuple[int, ...] | None,
    waiting: tuple[str, ...] | None,
) -> None:
    """A model that mixes the samples of a batch (``passes/batch_coupling``), refused where
    its batch is split and the mixing cannot be computed on the whole batch: a mixing op more
    layers follow (every part would compute it on its own samples only, and training would
    follow another objective), and a tail (only the outputs follow it: run once a step on the
    joined values, ``frontend/tail_cut``) under replicas or a schedule that cannot wait for
    it (``waiting``: those that can, None where the compile's schedule can). Batch norm is
    not refused: its statistics per micro-batch are stated.

    Raises:
        MicrobatchError: naming the first such op, its line, and what to do.
    """
    mixing = [c for c in mixes(couplings) if c.kind != "loss"]
    copies = max(replicas or (1,))
    if not mixing or (microbatches < 2 and copies < 2):
        return
    middle = [c for c in mixing if c.kind == "middle"]
    parts = f"{microbatches} micro-batches" if microbatches > 1 else f"{copies} replicas of a stage"
    if middle:
        others = f" (and {len(middle) - 1} more)" if len(middle) > 1 else ""
        raise MicrobatchError(
            f"{middle[0].op}{others} mixes the samples of the batch, and more of the model's "
            f"layers follow it: in {parts} each would compute it on its own samples only, and "
            "training would follow another objective than the model's. Compile with "
            "--microbatches 1 and no replicas, or make the model's forward per sample "
            "(compute what mixes the batch in loss_fn)"
        )
    first = mixing[0]
    head = (
        f"{first.op} mixes the samples of the batch, and only the outputs follow it (a "
        "batch-coupled head, such as a contrastive loss's logits): that tail runs once a step "
        "on every micro-batch's values joined"
    )
    if copies > 1:
        raise MicrobatchError(
            f"{head}, and {copies} replicas of a stage would each see part of the batch; "
            "compile without replicas"
        )
    if waiting is not None:
        raise MicrobatchError(
            f"{head}, which the schedule cannot wait for (its last stage starts a backward "
            f"before its last forward); compile with --schedule {' or '.join(waiting)}, or "
            "--microbatches 1"
        )


def refuse_scalar_outputs(module: fx.GraphModule, microbatches: int) -> None:
    """A model output with no batch dimension (a loss over the whole batch, such as a VQ
    model's commitment loss), refused when the batch splits into micro-batches: each
    micro-batch would compute its own, and the pipeline could return no value equal to the
    model's (its outputs are joined along the batch).

    Raises:
        MicrobatchError: naming the output, the op that makes it and what to do.
    """
    if microbatches < 2:
        return
    output = next(n for n in reversed(module.graph.nodes) if n.op == "output")
    for k, node in enumerate(output.args[0]):
        value = node.meta.get("val") if isinstance(node, fx.Node) else None
        if isinstance(value, torch.Tensor) and value.dim() == 0:
            raise MicrobatchError(
                f"output {k}, {op_place(node)}, is a scalar over the whole batch: in "
                f"{microbatches} micro-batches each computes its own, and the pipeline cannot "
                "return the model's value (its outputs are joined along the batch); return it "
                "per sample (keep the batch dimension), or compute it in loss_fn, or compile "
                "with --microbatches 1"
            )
