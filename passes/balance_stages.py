"""Pass: balance_stages — assign every op to one of N contiguous stages, minimising the largest.

Requires: annotate_costs has run (NodeInfo.flops / param_bytes on every node).
Guarantees: a copy of the module where every op (call_function / call_method / call_module)
carries NodeInfo.stage, stages are contiguous in graph order, each is non-empty, a stage
starts at every requested boundary (``split_point()`` markers, which are removed, and
``split_at`` module paths), and the largest stage cost is the exact minimum over all cuts at
legal points that honour those requests. A cut is legal when every value crossing it is a
tensor or a constant that can be written into code. Beside it, the ``BalanceReport``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import torch.fx as fx

from pipecompile.balance.balance_objective import modelled_split, plain_split
from pipecompile.balance.branch_order import candidate_orders, reordered
from pipecompile.balance.min_max_partition import min_max_partition
from pipecompile.balance.node_memory import node_memory
from pipecompile.balance.partition_problem import atom_facts
from pipecompile.balance.split_requests import pinned_costs, requested_starts
from pipecompile.errors import BalanceError
from pipecompile.ir.graph.graph_copy import copy_graph_module
from pipecompile.ir.graph.mutation import mutated_inputs, storage_of
from pipecompile.ir.graph.node_info import info, with_info
from pipecompile.ir.graph.split_point import is_split_point
from pipecompile.ir.graph.values import is_transferable
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.recompute_policy import policy_counts, with_recompute
from pipecompile.ir.records.balance_report import BalanceJson, BalanceReport

__all__ = ["balance_stages", "COSTS", "atoms_of", "compute_nodes", "min_max_partition", "node_cost"]

COSTS = ("flops", "params", "time")
_OPS = ("call_function", "call_method", "call_module")


def compute_nodes(graph: fx.Graph) -> list[fx.Node]:
    """The graph's ops in order: the items the balancer cuts between."""
    return [n for n in graph.nodes if n.op in _OPS]


def balance_stages(
    module: fx.GraphModule,
    *,
    stages: int,
    cost: str = "flops",
    split_at: Sequence[str] = (),
    pinned: Mapping[str, int] | None = None,
    machine: CostModel | None = None,
    program: Program | None = None,
    recompute: str = "never",
) -> tuple[fx.GraphModule, BalanceReport]:
    """Return a copy of ``module`` with each op assigned to one of ``stages`` stages, and the
    report of the split (see ``BalanceReport``).

    Args:
        module: an annotated graph module (see annotate_costs).
        stages: the number of stages, at least 1.
        cost: ``"flops"`` (forward FLOPs) or ``"params"`` (parameter bytes) per op.
        split_at: ``[before:|after:]MODULE_PATH`` boundaries a stage must start at.
        pinned: MODULE_PATH -> cost: the whole module counts as this cost (on its first op)
            instead of the annotated one.
        machine: the machine's cost model. Without one, the largest stage's summed cost is
            minimised; with one, the slowest stage's predicted time (compute at its device's
            speed plus communication, replicated over ``machine.workers``) under the memory
            limits.
        program: the compute program of the chosen schedule (placement, micro-batches in
            flight, weight copies); required with ``machine``.
        recompute: the ``--recompute`` policy whose stored activations the memory limits
            count (the forwards it recomputes store only their inputs).

    Raises:
        BalanceError: fewer legal cut points than stages - 1, an unknown cost, or a requested
            boundary that is unknown, illegal, or more than the stages allow.
    """
    if cost not in COSTS:
        raise BalanceError(f"unknown balance cost {cost!r}; choose one of {', '.join(COSTS)}")
    if stages < 1:
        raise BalanceError(f"--stages must be at least 1, got {stages}")
    out = copy_graph_module(module)
    ops = [n for n in compute_nodes(out.graph) if not is_split_point(n)]
    atoms = atoms_of(ops)
    cuts = requested_starts(out.graph, atoms, split_at)
    if len(cuts) + 1 > stages:
        raise BalanceError(
            f"{len(cuts)} requested boundaries make {len(cuts) + 1} stages, more than "
            f"--stages {stages}; raise --stages or drop a split_point()/--split-at"
        )
    for node in [n for n in out.graph.nodes if is_split_point(n)]:
        out.graph.erase_node(node)
    out.recompile()
    if stages > len(atoms) and (machine is None or cuts):
        _too_few_places(module, stages, len(ops), len(atoms))
    if machine is None:
        costs = pinned_costs(ops, {n: node_cost(n, out, cost) for n in ops}, pinned or {})
        weights = [sum(costs[n] for n in atom) for atom in atoms]
        starts, report = plain_split(weights, stages, cuts)
    else:
        assert program is not None and program.num_stages == stages
        out, atoms, starts, report = _best_order(
            module, out, ops, atoms, stages, cost, cuts, pinned, machine, program, recompute
        )
    for j, (first, end) in enumerate(_spans(starts, len(atoms))):
        for atom in atoms[first:end]:
            for node in atom:
                with_info(node, stage=j)
    stage_ops = [sum(len(a) for a in atoms[s:e]) for s, e in _spans(starts, len(atoms))]
    firsts = [sum(stage_ops[:j]) for j in range(len(stage_ops))]
    frozen = {k: tuple(v) if isinstance(v, list) else v for k, v in report.items()}
    return out, BalanceReport(
        starts=tuple(firsts),
        method="min_max" if machine is None else "modelled",
        cost=cost,
        stage_ops=tuple(stage_ops),
        requested_boundaries=len(cuts),
        shape="chain",
        **frozen,
    )


def _best_order(
    module: fx.GraphModule,
    out: fx.GraphModule,
    ops: list[fx.Node],
    atoms: list[list[fx.Node]],
    stages: int,
    cost: str,
    cuts: Any,
    pinned: Mapping[str, int] | None,
    machine: CostModel,
    program: Program,
    recompute: str,
) -> tuple[fx.GraphModule, list[list[fx.Node]], Any, BalanceJson]:
    """The modelled split of the graph's best op order (each independent-branch order the
    graph allows, unless boundaries were requested): the graph, its atoms, the stage
    starts and the report, which records every order's bottleneck."""
    machine.validate(len(program.devices), stages)
    program = with_recompute(program, policy_counts(recompute, program))
    manual = bool(cuts) or len(ops) != len(compute_nodes(module.graph))
    orders = candidate_orders(out.graph)[: 1 if manual else None]
    solved = (
        _modelled(
            out if name == "graph" else reordered(out, order),
            name,
            stages,
            cost,
            cuts,
            pinned,
            machine,
            program,
        )
        for name, order in orders
    )
    tried = [t for t in solved if t is not None]
    if not tried:
        _too_few_places(module, stages, len(ops), len(atoms))
    best = min(tried, key=lambda t: t[3]["bottleneck"])
    best[3]["orders"] = {t[3]["order"]: t[3]["bottleneck"] for t in tried}
    return best


def _modelled(
    module: fx.GraphModule,
    order: str,
    stages: int,
    cost: str,
    cuts: list[int],
    pinned: Mapping[str, int] | None,
    machine: CostModel,
    program: Program,
) -> tuple[fx.GraphModule, list[list[fx.Node]], list[int], BalanceJson] | None:
    """The exact modelled split of ``module`` in its own op order; None if that order has
    fewer places to cut than stages."""
    ops = compute_nodes(module.graph)
    atoms = atoms_of(ops)
    if stages > len(atoms):
        return None
    costs = pinned_costs(ops, {n: node_cost(n, module, cost) for n in ops}, pinned or {})
    params = {n: node_cost(n, module, "params") for n in ops}
    saved = node_memory(module) if machine.memory_limit else {}
    facts = atom_facts(module.graph, atoms, costs, params, saved, kind=cost, machine=machine)
    starts, report = modelled_split(facts, kind=cost, machine=machine, program=program, cuts=cuts)
    weights = [sum(costs[n] for n in atom) for atom in atoms]
    report["stage_balanced"] = [sum(weights[a:b]) for a, b in _spans(starts, len(atoms))]
    report["order"] = order
    return module, atoms, starts, report


def _too_few_places(module: fx.GraphModule, stages: int, ops: int, places: int) -> NoReturn:
    raise BalanceError(
        f"cannot cut {type(module).__name__} into {stages} stages: it has {ops} ops but "
        f"only {places} places where a stage may start (values that are neither tensors "
        f"nor constants cannot cross a stage boundary, and an op writing a value in place "
        f"stays in the stage that made the value); use --stages {places} or fewer"
    )


def _first_makers(ops: list[fx.Node]) -> dict[int | None, int]:
    """Storage -> the first place a stage could start after the op (or the model input) that
    made it: a write to that storage, through any view of it, must not start a later stage."""
    made: dict[int | None, int] = {}
    graph = ops[0].graph if ops else None
    for node in graph.nodes if graph is not None else ():
        if node.op == "placeholder":
            made.setdefault(storage_of(node), 1)
    for k, node in enumerate(ops):
        made.setdefault(storage_of(node), k + 1)
    made.pop(None, None)
    return made


def _spans(starts: list[int], count: int) -> list[tuple[int, int]]:
    return list(zip(starts, [*starts[1:], count]))


def node_cost(node: fx.Node, module: fx.GraphModule, cost: str) -> int:
    if cost == "time":
        return info(node).time_ns
    if cost == "params":
        own = info(node).param_bytes
        return own + sum(info(a).param_bytes for a in node.all_input_nodes if a.op == "get_attr")
    return info(node).flops


def atoms_of(ops: list[fx.Node]) -> list[list[fx.Node]]:
    """Group ``ops`` into runs that no stage boundary may split: the span of a value that
    cannot cross a boundary, and a value's producer through every op writing it in place."""
    position = {node: k for k, node in enumerate(ops)}
    blocked = [0] * (len(ops) + 1)  # blocked[k] > 0: no stage may start at ops[k]
    for node in ops:
        if is_transferable(node.meta.get("val")):
            continue
        last_use = max((position[u] for u in node.users if u in position), default=-1)
        if last_use > position[node]:
            blocked[position[node] + 1] += 1
            blocked[last_use + 1] -= 1
    # An op writing a value in place runs in the stage that made the value (a model input's
    # writer in the first stage): a received value is a leaf autograd may not change in place,
    # and every later stage must receive the value as written, as eager code sees it.
    made = _first_makers(ops)
    for node in ops:
        for written in mutated_inputs(node):
            start = made.get(storage_of(written), position.get(written, -1) + 1)
            if 0 < start <= position[node]:  # 0: a parameter or buffer, it stays where used
                blocked[start] += 1
                blocked[position[node] + 1] -= 1
    atoms: list[list[fx.Node]] = []
    running = 0
    for k, node in enumerate(ops):
        running += blocked[k]
        if running > 0 and atoms:
            atoms[-1].append(node)
        else:
            atoms.append([node])
    return atoms
