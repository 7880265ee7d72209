"""ZB-V: the V-shaped zero-bubble schedule. Two stages per device in a V (device d holds
stage d and stage 2p-1-d, so the first device also computes the loss), the backward split
into I and W, and 1F1B's peak memory."""

from __future__ import annotations

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.program import Program
from pipecompile.schedules.list_scheduler import list_schedule
from pipecompile.schedules.record import Schedule

__all__ = ["SCHEDULE", "v_bubble", "zbv", "v_placement", "v_stages", "shorter"]


def v_placement(stages: int) -> tuple[int, ...]:
    """Stage j on device j for the first half, on device stages-1-j for the second."""
    p = stages // 2
    return tuple(j if j < p else stages - 1 - j for j in range(stages))


def v_stages(stages: int, name: str) -> int:
    """``stages`` when a V can hold them (two per device), else a ProgramError naming
    schedule ``name``."""
    if stages % 2 or stages < 2:
        raise ProgramError(
            f"{name} places two stages on each device in a V; --stages {stages} must be even "
            f"(2 x the devices)"
        )
    return stages


def zbv(stages: int, microbatches: int) -> Program:
    """Compute-only ZB-V program: 2p stages on p devices in a V, played by the list scheduler
    (``list_scheduler``: backwards first, then forwards while a device holds fewer than 2p
    stage-micro-batches, then W's; and again with forwards before backwards, keeping the
    shorter of the two). For 4 stages on 2 devices and 3 micro-batches
    (F = I = W = 1 clock; unprimed: the device's first stage, primed: its second)::

        clock     0   1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17  18
        device 0 F0  F1  F2  F0' I0' W0' F1' I0  I1' W0  W1' I1  W1  F2' I2' W2' .   I2  W2
        device 1 .   F0  F0' F1  F1' I0' I0  W0' F2  I1' I1  W0  F2' W1' W1  I2' I2  W2' W2

    A stage here is half of a 1F1B stage, so with uniform costs every device works 6m clocks
    and only the fill of p-1 clocks is idle: bubble (p-1)/(6m+p-1) when m = p or m >= 2p
    (checked for every p up to 12 and m up to 6p), half of ZB-H1's; for p < m < 2p the rules
    leave up to p-4 more clocks idle when p >= 5. Every device holds at most 2p
    stage-micro-batches of half size, the activations of p micro-batches: the peak of 1F1B's
    first device.
    """
    p = v_stages(stages, "zbv") // 2
    placement, caps = v_placement(stages), [2 * p] * p
    plays = [
        list_schedule("zbv", placement, microbatches, caps, split=True, forward_first=first)
        for first in (False, True)
    ]
    return shorter(plays)


def shorter(plays: list[Program]) -> Program:
    """The first of the programs with the shortest step under uniform costs."""
    return min(plays, key=_makespan)


def _makespan(program: Program) -> float:
    """The program's step with uniform costs (the clocks its list scheduler counted)."""
    from pipecompile.ir.programs.simulate import Costs, simulate
    from pipecompile.ir.programs.topology import Topology

    stages = program.num_stages
    return simulate(program, Topology.chain(stages), Costs.uniform(stages)).makespan


def v_bubble(p: int, m: int, v: int) -> float | None:
    """A V's of stages of half a device's work each: (p - 1) / (6m + p - 1), for m >= p."""
    return (p - 1) / (6 * m + p - 1) if m >= p else None


SCHEDULE = Schedule(
    "zbv",
    zbv,
    synchronous=True,
    placement="v",
    split_backward=True,
    replicable=False,
    bubble=v_bubble,
)
