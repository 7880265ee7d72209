"""One schedule instruction, ``Instr(op, stage, microbatch)``, printed and parsed as ``1F0``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipecompile.errors import ProgramError

__all__ = [
    "Instr", "OPS", "MICROBATCH_OPS", "FORWARD_OPS", "BACKWARD_OPS", "GRADIENT_OPS",
    "INPUT_GRADIENT_OPS", "INFERENCE_OPS", "STEP_OPS",
]  # fmt: skip

# op -> what it does. Ops that act on one micro-batch print as `{stage}{op}{microbatch}`;
# the others print as `{stage}{op}`.
OPS: dict[str, str] = {
    "F": "forward of the stage on one micro-batch; stores what backward needs",
    "FC": "forward, checkpointed: stores only the stage inputs; backward recomputes the rest",
    "B": "backward of the stage on one micro-batch; accumulates parameter gradients",
    "I": "backward, input half: gradients of the stage inputs only (zero-bubble split)",
    "W": "backward, weight half: parameter gradients of a micro-batch whose I has run",
    "SEND_F": "send the stage's cross-device outputs of one micro-batch to their consumers",
    "RECV_F": "receive the stage's cross-device inputs of one micro-batch from their producers",
    "SEND_B": "send the gradients of the stage's received inputs back to their producers",
    "RECV_B": "receive the gradients of the stage's sent outputs from their consumers",
    "ALLREDUCE_TIED": "contribute the stage's tied-parameter gradients to their sum over holders",
    "ALLREDUCE_REPLICAS": "sum the stage's gradients over the ranks replicating it",
    "STEP": "optimizer step of the stage's parameters (tied ones: once summed), zero gradients",
    "STASH": "keep the stage's current weights as the version one micro-batch's F and B use",
    "UPDATE": "optimizer step with one micro-batch's gradients (asynchronous schedules)",
}
# The groups every layer asks about, named once:
FORWARD_OPS = frozenset({"F", "FC"})  # a micro-batch's forward (checkpointed or not)
BACKWARD_OPS = frozenset({"B", "I", "W"})  # a micro-batch's backward, whole or split
GRADIENT_OPS = frozenset({"B", "W"})  # the one that computes its parameter gradients
INPUT_GRADIENT_OPS = frozenset({"B", "I"})  # the one that sends gradients to its inputs
INFERENCE_OPS = FORWARD_OPS | {"SEND_F", "RECV_F"}  # what a forward-only program keeps
STEP_OPS = frozenset({"STEP", "ALLREDUCE_TIED", "ALLREDUCE_REPLICAS"})  # once per step, no i
MICROBATCH_OPS = frozenset(OPS) - STEP_OPS

_PATTERN = re.compile(r"^(\d+)([A-Z_]+)(\d*)$")


@dataclass(frozen=True, order=True)
class Instr:
    """A single instruction: ``op`` on ``stage`` for ``microbatch`` (None for per-step ops).

    Example:
        >>> Instr.parse("1F0")
        Instr(op='F', stage=1, microbatch=0)
        >>> str(Instr("STEP", 2))
        '2STEP'
    """

    op: str
    stage: int
    microbatch: int | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ProgramError(f"unknown instruction op {self.op!r}; known ops: {', '.join(OPS)}")
        wants_mb = self.op in MICROBATCH_OPS
        if wants_mb and self.microbatch is None:
            raise ProgramError(f"instruction {self.op} on stage {self.stage} needs a micro-batch")
        if not wants_mb and self.microbatch is not None:
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
