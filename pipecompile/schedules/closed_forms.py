"""Each schedule's bubble fraction with uniform costs, as its paper (or its docstring) states
it: what ``show`` prints beside the simulated one, and the tests check against. The forms
live in the schedules' records (``Schedule.bubble``)."""

from __future__ import annotations

from pipecompile.ir.programs.program import Program
from pipecompile.schedules import schedule_of

__all__ = ["uniform_bubble"]


def uniform_bubble(program: Program) -> float | None:
    """The closed-form bubble fraction of the program's schedule with uniform costs (F = I =
    W = 1, B = 2 per stage), or None where the schedule has none for its shape."""
    p, m = len(program.devices), program.microbatches
    return schedule_of(program.schedule).bubble(p, m, program.num_stages // p)
