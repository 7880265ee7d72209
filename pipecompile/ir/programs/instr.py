"""One schedule instruction, ``Instr(op, stage, microbatch)``, printed and parsed as ``1F0``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from pipecompile.errors import ProgramError

__all__ = [
    "Instr",
    "Op",
    "OPS",
    "MICROBATCH_OPS",
    "FORWARD_OPS",
    "BACKWARD_OPS",
    "GRADIENT_OPS",
    "INPUT_GRADIENT_OPS",
    "INFERENCE_OPS",
    "STEP_OPS",
]


class Op(str, Enum):
    """What an instruction does. An ``Op`` is its own name as a string (``Op.F == "F"``, and it
    prints as ``F``), so the program text and JSON read and write it unchanged. Ops that act on
    one micro-batch print as ``{stage}{op}{microbatch}``; the others print as ``{stage}{op}``."""

    F = "F"
    FC = "FC"
    B = "B"
    I = "I"  # noqa: E741 - the zero-bubble papers' name for the input-gradient half
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    ALLREDUCE_TIED = "ALLREDUCE_TIED"
    ALLREDUCE_REPLICAS = "ALLREDUCE_REPLICAS"
    STEP = "STEP"
    STASH = "STASH"
    UPDATE = "UPDATE"

    __str__ = str.__str__  # "F", not "Op.F", on every Python version
    __format__ = str.__format__

    @property
    def description(self) -> str:
        return OPS[self]


# op -> what it does (docs/FORMAT.md lists the same).
OPS: dict[Op, str] = {
    Op.F: "forward of the stage on one micro-batch; stores what backward needs",
    Op.FC: "forward, recomputed: stores only the stage inputs; backward recomputes the rest",
    Op.B: "backward of the stage on one micro-batch; accumulates parameter gradients",
    Op.I: "backward, input half: gradients of the stage inputs only (zero-bubble split)",
    Op.W: "backward, weight half: parameter gradients of a micro-batch whose I has run",
    Op.SEND_F: "send the stage's cross-device outputs of one micro-batch to their consumers",
    Op.RECV_F: "receive the stage's cross-device inputs of one micro-batch from their producers",
    Op.SEND_B: "send the gradients of the stage's received inputs back to their producers",
    Op.RECV_B: "receive the gradients of the stage's sent outputs from their consumers",
    Op.ALLREDUCE_TIED: "contribute the stage's tied-parameter gradients to their sum over holders",
    Op.ALLREDUCE_REPLICAS: "sum the stage's gradients over the ranks replicating it",
    Op.STEP: "optimizer step of the stage's parameters (tied ones: once summed), zero gradients",
    Op.STASH: "keep the stage's current weights as the version one micro-batch's F and B use",
    Op.UPDATE: "optimizer step with one micro-batch's gradients (asynchronous schedules)",
}
# The groups every layer asks about, named once:
FORWARD_OPS = frozenset({Op.F, Op.FC})  # a micro-batch's forward (recomputed or not)
BACKWARD_OPS = frozenset({Op.B, Op.I, Op.W})  # a micro-batch's backward, whole or split
GRADIENT_OPS = frozenset({Op.B, Op.W})  # the one that computes its parameter gradients
INPUT_GRADIENT_OPS = frozenset({Op.B, Op.I})  # the one that sends gradients to its inputs
INFERENCE_OPS = FORWARD_OPS | {Op.SEND_F, Op.RECV_F}  # what a forward-only program keeps
STEP_OPS = frozenset({Op.STEP, Op.ALLREDUCE_TIED, Op.ALLREDUCE_REPLICAS})  # once per step, no i
MICROBATCH_OPS = frozenset(OPS) - STEP_OPS

_PATTERN = re.compile(r"^(\d+)([A-Z_]+)(\d*)$")


@dataclass(frozen=True, order=True)
class Instr:
    """A single instruction: ``op`` on ``stage`` for ``microbatch`` (None for per-step ops).

    Example:
        >>> Instr.parse("1F0") == Instr(Op.F, 1, 0)
        True
        >>> str(Instr(Op.STEP, 2))
        '2STEP'
    """

    op: Op
    stage: int
    microbatch: int | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ProgramError(f"unknown instruction op {self.op!r}; known ops: {', '.join(OPS)}")
        object.__setattr__(self, "op", Op(self.op))  # "F" given as text is Op.F from here on
        wants_mb = self.op in MICROBATCH_OPS
        if wants_mb and self.microbatch is None:
            raise ProgramError(f"instruction {self.op} on stage {self.stage} needs a micro-batch")
        optional = self.op == Op.ALLREDUCE_TIED  # with one: a window's sum (PipeDream-2BW)
        if not wants_mb and not optional and self.microbatch is not None:
            raise ProgramError(f"instruction {self.op} takes no micro-batch, got {self.microbatch}")

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.op}{mb}"

    @classmethod
    def parse(cls, text: str) -> Instr:
        """Parse the text form written by ``str``; raises ProgramError on anything else."""
        match = _PATTERN.match(text.strip())
        if match is None:
            raise ProgramError(
                f"cannot parse instruction {text!r}: expected STAGE OP [MICROBATCH], e.g. 1F0"
            )
        stage, op, mb = match.groups()
        return cls(op, int(stage), int(mb) if mb else None)
