"""Breadth-first looped: each device holds v stages spaced p apart (as interleaved), and runs
every micro-batch through one of its stages before the next ("breadth first"), GPipe-like."""

from __future__ import annotations

from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.schedules.interleaved import looped_bubble, looped_devices
from pipecompile.schedules.record import Schedule

__all__ = ["SCHEDULE", "looped_bfs"]


def looped_bfs(stages: int, microbatches: int, virtual_stages: int = 2) -> Program:
    """Compute-only looped BFS program: stage j on device j mod p, p = stages / v. For 4
    stages on 2 devices (v = 2) and 2 micro-batches, F = 1 clock, B = 2 clocks::

        clock     0   1   2   3   4   5   6   7   8   9   10  11  12  13  14
        device 0 F0  F1  F0' F1' .   .   .   B0' B0' B1' B1' B0  B0  B1  B1
        device 1 .   F0  F1  F0' F1' B0' B0' B1' B1' B0  B0  B1  B1  .   .

    (unprimed: the device's first stage, primed: its second). Device d runs the forwards of
    its stages in order, each over every micro-batch, then their backwards in reverse stage
    order, each over every micro-batch. With m >= p no forward waits for the stage before it,
    so the forwards take v*m clocks after a fill of p-1, the backwards 2*v*m after a fill of
    2(p-1): bubble (p-1)/(v*m+p-1), interleaved's, and every device holds all v*m
    stage-micro-batches at the turn (GPipe's memory). Fewer messages in flight than
    interleaved, and no constraint on m.
    """
    p = looped_devices("looped_bfs", stages, virtual_stages)
    devices = []
    for d in range(p):
        mine = list(range(d, stages, p))
        order = [Instr(Op.F, j, i) for j in mine for i in range(microbatches)]
        order += [Instr(Op.B, j, i) for j in reversed(mine) for i in range(microbatches)]
        devices.append(tuple(order + [Instr(Op.STEP, j) for j in mine]))
    return Program("looped_bfs", microbatches, tuple(j % p for j in range(stages)), tuple(devices))


def _bubble(p: int, m: int, v: int) -> float | None:
    """Interleaved 1F1B's, where every device holds m >= p micro-batches at once."""
    return looped_bubble(p, m, v) if m >= p else None


SCHEDULE = Schedule(
    "looped_bfs",
    looped_bfs,
    synchronous=True,
    placement="looped",
    split_backward=False,
    replicable=False,
    bubble=_bubble,
    takes=("virtual_stages",),
)
