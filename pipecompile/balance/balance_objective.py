"""Solve the balancer's partition problem under the machine model and describe the result.

Two objectives:
- plain (no machine model): the largest stage's summed cost, solved by
  ``min_max_partition`` (with ``min_max_partition_with_cuts`` for requested boundaries);
- modelled: the slowest stage's predicted time, compute plus communication, at each
  device's speed, optionally replicated over ``workers`` ranks, under each device's memory
  limit, solved by ``partition_search.solve``.
Both are exact; the report gives the bottleneck, a lower bound no split can beat, and the
optimum without the requested boundaries.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np

from pipecompile.balance.min_max_partition import (
    bottleneck,
    min_max_partition,
    min_max_partition_with_cuts,
)
from pipecompile.balance.partition_problem import AtomFacts, build_problem
from pipecompile.balance.partition_search import Limit, part_times, solve
from pipecompile.errors import BalanceError
from pipecompile.ir.programs.cost_model import CostModel, scaled_speeds
from pipecompile.ir.programs.program import Program
from pipecompile.ir.records.balance_report import BalanceJson
from pipecompile.ir.records.sizes import format_size

__all__ = ["plain_split", "modelled_split"]


def plain_split(weights: list[int], stages: int, cuts: list[int]) -> tuple[list[int], BalanceJson]:
    """Stage starts minimising the largest summed weight, and the report's figures."""
    starts = (
        min_max_partition_with_cuts(weights, stages, cuts)
        if cuts
        else min_max_partition(weights, stages)
    )
    bounds = [*starts[1:], len(weights)]
    per_stage = [sum(weights[a:b]) for a, b in zip(starts, bounds)]
    optimum = bottleneck(weights, min_max_partition(weights, stages)) if cuts else max(per_stage)
    return starts, {
        "stage_costs": per_stage,
        "bottleneck": max(per_stage),
        "lower_bound": max(max(weights, default=0), -(-sum(weights) // stages)),
        "unconstrained_optimum": optimum,
    }


def modelled_split(
    facts: AtomFacts, *, kind: str, machine: CostModel, program: Program, cuts: list[int]
) -> tuple[list[int], BalanceJson]:
    """Stage starts minimising the slowest stage's predicted time, and the report: times in
    nanoseconds (bytes for ``--balance params``), the replica counts and the model used."""
    problem, unit = build_problem(facts, kind=kind, machine=machine, program=program, forced=cuts)
    found = solve(problem)
    if found is None:
        raise BalanceError(_no_fit(facts, machine, program))
    free = found
    if cuts:
        free = solve(build_problem(facts, kind=kind, machine=machine, program=program)[0]) or found
    starts = list(found.starts)
    ends = [*starts[1:], len(facts.cost)]
    compute = part_times(replace(problem, cut=problem.cut * 0, param=None), starts, found.replicas)
    scale = unit / 1e6 if kind != "params" else unit  # one unit in ns (or bytes)
    comm = [int(problem.cut[a] + problem.cut[b]) for a, b in zip(starts, ends)]
    lower = _lower_bound(facts.cost, _mults(kind, machine, program), machine.workers) / unit
    return starts, {
        "unit": "ns" if kind != "params" else "bytes",
        "stage_costs": [round(t * scale, 3) for t in found.times],
        "stage_compute": [round(t * scale, 3) for t in compute],
        "stage_comm": [round(t * scale, 3) for t in comm],
        "stage_comm_bytes": [
            int(facts.forward[a] + facts.backward[a] + facts.forward[b] + facts.backward[b])
            for a, b in zip(starts, ends)
        ],
        "stage_params": [sum(facts.params[a:b]) for a, b in zip(starts, ends)],
        "bottleneck": round(found.bottleneck * scale, 3),
        "lower_bound": round(lower * scale, 3),
        "unconstrained_optimum": round(free.bottleneck * scale, 3),
        "replicas": list(found.replicas),
        "model": {k: None if v == float("inf") else v for k, v in asdict(machine).items()},
        **({"stage_memory": _memory(problem.limits, starts, ends)} if problem.limits else {}),
    }


def _memory(limits: tuple[tuple[Limit, ...], ...], starts: list[int], ends: list[int]) -> list[int]:
    """Per stage, the memory the model predicts at its device's worst peak."""
    return [
        max(int(x.mem[b] - x.mem[a] + x.at_start[a]) for x in limits[j])
        for j, (a, b) in enumerate(zip(starts, ends))
    ]


def _lower_bound(costs: list[int], mults: list[int], workers: int | None) -> int:
    """No split beats the largest atom on the fastest device (shared by every spare
    replica), nor the total cost spread over all workers in proportion to their speed."""
    spare = 1 + (workers - len(mults) if workers else 0)
    biggest = -(-max(costs, default=0) * min(mults) // spare)
    capacity = sum(1 / m for m in mults) + (spare - 1) / min(mults)
    return max(biggest, int(np.ceil(sum(costs) / capacity)))


def _mults(kind: str, machine: CostModel, program: Program) -> list[int]:
    if kind == "params":
        return [1] * program.num_stages
    return scaled_speeds(machine, program.stage_device)


def _no_fit(facts: AtomFacts, machine: CostModel, program: Program) -> str:
    params = sum(facts.params)
    limits = ", ".join(format_size(machine.limit(d) or 0) for d in range(len(program.devices)))
    return (
        f"no split into {program.num_stages} stages fits --memory-limit {limits}: the model "
        f"has {format_size(params)} of parameters (each stage keeps "
        f"{2 + machine.optimizer_states} copies: weights, gradients, optimizer state, plus any "
        "stashed versions) and the schedule keeps activations of several micro-batches; "
        "raise the limit, use more stages or --recompute always, or a schedule that keeps "
        "fewer micro-batches in flight (docs/schedules/: its memory column)"
    )
