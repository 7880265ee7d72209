"""The interpreter: devices taking turns over their instructions (``ir.turns``, the loop the
simulator shares) and a dispatch table of handlers.

Devices take turns; each runs until an instruction is not ready (a receive whose message has
not arrived). A handler returns True when it ran and False when it must wait. If no device can
move, the program is stuck, which the verifier should have rejected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pipecompile.errors import PipecompileError, RuntimeFailure
from pipecompile.ir.programs.instr import Instr
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.turns import take_turns

__all__ = ["Handler", "run_program"]

Handler = Callable[[Instr], bool]


def run_program(program: Program, handlers: Mapping[str, Handler]) -> None:
    """Execute every device's instructions in order with ``handlers[instr.op]``.

    Raises:
        RuntimeFailure: a handler raised (the message names the device and instruction), or
            no device can proceed.
    """
    stuck = take_turns(program, lambda d, instr: _dispatch(handlers, instr, d))
    if stuck is not None:
        waiting = ", ".join(
            f"device {d} at [{pc}] {instrs[pc]}"
            for d, (pc, instrs) in enumerate(zip(stuck, program.devices))
            if pc < len(instrs)
        )
        raise RuntimeFailure(f"no device can proceed: {waiting}")


def _dispatch(handlers: Mapping[str, Handler], instr: Instr, device: int) -> bool:
    # The instruction names its stage and micro-batch; its place in the device's list is
    # left out, as a "step" there would read as the training loop's (1-based) step.
    try:
        return handlers[instr.op](instr)
    except PipecompileError as err:
        raise type(err)(f"device {device}, instruction {instr}: {err}") from err
    except Exception as err:
        raise RuntimeFailure(
            f"device {device}, instruction {instr}: {type(err).__name__}: {err}"
        ) from err
