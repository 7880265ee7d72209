"""V-Min: the V-shaped schedule with a third of 1F1B's activation memory (Qi et al.,
"Pipeline Parallelism with Controllable Memory", 2024)."""

from __future__ import annotations

from pipecompile.ir.programs.program import Program
from pipecompile.schedules.building_block import idle_bubble, play_blocks
from pipecompile.schedules.record import Schedule
from pipecompile.schedules.zbv import v_stages

__all__ = ["SCHEDULE", "v_min", "v_min_block", "v_min_idle"]


def v_min_block(p: int) -> list[tuple[int, int, int, int]]:
    """Device d's clocks of (F of its first stage, F of its second, I of its second, I of its
    first) in micro-batch 0's block: every instruction one clock after the one it consumes,
    the turn at the loss 2 clocks later when p is a multiple of 3 (else two of a device's
    instructions would fall on one clock modulo 6)."""
    gap = 2 if p % 3 == 0 else 0
    return [(d, 2 * p - 1 - d, 2 * p + gap + d, 4 * p + gap - 1 - d) for d in range(p)]


def v_min_idle(p: int) -> int:
    """Clocks each device idles in a step of ``v_min`` on p devices with uniform costs and
    m >= p micro-batches (its docstring)."""
    return {1: 0, 2: 3, 3: 6}.get(p, 4 * p - 5)


def v_min(stages: int, microbatches: int) -> Program:
    """Compute-only V-Min program: 2p stages on p devices in a V (as ``zbv``), the backward
    split into I and W, built from ``v_min_block`` repeated every 6 clocks and squeezed
    (``building_block``). For 4 stages on 2 devices and 3 micro-batches (F = I = W = 1 clock;
    unprimed: the device's first stage, primed: its second)::

        clock     0   1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17  18  19  20
        device 0 F0  .   .   F0' I0' W0' F1  I0  W0  F1' I1' W1' F2  I1  W1  F2' I2' W2' .   I2  W2
        device 1 .   F0  F0' .   .   I0' I0  F1  F1' W0' W0  I1' I1  F2  F2' W1' W1  I2' I2  W2' W2

    Each device holds at most 2 * ((p+4)//3) stage-micro-batches of half size, the
    activations of (p+4)//3 micro-batches, about a third of 1F1B's p. With uniform costs each
    device works 6m clocks and idles 4p-5 (p >= 4; 3 at p = 2, 6 at p = 3), for every m >= p:
    bubble (4p-5)/(6m+4p-5), the paper's "about 2p/3m of the work".
    """
    p = v_stages(stages, "v_min") // 2
    return play_blocks("v_min", stages, microbatches, v_min_block(p))


SCHEDULE = Schedule(
    "v_min",
    v_min,
    synchronous=True,
    placement="v",
    split_backward=True,
    replicable=False,
    bubble=idle_bubble(v_min_idle),
)
