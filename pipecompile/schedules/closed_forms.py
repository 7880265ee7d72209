"""Each schedule's bubble fraction with uniform costs, as its paper (or its docstring) states
it: what ``show`` prints beside the simulated one, and the tests check against."""

from __future__ import annotations

from pipecompile.ir.program import Program
from pipecompile.schedules.v_half import v_half_idle
from pipecompile.schedules.v_min import v_min_idle

__all__ = ["uniform_bubble"]

ONE_STAGE_PER_DEVICE = ("gpipe", "1f1b", "pipedream", "pipedream-vsync", "pipedream_2bw")


def uniform_bubble(program: Program) -> float | None:
    """The closed-form bubble fraction of the program's schedule with uniform costs (F = I =
    W = 1, B = 2 per stage), or None where the schedule has none for its shape."""
    p, m, name = len(program.devices), program.microbatches, program.schedule
    v = program.num_stages // p
    if name in ONE_STAGE_PER_DEVICE:
        return (p - 1) / (m + p - 1)
    if name == "interleaved" or (name == "looped_bfs" and m >= p):
        return (p - 1) / (v * m + p - 1)
    if m < p:
        return None  # the zero-bubble forms below need m >= p
    if name in ("zbv", "dualpipev"):  # stages of half a device's work each
        return (p - 1) / (6 * m + p - 1)
    if name in ("v_half", "v_min"):
        idle = v_half_idle(p) if name == "v_half" else v_min_idle(p)
        return idle / (6 * m + idle)
    if name in ("zb1p", "zb2p"):
        return (p - 1) / (3 * m + p - 1)
    return None
