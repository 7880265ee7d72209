"""Pass: insert_replication — let a stage be replicated over several ranks (PipeDream's
"2-1-1"): the replicas share its micro-batches and sum their gradients before the step.

Requires: a synchronous program with one stage per device, and a replica count per stage.
Guarantees: a new program with ``jALLREDUCE_REPLICAS`` just before ``jSTEP`` on every stage
with more than one replica. The program stays the logical one; replica k of a stage with r
replicas runs that device's per-micro-batch instructions for micro-batches i with
i mod r == k, and the per-step ones (ALLREDUCE_*, STEP) on every replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.schedules import ORDER, REPLICABLE, listed, schedule_of

__all__ = ["insert_replication", "parse_replicas"]


def parse_replicas(text: str, stages: int) -> tuple[int, ...]:
    """``"2,1,1"`` -> (2, 1, 1); ProgramError unless one positive count per stage."""
    try:
        counts = tuple(int(t) for t in text.split(","))
    except ValueError:
        counts = ()
    if len(counts) != stages or min(counts, default=0) < 1:
        raise ProgramError(
            f"--replicate {text!r}: give one replica count of at least 1 per stage, "
            f"comma-separated ({stages} stages, e.g. {','.join(['2'] + ['1'] * (stages - 1))})"
        )
    return counts


def insert_replication(program: Program, *, replicas: Sequence[int]) -> Program:
    """Return ``program`` with ALLREDUCE_REPLICAS added (see the module docstring)."""
    if all(r == 1 for r in replicas):
        return program
    if len(set(program.stage_device)) != program.num_stages:
        several = listed((n for n in ORDER if schedule_of(n).placement != "one"), "and")
        raise ProgramError(
            f"replicated stages need one stage per device; {several} put several stages on "
            f"one device: use {listed(REPLICABLE)}"
        )
    if any(x.op == Op.UPDATE for _, _, x in program.instructions()):
        raise ProgramError(
            f"replicated stages need a synchronous schedule ({listed(REPLICABLE)}): replicas "
            "of an asynchronously updated stage would drift apart"
        )
    idle = [(j, r) for j, r in enumerate(replicas) if r > program.microbatches]
    if idle:
        j, r = idle[0]
        raise ProgramError(
            f"--replicate gives stage {j} {r} replicas but the step has "
            f"{program.microbatches} micro-batch{'es' * (program.microbatches != 1)}: replica k "
            f"runs the micro-batches i with i mod {r} == k, so {r - program.microbatches} of "
            f"them would have none; give --microbatches {r} or more, or fewer replicas"
        )
    devices = []
    for instrs in program.devices:
        out: list[Instr] = []
        for x in instrs:
            if x.op == Op.STEP and replicas[x.stage] > 1:
                out.append(Instr(Op.ALLREDUCE_REPLICAS, x.stage))
            out.append(x)
        devices.append(tuple(out))
    return replace(program, devices=tuple(devices))
