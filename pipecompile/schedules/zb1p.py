"""ZB-H1 (zero bubble, 1F1B's peak memory): backward split into I (input gradients, on the
critical path) and W (weight gradients, off it); W's are deferred to fill the drain."""

from __future__ import annotations

from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.schedules.record import Schedule, zero_bubble

__all__ = ["SCHEDULE", "zb1p"]


def zb1p(stages: int, microbatches: int) -> Program:
    """Compute-only ZB-H1 program, stage j on device j. For 4 stages and 6 micro-batches
    (F = I = W = 1 clock)::

        clock     0   1   2   3   4   5   6   7   8   9  10  11  12  13  14  15  16  17  18  19  20
        device 0  F0  F1  F2  F3  .   .   .   I0  W0  F4  I1  W1  F5  I2  W2  I3  W3  I4  W4  I5  W5
        device 1  .   F0  F1  F2  .   .   I0  F3  I1  W0  F4  I2  W1  F5  I3  W2  I4  W3  I5  W4  W5
        device 2  .   .   F0  F1  .   I0  F2  I1  F3  I2  W0  F4  I3  W1  F5  I4  W2  I5  W3  W4  W5
        device 3  .   .   .   F0  I0  F1  I1  F2  I2  F3  I3  W0  F4  I4  W1  F5  I5  W2  W3  W4  W5

    Stage j warms up with min(p-j, m) forwards, then repeats I, W (deferred by j
    micro-batches), F, and drains the deferred W's. Only I travels back through the pipeline
    and the deferred W's fill the drain, so the bubble shrinks from (p-1)(F+B) to
    (p-1)(F+I-W): a third with uniform costs when m >= p. A micro-batch is held from F to its
    W; every device holds at most min(p, m), the peak 1F1B reaches on its first device.
    """
    devices = []
    for j in range(stages):
        warmup = min(stages - j, microbatches)
        instrs = [Instr(Op.F, j, i) for i in range(warmup)]
        weights = 0  # W's issued so far; stage j runs W(k - j) after I(k)
        for k in range(microbatches):
            instrs.append(Instr(Op.I, j, k))
            if k >= j:
                instrs.append(Instr(Op.W, j, weights))
                weights += 1
            if warmup + k < microbatches:
                instrs.append(Instr(Op.F, j, warmup + k))
        instrs += [Instr(Op.W, j, i) for i in range(weights, microbatches)]
        devices.append(tuple(instrs + [Instr(Op.STEP, j)]))
    return Program("zb1p", microbatches, tuple(range(stages)), tuple(devices))


SCHEDULE = Schedule(
    "zb1p",
    zb1p,
    synchronous=True,
    placement="one",
    split_backward=True,
    replicable=True,
    bubble=zero_bubble,
    on_graph="zero_bubble",
)
