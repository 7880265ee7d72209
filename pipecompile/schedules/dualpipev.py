"""DualPipeV: DeepSeek's DualPipe cut in half. Two stages per device in a V (as ``zbv``), and
in the steady state each device runs the forward of one micro-batch paired with the
backward of another: ``F`` of one stage then ``B`` of the other, adjacent, their inputs
received ahead. Where DualPipe overlaps the pair's compute with its communication, a
synchronous step gains from the pairing that every device alternates between its two
stages with no idle clock between them."""

from __future__ import annotations

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.schedules.list_scheduler import stepped
from pipecompile.schedules.record import Schedule
from pipecompile.schedules.zbv import v_bubble, v_placement, v_stages

__all__ = ["SCHEDULE", "dualpipev"]


def dualpipev(stages: int, microbatches: int) -> Program:
    """Compute-only DualPipeV program on p = stages/2 devices, m >= 2p micro-batches.
    Device d (first stage d, second stage 2p-1-d; ``W`` runs the oldest waiting weight half):

    1. 2(p-d-1) forwards of its first stage;
    2. d+1 times: forward of the first stage, forward of the second;
    3. p-d-1 times: I of the second stage, a W, forward of the second;
    4. m-2p+d+1 times: the pair (F first stage, B second), the pair (F second, B first);
    5. p-d-1 times: B of the second stage, the pair (F second, B first);
    6. d+1 times: backward of the second stage, then of the first; from the middle on the
       backward is split (I now, W later): at the second stage first when d is odd, at the
       first when d is even;
    7. p-d-1 times: a W, then I of the first stage;
    8. d+1 W's.

    For 4 stages on 2 devices and 4 micro-batches (F = I = W = 1 clock, B = 2; unprimed: the
    device's first stage, primed: its second)::

        clock     0   1   2   3   4   5   6   7   8   9   10  11  12
        device 0 F0  F1  F2  F0' I0' W0' F1' F3  B1' B1' F2' B0  B0
        device 1 .   F0  F0' F1  F1' F2  B0' B0' F2' B0  B0  F3  B1'

        clock     13  14  15  16  17  18  19  20  21  22  23  24
        device 0 B2' B2' F3' .   B1  B1  B3' B3' I2  W2  I3  W3
        device 1 B1' F3' B1  B1  B2' B2' B2  B2  I3' I3  W3' W3

    With uniform costs every device works 6m clocks and idles only the fill, p-1 clocks:
    bubble (p-1)/(6m+p-1) for every m >= 2p, as ``zbv``; each device holds at most 2p+1
    stage-micro-batches of half size, the DualPipe paper's PP+1 for PP = 2p stages.
    """
    p, m = v_stages(stages, "dualpipev") // 2, microbatches
    if m < 2 * p:
        raise ProgramError(
            f"dualpipev needs at least 2 x devices = {2 * p} micro-batches, one per stage of its "
            f"V; got --microbatches {m}: raise --microbatches or use zbv"
        )
    return stepped("dualpipev", m, v_placement(stages), [_device(d, p, m) for d in range(p)])


def _device(d: int, p: int, m: int) -> list[Instr]:
    """Device d's compute instructions, phase by phase (the docstring's list)."""
    first, second = d, 2 * p - 1 - d
    nxt = {(kind, j): 0 for kind in "FB" for j in (first, second)}  # next micro-batch
    waiting: list[tuple[int, int]] = []  # (stage, micro-batch) whose W is due, oldest first
    out: list[Instr] = []

    def forward(j: int) -> None:
        out.append(Instr(Op.F, j, nxt[("F", j)]))
        nxt[("F", j)] += 1

    def backward(j: int, split: bool = False) -> None:
        i = nxt[("B", j)]
        nxt[("B", j)] += 1
        out.append(Instr(Op.I if split else Op.B, j, i))
        if split:
            waiting.append((j, i))

    def weight() -> None:
        if waiting:
            out.append(Instr(Op.W, *waiting.pop(0)))

    for _ in range(2 * (p - d - 1)):
        forward(first)
    for _ in range(d + 1):
        forward(first)
        forward(second)
    for _ in range(p - d - 1):
        backward(second, split=True)
        weight()
        forward(second)
    for _ in range(m - 2 * p + d + 1):
        forward(first)
        backward(second)
        forward(second)
        backward(first)
    for _ in range(p - d - 1):
        backward(second)
        forward(second)
        backward(first)
    split = False
    for k in range(d + 1):
        split = split or (k == (d + 1) // 2 and d % 2 == 1)
        backward(second, split)
        split = split or (k == (d + 1) // 2 and d % 2 == 0)
        backward(first, split)
    for _ in range(p - d - 1):
        weight()
        backward(first, split=True)
    for _ in range(d + 1):
        weight()
    return out


SCHEDULE = Schedule(
    "dualpipev",
    dualpipev,
    synchronous=True,
    placement="v",
    split_backward=True,
    replicable=False,
    bubble=v_bubble,
)
