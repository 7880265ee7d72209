"""What a ``--recompute`` policy (activation checkpointing) keeps: per stage, how many
micro-batches' forwards (the first ones) store only their inputs (``FC``) and are recomputed in
backward."""

from __future__ import annotations

from dataclasses import replace

from pipecompile.errors import PipecompileError
from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.program import Program

__all__ = ["POLICIES", "check_policy", "chosen_policy", "policy_counts", "with_recompute"]

POLICIES = ("never", "except_last", "always")


def check_policy(policy: str) -> None:
    """Raise PipecompileError naming the policies if ``policy`` is not one of them."""
    if policy not in POLICIES:
        raise PipecompileError(f"--recompute {policy!r}: choose one of {', '.join(POLICIES)}")


def chosen_policy(recompute: str, checkpoint: str | None) -> str:
    """The policy asked for: ``recompute``, or ``checkpoint`` (its old name) when given.

    Raises:
        PipecompileError: both are given, with different policies.
    """
    if checkpoint is None or checkpoint == recompute:
        return recompute
    if recompute != "never":
        raise PipecompileError(
            f"recompute={recompute!r} and checkpoint={checkpoint!r}: checkpoint is the old "
            "name of recompute; give one"
        )
    return checkpoint


def policy_counts(policy: str, program: Program) -> dict[int, int]:
    """Stage -> how many of its first micro-batches ``policy`` recomputes: the same on every
    stage (``never``: none, ``except_last``: all but the last, ``always``: all)."""
    check_policy(policy)
    m = program.microbatches
    count = {"never": 0, "except_last": m - 1, "always": m}[policy]
    return dict.fromkeys(range(program.num_stages), count)


def with_recompute(program: Program, counts: dict[int, int]) -> Program:
    """``program`` with the forward ``jF i`` of the first ``counts[j]`` micro-batches as
    ``jFC i``."""

    def convert(x: Instr) -> Instr:
        if x.op == Op.F and x.microbatch is not None and x.microbatch < counts.get(x.stage, 0):
            return Instr(Op.FC, x.stage, x.microbatch)
        return x

    devices = tuple(tuple(convert(x) for x in instrs) for instrs in program.devices)
    return replace(program, devices=devices)
