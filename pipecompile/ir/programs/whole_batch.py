"""Whether a program can wait for a loss over the whole batch: its last stage runs the forward
of every micro-batch before the backward of any.

A loss that mixes the samples of its batch (a contrastive loss) is computed once a step, on the
outputs of all micro-batches joined, and its gradient returns to each micro-batch's backward.
That needs the last stage's forwards all done before its first backward: GPipe's fill and drain
waits so; 1F1B and the schedules after it start a micro-batch's backward as soon as its
forward ends, and cannot.
"""

from __future__ import annotations

from pipecompile.ir.programs.instr import BACKWARD_OPS, FORWARD_OPS
from pipecompile.ir.programs.program import Program

__all__ = ["waits_for_whole_batch"]


def waits_for_whole_batch(program: Program) -> bool:
    """Whether every forward of the last stage precedes its first backward in ``program``
    (a program of one micro-batch always does)."""
    last = len(program.stage_device) - 1
    instrs = program.devices[program.stage_device[last]]
    forwards = {x.microbatch for x in instrs if x.stage == last and x.op in FORWARD_OPS}
    seen: set[int | None] = set()
    for x in instrs:
        if x.stage != last:
            continue
        if x.op in FORWARD_OPS:
            seen.add(x.microbatch)
        elif x.op in BACKWARD_OPS and seen != forwards:
            return False
    return True
