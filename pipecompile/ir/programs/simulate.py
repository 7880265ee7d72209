"""Simulate a program on per-stage costs: the timeline, makespan, bubble and in-flight peak.

Each device runs its instructions in order; an instruction starts when its device is free
and everything it waits for (``program_deps.requirements``) has finished. Communication and
optimizer instructions take no time. A state in which no device can start its next
instruction is a deadlock and raises ProgramError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import FORWARD_OPS, Instr, Op
from pipecompile.ir.programs.memory_model import peak_inflight
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.program_deps import Facts, requirements
from pipecompile.ir.programs.topology import Topology
from pipecompile.ir.programs.turns import take_turns

__all__ = ["Costs", "Span", "Timeline", "simulate"]


@dataclass(frozen=True)
class Costs:
    """Per-stage forward and (whole) backward durations; a split backward costs half each
    for I and W (plus ``split_extra``: both walk the backward graph, so the work that is not
    a matmul's is done twice); a recomputed forward's backward first recomputes the forward;
    every compute instruction costs ``overhead`` more."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    overhead: float = 0.0  # every compute instruction's own cost (the runtime's)
    split_extra: tuple[float, ...] = ()  # per stage: what I and W each cost beyond B / 2

    @classmethod
    def uniform(cls, stages: int) -> Costs:
        """F = 1 and B = 2 for every stage (so I = W = 1 when the backward is split)."""
        return cls((1.0,) * stages, (2.0,) * stages)

    @classmethod
    def from_flops(cls, flops: Sequence[float]) -> Costs:
        """Forward FLOPs as the forward cost and twice that for the backward."""
        return cls(tuple(float(f) for f in flops), tuple(2.0 * f for f in flops))

    def of(self, instr: Instr, facts: Facts) -> float:
        j = instr.stage
        recompute = self.forward[j] if facts.forward.get((j, instr.microbatch or 0)) == Op.FC else 0
        if instr.op in FORWARD_OPS:
            return self.forward[j] + self.overhead
        if instr.op == Op.B:
            return self.backward[j] + recompute + self.overhead
        extra = self.split_extra[j] if self.split_extra else 0.0
        if instr.op == Op.I:
            return self.backward[j] / 2 + extra + recompute + self.overhead
        if instr.op == Op.W:
            return self.backward[j] / 2 + extra + self.overhead
        return 0.0


@dataclass(frozen=True)
class Span:
    device: int
    instr: Instr
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """The simulated run: every instruction's span, and the figures derived from them."""

    spans: tuple[Span, ...]
    devices: int
    peak_inflight: tuple[int, ...]

    @property
    def makespan(self) -> float:
        return max((s.end for s in self.spans), default=0.0)

    def busy(self, device: int) -> float:
        return sum(s.end - s.start for s in self.spans if s.device == device)

    @property
    def bubble_fraction(self) -> float:
        """Idle device time over total device time, ``1 - sum(busy) / (devices * makespan)``."""
        total = self.devices * self.makespan
        if total == 0:
            return 0.0
        return 1.0 - sum(self.busy(d) for d in range(self.devices)) / total

    def as_dict(self) -> dict[str, object]:
        return {
            "makespan": self.makespan,
            "bubble_fraction": self.bubble_fraction,
            "peak_inflight": list(self.peak_inflight),
            "busy": [self.busy(d) for d in range(self.devices)],
        }


def simulate(program: Program, topology: Topology, costs: Costs) -> Timeline:
    """Run ``program`` on ``costs``; raises ProgramError (showing where) if it deadlocks."""
    facts = Facts.of(program, topology)
    end: dict[Instr, float] = {}
    clocks = [0.0] * len(program.devices)
    spans: list[Span] = []

    def run(d: int, instr: Instr) -> bool:
        start = _start(instr, d, facts, end, clocks)
        if start is None:
            return False
        finish = start + costs.of(instr, facts)
        end[instr] = clocks[d] = finish
        spans.append(Span(d, instr, start, finish))
        return True

    stuck = take_turns(program, run)
    if stuck is not None:
        shown = "\n".join(
            program.show_around(d, pc) for d, pc in enumerate(stuck) if pc < len(program.devices[d])
        )
        raise ProgramError(f"the program deadlocks: no device can proceed\n{shown}")
    return Timeline(tuple(spans), len(program.devices), peak_inflight(program))


def _start(
    instr: Instr, device: int, facts: Facts, end: dict[Instr, float], clocks: list[float]
) -> float | None:
    """When ``instr`` can start on ``device``, or None if something it waits for is not done."""
    needs = requirements(instr, facts)
    if not all(n in end for n in needs):
        return None
    return max([clocks[device]] + [end[n] for n in needs])
