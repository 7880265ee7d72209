"""Turn a graph's atoms, their costs, the schedule and the machine model into a partition
Problem whose part times are in femtoseconds (or parameter bytes for ``--balance params``).

Stage j on device d, spanning atoms [a, b):
- compute: the atoms' forward + backward time (measured, or 3 x forward FLOPs / flops_rate)
  divided by d's speed;
- communication: the forward and backward bytes at both of its boundaries over bandwidth,
  and a message's latency each way at each boundary between stages (waited for once, by
  the receiver: half to each side);
- replicated r times: the sum over r, plus a ring all-reduce of its gradients per step;
- memory: (2 + optimizer states + weight copies) x its parameter bytes, plus, at each of the
  schedule's peaks on d, ``full`` x (its saved activations + its input bytes) + ``inputs_only``
  x its input bytes (see ``stored_counts``); the input bytes are counted with the saved ones
  because a storage saved on both sides of a boundary is attributed to the first side.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch.fx as fx

from pipecompile.balance.cut_bytes import cut_bytes
from pipecompile.balance.partition_search import Limit, Problem
from pipecompile.errors import BalanceError
from pipecompile.ir.graph.node_info import CONVOLUTION, ELEMENTWISE, MATMUL, info
from pipecompile.ir.programs.cost_model import CostModel, scaled_speeds
from pipecompile.ir.programs.memory_model import peak_weight_copies, stored_counts
from pipecompile.ir.programs.program import Program

__all__ = ["AtomFacts", "StageShape", "atom_cost", "build_problem", "atom_facts"]

_PS = 1e12  # picoseconds per second
_FS = 1e15  # femtoseconds per second: the time unit (a speed multiplier of 1000 times ps)


@dataclass(frozen=True)
class AtomFacts:
    """Per atom: base cost (ps, or bytes for params), parameter and saved bytes; per
    boundary: forward and backward bytes."""

    cost: list[int]
    params: list[int]
    saved: list[int]
    forward: np.ndarray
    backward: np.ndarray


def atom_facts(
    graph: fx.Graph,
    atoms: list[list[fx.Node]],
    costs: Mapping[fx.Node, int],
    params: Mapping[fx.Node, int],
    saved: Mapping[fx.Node, int],
    *,
    kind: str,
    machine: CostModel,
) -> AtomFacts:
    """Gather the per-atom figures; ``costs`` are in the balance unit (ns, FLOPs, bytes)."""
    forward, backward = cut_bytes(graph, atoms)
    return AtomFacts(
        cost=[atom_cost([(costs[n], info(n).kind) for n in atom], kind, machine) for atom in atoms],
        params=[sum(params.get(n, 0) for n in atom) for atom in atoms],
        saved=[sum(saved.get(n, 0) for n in atom) for atom in atoms],
        forward=forward,
        backward=backward,
    )


def atom_cost(costs: Sequence[tuple[float, int]], kind: str, machine: CostModel) -> int:
    """An atom's cost in ps (bytes for params) from its ops' (cost, ``NodeInfo.kind``)
    pairs: measured ns, or their FLOPs under the model."""
    if kind == "flops":
        flops = {k: sum(c for c, op in costs if op == k) for k in (MATMUL, CONVOLUTION)}
        counts = {k: sum(1 for c, op in costs if op == k and c > 0) for k in (MATMUL, CONVOLUTION)}
        other = sum(c for c, op in costs if op == ELEMENTWISE)
        matmul, conv = flops[MATMUL], flops[CONVOLUTION]
        seconds = machine.op_seconds(
            matmul, other, len(costs), counts[MATMUL], conv, counts[CONVOLUTION]
        )
        return round(seconds * _PS)
    return round(sum(c for c, _ in costs) * (1000.0 if kind == "time" else 1.0))


class StageShape(Protocol):
    """What a problem needs of a program without memory limits: its stages' devices and its
    micro-batch count (a plan's shape, before its program is generated)."""

    num_stages: int
    stage_device: tuple[int, ...]
    microbatches: int


def build_problem(
    facts: AtomFacts,
    *,
    kind: str,
    machine: CostModel,
    program: Program | StageShape,
    forced: Sequence[int] = (),
    resolution: int = 1,
) -> tuple[Problem, int]:
    """The Problem for ``program``'s stages (see the module docstring) and how many
    femtoseconds one of its time units is (``resolution``, unless the figures are too large
    for int64; for ``--balance params`` its unit is a byte)."""
    stages = program.num_stages
    timed = kind != "params"
    speeds = scaled_speeds(machine, program.stage_device) if timed else [1] * stages
    base = np.array([0, *itertools.accumulate(facts.cost)], dtype=np.int64)  # ps (or bytes)
    comm = (facts.forward + facts.backward).astype(np.float64)
    grads = np.array([0, *itertools.accumulate(facts.params)], dtype=np.float64)
    per_byte = _FS / machine.bandwidth if timed else 0.0
    unit = resolution
    largest = int(base[-1]) * max(speeds) + per_byte * (2 * comm.max() + 2 * grads[-1])
    while largest / unit * program.microbatches * (machine.workers or 1) * 4 > 2**62:
        unit *= 10
    param = None
    if machine.workers is not None:
        param = np.rint(grads * (per_byte / unit)).astype(np.int64)
    cut = comm * (per_byte / unit)
    if timed and machine.message_latency and len(cut) > 2:
        # a message each way per boundary, each waited for once (by its receiver): the cut is
        # charged to both stages beside it, so half of each message's latency to each side
        cut[1:-1] += machine.message_latency * _FS / unit
    problem = Problem(
        work=tuple(base * s // unit for s in speeds),
        cut=np.rint(cut).astype(np.int64),
        limits=_limits(facts, machine, program) if machine.memory_limit else (),  # type: ignore[arg-type]
        forced=tuple(forced),
        workers=machine.workers,
        param=param,
        microbatches=program.microbatches,
    )
    return problem, unit


def _limits(
    facts: AtomFacts, machine: CostModel, program: Program
) -> tuple[tuple[Limit, ...], ...]:
    if len(program.devices) != program.num_stages:
        raise BalanceError(
            f"--memory-limit needs one stage per device; the {program.schedule} schedule puts "
            f"{program.num_stages // len(program.devices)} on each. Drop --memory-limit or "
            "use another schedule"
        )
    params = np.array([0, *itertools.accumulate(facts.params)], dtype=np.int64)
    saved = np.array([0, *itertools.accumulate(facts.saved)], dtype=np.int64)
    inputs = facts.forward
    out = []
    for d in program.stage_device:
        instrs = program.devices[d]
        copies = 2 + machine.optimizer_states + peak_weight_copies(instrs)
        limit = machine.limit(d)
        assert limit is not None
        out.append(
            tuple(
                Limit(copies * params + full * saved, (full + only) * inputs, limit)
                for full, only in sorted(stored_counts(instrs))
            )
        )
    return tuple(out)
