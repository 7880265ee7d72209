"""Price a plan as a stage graph: the model's branches side by side on devices of their own.

The search prices every plan of a schedule that runs stage graphs (``schedules.GRAPHS``) on
one stage a device and no replicas twice: as the chain its split gives, and as the graph
split of the same devices (``balance.graph_partition`` on the atoms' times under the plan's
cost model, the best over the model's parallel blocks). The graph's program is the
schedule's on that stage graph; its stages cost what the chain's do (a third of an atom's
time forward, two thirds backward, the runtime's overhead per instruction, the split
backward's walk), plus the seconds of the bytes each stage receives from another device
(its inputs forward, their gradients backward) at the model's bandwidth and message
latency; then the optimizer step after the drain, as a chain's. A model without such
branches, or with fewer items than the devices, has no graph plan.
"""

from __future__ import annotations

from dataclasses import replace

from pipecompile.balance.fork_join import ForkJoin, fork_joins
from pipecompile.balance.graph_partition import GraphSplit, best_split
from pipecompile.balance.partition_problem import AtomFacts
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.ir.programs.memory_model import device_peak_bytes, peak_weight_copies
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.recompute_policy import policy_counts, with_recompute
from pipecompile.ir.programs.simulate import Costs, simulate
from pipecompile.ir.programs.topology import Topology
from pipecompile.planner.plan import Plan, Predicted
from pipecompile.planner.predict import Predictor
from pipecompile.schedules import Links, graph_program, schedule_of

__all__ = ["predict_graph"]

_PS = 1e-12  # an atom's time is in picoseconds


def predict_graph(predictor: Predictor, plan: Plan) -> Predicted | None:
    """``plan`` as a stage graph, predicted; None where it has none (see the module doc)."""
    facts, machine = predictor.facts, predictor.machine
    if plan.replicas or schedule_of(plan.schedule).on_graph is None or plan.stages < 2:
        return None
    if schedule_of(plan.schedule).placement != "one" or not facts.reads or facts.forced:
        return None
    size = predictor.batch // plan.microbatches
    atoms = predictor.atoms_at(size)
    weights = list(atoms.cost)
    split = _split(predictor, size, plan.stages, weights)
    if split is None:
        return None
    links = Links.of(len(split.pieces), split.edges(facts.reads, facts.readers))
    compute = graph_program(plan.schedule, links, split.stage_device, plan.microbatches)
    program = with_recompute(compute, policy_counts(plan.recompute, compute))
    scale = size / facts.size
    received = _received(split, facts.reads, [b * scale for b in facts.sent])
    costs = _costs(split, weights, received, predictor.walk_at(size), machine)
    edges = frozenset((s, t) for t, ps in enumerate(links.producers) for s in ps)
    timeline = simulate(program, Topology(len(split.pieces), edges), costs)
    memory, optimizer = _memory(split, program, atoms, received, machine)
    step = timeline.makespan
    if machine.concurrency:
        busy = sum(timeline.busy(d) for d in range(timeline.devices))
        step = max(step, busy / machine.concurrency)
    limits = [machine.limit(d) for d in range(len(memory))]
    if any(limit is not None and used > limit for limit, used in zip(limits, memory)):
        return None
    return Predicted(
        replace(plan, graph=True), step + optimizer, timeline.bubble_fraction, tuple(memory), ()
    )


def _split(predictor: Predictor, size: int, devices: int, weights: list[int]) -> GraphSplit | None:
    """The best graph split over the model's parallel blocks (found once, their branches
    joined by FLOPs), once per size and devices."""
    key = (size, devices)
    if "blocks" not in predictor.graph_splits:
        facts = predictor.facts
        predictor.graph_splits["blocks"] = fork_joins(facts.reads, [int(f) for f in facts.flops])
    if key not in predictor.graph_splits:
        blocks: list[ForkJoin] = predictor.graph_splits["blocks"]  # type: ignore[assignment]
        predictor.graph_splits[key] = best_split(weights, blocks, devices)
    return predictor.graph_splits[key]  # type: ignore[return-value]


def _costs(
    split: GraphSplit,
    weights: list[int],
    received: list[float],
    walk: list[float],
    machine: CostModel,
) -> Costs:
    """Each stage's forward, backward and split-backward extra seconds."""
    forward, backward, extra = [], [], []
    for piece, nbytes in zip(split.pieces, received):
        work = sum(weights[a] for a in piece.items) * _PS
        comm = nbytes / machine.bandwidth + (machine.message_latency if nbytes else 0.0)
        forward.append(work / 3 + comm)
        backward.append(2 * work / 3 + comm)
        extra.append(sum(walk[a] for a in piece.items))
    return Costs(tuple(forward), tuple(backward), machine.instr_overhead, tuple(extra))


def _memory(
    split: GraphSplit,
    program: Program,
    atoms: AtomFacts,
    received: list[float],
    machine: CostModel,
) -> tuple[list[int], float]:
    """Per device its parameter copies and peak of stored activations (a stage stores its
    atoms' saved bytes and what it received), and the slowest device's optimizer step."""
    params = [sum(atoms.params[a] for a in p.items) for p in split.pieces]
    inputs = [round(n) for n in received]
    saved = [sum(atoms.saved[a] for a in p.items) + n for p, n in zip(split.pieces, inputs)]
    memory, optimizer = [], 0.0
    for d, instrs in enumerate(program.devices):
        mine = [j for j, on in enumerate(program.stage_device) if on == d]
        copies = 2 + machine.optimizer_states + peak_weight_copies(instrs)
        held = sum(params[j] for j in mine)
        memory.append(copies * held + device_peak_bytes(instrs, saved, inputs))
        if machine.optimizer_rate:
            optimizer = max(optimizer, held / machine.optimizer_rate)
    return memory, optimizer


def _received(
    split: GraphSplit, reads: tuple[tuple[int, ...], ...], sent: list[float]
) -> list[float]:
    """Per stage, the bytes it receives from stages on other devices."""
    stage = {a: j for j, p in enumerate(split.pieces) for a in p.items}
    device = split.stage_device
    out = [0.0] * len(split.pieces)
    for j, piece in enumerate(split.pieces):
        producers = {r for a in piece.items for r in reads[a] if device[stage[r]] != device[j]}
        out[j] = sum(sent[r] for r in producers)
    return out
