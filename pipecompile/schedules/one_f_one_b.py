"""1F1B (PipeDream-Flush): after a short warm-up each stage alternates one forward and one
backward, so a stage never holds more micro-batches than there are stages after it."""

from __future__ import annotations

from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.schedules.record import Schedule, fill_drain

__all__ = ["SCHEDULE", "one_f_one_b", "order_1f1b"]


def order_1f1b(j: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """Stage ``j``'s compute order as ``(op, i)`` with op ``F`` or ``B``.

    Warm-up: ``min(p - j - 1, m)`` forwards; steady state: one forward, one backward; drain:
    the remaining backwards. Stage j therefore holds at most ``min(p - j, m)`` micro-batches.
    """
    warmup = min(stages - j - 1, microbatches)
    order = [(Op.F, i) for i in range(warmup)]
    for k in range(microbatches - warmup):
        order += [(Op.F, warmup + k), (Op.B, k)]
    order += [(Op.B, i) for i in range(microbatches - warmup, microbatches)]
    return order


def one_f_one_b(stages: int, microbatches: int) -> Program:
    """Compute-only 1F1B program, stage j on device j. For 3 stages and 4 micro-batches
    (F = 1 clock, B = 2 clocks)::

        clock     0   1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17
        device 0 F0  F1  F2  .   .   .   .   B0  B0  F3  B1  B1  .   B2  B2  .   B3  B3
        device 1 .   F0  F1  .   .   B0  B0  F2  B1  B1  F3  B2  B2  .   B3  B3  .   .
        device 2 .   .   F0  B0  B0  F1  B1  B1  F2  B2  B2  F3  B3  B3  .   .   .   .

    Same bubble as GPipe, (p-1)/(m+p-1), but device j stores at most min(p-j, m)
    micro-batches' activations instead of m. One optimizer step per mini-batch, so gradients
    equal GPipe's.
    """
    devices = []
    for j in range(stages):
        instrs = [Instr(op, j, i) for op, i in order_1f1b(j, stages, microbatches)]
        devices.append(tuple(instrs + [Instr(Op.STEP, j)]))
    return Program("1f1b", microbatches, tuple(range(stages)), tuple(devices))


SCHEDULE = Schedule(
    "1f1b",
    one_f_one_b,
    synchronous=True,
    placement="one",
    split_backward=False,
    replicable=True,
    bubble=fill_drain,
    on_graph="one_f_one_b",
)
