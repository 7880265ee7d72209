"""V-Half: the V-shaped schedule with half of 1F1B's activation memory (Qi et al.,
"Pipeline Parallelism with Controllable Memory", 2024)."""

from __future__ import annotations

from pipecompile.ir.programs.program import Program
from pipecompile.schedules.building_block import idle_bubble, play_blocks
from pipecompile.schedules.record import Schedule
from pipecompile.schedules.zbv import v_stages

__all__ = ["SCHEDULE", "v_half", "v_half_block", "v_half_idle"]


def v_half_block(p: int) -> list[tuple[int, int, int, int]]:
    """Device d's clocks of (F of its first stage, F of its second, I of its second, I of its
    first) in micro-batch 0's block: the forward going down leaves a clock free on every
    device for the W's, and the turn at the loss waits 3 clocks when p is even (else two of
    a device's instructions would fall on one clock modulo 6)."""
    gap = 3 if p % 2 == 0 else 0
    return [(2 * d, 3 * p - 2 - d, 3 * p - 1 + gap + 2 * d, 6 * p - 2 + gap - d) for d in range(p)]


def v_half_idle(p: int) -> int:
    """Clocks each device idles in a step of ``v_half`` on p devices with uniform costs and
    m >= p micro-batches (its docstring)."""
    if p == 2:
        return 2
    return 7 * p // 2 - 5 if p % 2 == 0 else 7 * (p - 1) // 2


def v_half(stages: int, microbatches: int) -> Program:
    """Compute-only V-Half program: 2p stages on p devices in a V (as ``zbv``), the backward
    split into I and W, built from ``v_half_block`` repeated every 6 clocks and squeezed
    (``building_block``). For 4 stages on 2 devices and 3 micro-batches (F = I = W = 1 clock;
    unprimed: the device's first stage, primed: its second)::

        clock     0   1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17  18  19
        device 0 F0  F1  F2  F0' I0' W0' F1' I1' I0  W0  W1' F2' I2' W2' I1  W1  .   .   I2  W2
        device 1 .   F0  F0' F1  F1' I0' W0' I0  W0  F2  F2' I1' W1' I1  W1  I2' W2' I2  W2  .

    Each device holds at most 2 * ((p+2)//2) stage-micro-batches of half size, the
    activations of (p+2)//2 micro-batches, about half of 1F1B's p. With uniform costs each
    device works 6m clocks and idles 7p/2 - 5 for even p (2 at p = 2) and 7(p-1)/2 for odd p,
    for every m >= p: the paper's "about p/2m of the work".
    """
    p = v_stages(stages, "v_half") // 2
    return play_blocks("v_half", stages, microbatches, v_half_block(p))


SCHEDULE = Schedule(
    "v_half",
    v_half,
    synchronous=True,
    placement="v",
    split_backward=True,
    replicable=False,
    bubble=idle_bubble(v_half_idle),
)
