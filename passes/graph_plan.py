"""Pass: graph_plan — branches side by side on devices of their own, where that is faster.

Requires: balance_stages has run (the chain plan: its balanced module, report and program).
Guarantees: either the chain plan unchanged, or a graph plan: a copy of the annotated module
whose ops carry NodeInfo.stage for the stages of the optimal graph split
(``balance.graph_partition``; stages contiguous in graph order, an input or output stage
without ops where the graph has no prefix or suffix), its ``BalanceReport`` (``shape``
"graph") and the schedule's program on that stage graph (``schedules.on_graphs``).

The graph plan is kept when the simulator, given each stage's cost (F = its cost, B = twice
that), prices its step at most ``GAIN`` of the chain plan's: a graph plan has more stages than
devices, and each stage's instruction costs the runtime a little that the costs do not count.
Both prices go to the report (``shapes``), so the compile summary says which was chosen and
why. A chain split on a machine model's times (``--bandwidth``, ``--flops-rate`` ...: the
plan search prices stage graphs on those; ``--graph`` takes one), a plan that requested
boundaries or replicas, a schedule that runs chains only, a graph
whose ops write values in place (its other side effects, asserts and random ops, do not
depend on the order of independent branches: random ops draw from streams keyed by op), a
model without branches side by side: the chain stays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch.fx as fx

from pipecompile.balance.branch_order import reordered
from pipecompile.balance.cut_bytes import atom_links, value_bytes
from pipecompile.balance.fork_join import fork_joins
from pipecompile.balance.graph_partition import GraphSplit, best_split
from pipecompile.balance.partition_problem import atom_cost
from pipecompile.balance.split_requests import pinned_costs
from pipecompile.errors import BalanceError
from pipecompile.ir.graph.mutation import mutated_inputs
from pipecompile.ir.graph.node_info import info, with_info
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.simulate import Costs, simulate
from pipecompile.ir.programs.topology import Topology
from pipecompile.ir.records.balance_report import BalanceReport
from pipecompile.passes.balance_stages import atoms_of, compute_nodes, node_cost
from pipecompile.schedules import Links, graph_program, schedule_of

__all__ = ["GAIN", "graph_plan", "stage_links"]

GAIN = 0.95  # a graph plan is kept when its priced step is at most this part of the chain's

Planned = tuple[fx.GraphModule, BalanceReport, Program]
_OPS = ("call_function", "call_method", "call_module")


def graph_plan(
    annotated: fx.GraphModule,
    chain: Planned,
    *,
    cost: str = "flops",
    pinned: Mapping[str, int] | None = None,
    machine: CostModel | None = None,
    force: bool = False,
) -> Planned:
    """The graph plan of ``annotated`` on the chain program's devices if it prices faster
    than the ``chain`` plan (``force``: whenever there is one), else ``chain``, its report
    recording the shape. With a ``machine`` model, ops are priced at its times and each
    stage also pays for the bytes it receives from another device."""
    balanced, report, program = chain
    chained = (balanced, replace(report, shape="chain"), program)
    devices = len(program.devices)
    if schedule_of(program.schedule).on_graph is None or devices < 2:
        return chained
    if report.requested_boundaries or devices != program.num_stages:
        return chained
    ops = compute_nodes(annotated.graph)
    if _writes_in_place(ops, force):
        return chained
    atoms = atoms_of(ops)
    price = _OpPrices(cost, pinned, machine)
    costs = price.of(annotated)
    weights = [sum(costs[n] for n in atom) for atom in atoms]
    split = _best_split(annotated, atoms, weights, devices, force)
    if split is None:
        return chained
    module = _assigned(annotated, atoms, split)
    stages = len(split.pieces)
    links = stage_links(module, stages)
    graph = graph_program(program.schedule, links, split.stage_device, program.microbatches)
    chain_stages = tuple(range(program.num_stages))
    chain_links = stage_links(balanced, len(chain_stages))
    priced = {
        "chain": _price(program, chain_links, price.stages(balanced, chain_stages)),
        "graph": _price(graph, links, price.stages(module, split.stage_device)),
    }
    if not force and priced["graph"] > GAIN * priced["chain"]:
        return (balanced, replace(report, shape="chain", shapes=priced), program)
    stage_costs = [sum(weights[a] for a in p.items) for p in split.pieces]
    ops_per_stage = tuple(sum(len(atoms[a]) for a in p.items) for p in split.pieces)
    return module, _report(report, split, stage_costs, ops_per_stage, priced), graph


def _writes_in_place(ops: list[fx.Node], force: bool) -> bool:
    """Whether an op writes a value in place (a stage graph would run the branches in
    another order; asserts and random ops, keyed by op, may move); ``force``: refused."""
    writer = next((n for n in ops if mutated_inputs(n)), None)
    if writer is not None and force:
        raise BalanceError(
            f"--graph: {writer.name} ({writer.target}) writes a value in place, which another "
            "branch may read; a stage graph runs branches in another order than the model "
            "wrote them: compile without --graph"
        )
    return writer is not None


def _best_split(
    annotated: fx.GraphModule,
    atoms: list[list[fx.Node]],
    weights: list[int],
    devices: int,
    force: bool,
) -> GraphSplit | None:
    """The best graph split over the model's parallel blocks; None where there is none
    (``force``: refused)."""
    reads, _ = atom_links(atoms)
    split = best_split(weights, fork_joins(reads, weights), devices)
    if split is None and force:
        raise BalanceError(
            f"--graph: {type(annotated).__name__} has no branches side by side that "
            f"{devices} devices can run apart (no ops that neither feed nor read each other "
            "between two points every path passes); compile without --graph"
        )
    return split


class _OpPrices:
    """What an op costs (the ``--balance`` cost, or under a machine model its time in ps),
    and what each stage of a module costs with the bytes it receives from other devices."""

    def __init__(self, cost: str, pinned: Mapping[str, int] | None, machine: CostModel | None):
        self.cost, self.pinned = cost, pinned or {}
        self.machine = machine if cost == "flops" else None

    def of(self, module: fx.GraphModule) -> dict[fx.Node, int]:
        ops = compute_nodes(module.graph)
        if self.machine is None:
            costs = {n: node_cost(n, module, self.cost) for n in ops}
        else:
            machine = self.machine
            costs = {n: atom_cost([(info(n).flops, info(n).kind)], "flops", machine) for n in ops}
        return pinned_costs(ops, costs, self.pinned)

    def stages(self, module: fx.GraphModule, stage_device: tuple[int, ...]) -> list[float]:
        """Each stage's summed op cost, plus its messages' time under a machine model."""
        costs = self.of(module)
        summed = [0.0] * len(stage_device)
        for node, c in costs.items():
            summed[info(node).stage or 0] += c
        if self.machine is None:
            return summed
        for node in module.graph.nodes:
            if node.op not in ("placeholder", *_OPS):
                continue
            here = _stage(node)
            there = {info(u).stage or 0 for u in node.users if u.op in _OPS}
            for j in there:
                if stage_device[j] != stage_device[here]:
                    seconds = value_bytes(node.meta.get("val")) / self.machine.bandwidth
                    summed[j] += (seconds + self.machine.message_latency) * 1e12
        return summed


def stage_links(module: fx.GraphModule, stages: int) -> Links:
    """Which stages read which in a module whose ops carry their stage: an op's inputs made
    in another stage, the model's inputs (read by stage 0 and handed on), and the values the
    last stage returns."""
    read: set[tuple[int, int]] = set()
    for node in module.graph.nodes:
        if node.op == "output":
            returned = [a for a in node.all_input_nodes if a.op != "get_attr"]
            read |= {(_stage(a), stages - 1) for a in returned}
        elif node.op in _OPS:
            j = info(node).stage
            assert j is not None
            read |= {(_stage(a), j) for a in node.all_input_nodes if a.op != "get_attr"}
    return Links.of(stages, frozenset((s, t) for s, t in read if s != t))


def _stage(node: fx.Node) -> int:
    return 0 if node.op == "placeholder" else info(node).stage or 0


def _assigned(
    annotated: fx.GraphModule, atoms: Sequence[Sequence[fx.Node]], split: GraphSplit
) -> fx.GraphModule:
    """A copy of ``annotated`` with its ops in stage order, each carrying its stage."""
    order = [n for piece in split.pieces for a in piece.items for n in atoms[a]]
    module = reordered(annotated, order)
    copied = compute_nodes(module.graph)
    stage_of = {}
    for j, piece in enumerate(split.pieces):
        stage_of.update({op: j for a in piece.items for op in atoms[a]})
    for original, node in zip(order, copied):
        with_info(node, stage=stage_of[original])
    return module


def _price(program: Program, links: Links, stage_costs: Sequence[float]) -> float:
    """The simulated step of ``program`` with F = a stage's cost and B = twice that."""
    edges = frozenset((s, t) for t, ps in enumerate(links.producers) for s in ps)
    return simulate(
        program, Topology(len(stage_costs), edges), Costs.from_flops(stage_costs)
    ).makespan


def _report(
    chain: BalanceReport,
    split: GraphSplit,
    stage_costs: list[int],
    ops_per_stage: tuple[int, ...],
    priced: dict[str, float],
) -> BalanceReport:
    total = sum(stage_costs)
    return BalanceReport(
        cost=chain.cost,
        stage_costs=tuple(float(c) for c in stage_costs),
        bottleneck=float(split.bottleneck),
        lower_bound=total / len(split.loads),
        unconstrained_optimum=float(split.bottleneck),
        stage_ops=ops_per_stage,
        requested_boundaries=0,
        shape="graph",
        shapes=priced,
        method="graph",
    )
