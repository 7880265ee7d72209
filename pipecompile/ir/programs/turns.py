"""Devices taking turns over a program, the loop the simulator and the interpreter share: each
device runs its instructions in order until one cannot run yet (a receive whose message has
not arrived, a dependency not done), then the next device has its turn; when a whole round
moves no device, the program is stuck."""

from __future__ import annotations

from collections.abc import Callable

from pipecompile.ir.programs.instr import Instr
from pipecompile.ir.programs.program import Program

__all__ = ["take_turns"]


def take_turns(program: Program, run: Callable[[int, Instr], bool]) -> tuple[int, ...] | None:
    """Run every device's instructions in order, ``run(device, instr)`` saying whether it ran
    (False: not yet). Returns None once every instruction ran, else each device's position
    when a round moved none (a deadlock: the caller says where)."""
    pcs = [0] * len(program.devices)
    pending = sum(len(instrs) for instrs in program.devices)
    while pending:
        moved = False
        for d, instrs in enumerate(program.devices):
            while pcs[d] < len(instrs) and run(d, instrs[pcs[d]]):
                pcs[d] += 1
                pending -= 1
                moved = True
        if not moved:
            return tuple(pcs)
    return None
