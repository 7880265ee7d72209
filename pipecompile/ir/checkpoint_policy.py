"""What a ``--checkpoint`` policy keeps: per stage, how many micro-batches' forwards (the first
ones) store only their inputs (``FC``) and are recomputed in backward."""

from __future__ import annotations

from dataclasses import replace

from pipecompile.errors import PipecompileError
from pipecompile.ir.instr import Instr, Op
from pipecompile.ir.program import Program

__all__ = ["POLICIES", "check_policy", "policy_counts", "with_checkpoints"]

POLICIES = ("never", "except_last", "always")


def check_policy(policy: str) -> None:
    """Raise PipecompileError naming the policies if ``policy`` is not one of them."""
    if policy not in POLICIES:
        raise PipecompileError(f"--checkpoint {policy!r}: choose one of {', '.join(POLICIES)}")


def policy_counts(policy: str, program: Program) -> dict[int, int]:
    """Stage -> how many of its first micro-batches ``policy`` checkpoints: the same on every
    stage (``never``: none, ``except_last``: all but the last, ``always``: all)."""
    check_policy(policy)
    m = program.microbatches
    count = {"never": 0, "except_last": m - 1, "always": m}[policy]
    return dict.fromkeys(range(program.num_stages), count)


def with_checkpoints(program: Program, counts: dict[int, int]) -> Program:
    """``program`` with the forward ``jF i`` of the first ``counts[j]`` micro-batches as
    ``jFC i``."""

    def convert(x: Instr) -> Instr:
        if x.op == Op.F and x.microbatch is not None and x.microbatch < counts.get(x.stage, 0):
            return Instr(Op.FC, x.stage, x.microbatch)
        return x

    devices = tuple(tuple(convert(x) for x in instrs) for instrs in program.devices)
    return replace(program, devices=devices)
