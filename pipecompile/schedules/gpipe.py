"""GPipe: every micro-batch's forward, then every backward, then one optimizer step."""

from __future__ import annotations

from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.schedules.record import Schedule, fill_drain

__all__ = ["SCHEDULE", "gpipe"]


def gpipe(stages: int, microbatches: int) -> Program:
    """Compute-only GPipe program, stage j on device j. For 3 stages and 4 micro-batches::

        clock     0   1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17
        device 0 F0  F1  F2  F3  .   .   .   .   .   .   B3  B3  B2  B2  B1  B1  B0  B0
        device 1 .   F0  F1  F2  F3  .   .   .   B3  B3  B2  B2  B1  B1  B0  B0  .   .
        device 2 .   .   F0  F1  F2  F3  B3  B3  B2  B2  B1  B1  B0  B0  .   .   .   .

    Backward runs in reverse micro-batch order, so the last forward's activations are used
    first. Gradients accumulate over micro-batches; STEP applies them once per mini-batch.
    """
    devices = []
    for j in range(stages):
        forward = [Instr(Op.F, j, i) for i in range(microbatches)]
        backward = [Instr(Op.B, j, i) for i in reversed(range(microbatches))]
        devices.append(tuple(forward + backward + [Instr(Op.STEP, j)]))
    return Program("gpipe", microbatches, tuple(range(stages)), tuple(devices))


SCHEDULE = Schedule(
    "gpipe",
    gpipe,
    synchronous=True,
    placement="one",
    split_backward=False,
    replicable=True,
    bubble=fill_drain,
    on_graph="fill_drain",
)
