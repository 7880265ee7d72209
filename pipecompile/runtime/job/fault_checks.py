"""``PIPECOMPILE_FAULT`` checked against the run it is set for, before anything starts: a fault
that could never fire (a rank the run does not have, an instruction its rank never runs, a
step the run never reaches or never saves at) is refused naming why, so a recovery test
cannot pass by testing nothing (``runtime.faults`` says how faults are written)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipecompile.errors import PipecompileError
from pipecompile.ir.programs.program import Program
from pipecompile.runtime.job.placement import Placement
from pipecompile.runtime.process.faults import FAULT_ENV, Fault

__all__ = ["RunShape", "check_faults"]


@dataclass(frozen=True)
class RunShape:
    """What decides where a run's faults can fire: its program and ranks (``ranks`` None: one
    process, where no instruction fault fires), its saves and its steps."""

    program: Program
    placement: Placement
    ranks: int | None
    saves: bool
    save_every: int
    steps: int | None  # the last step, where the options fix it (not with --epochs)
    resumed: int | None  # the step a resumed run continues after


def check_faults(faults: Sequence[Fault], shape: RunShape) -> None:
    """Refuse a fault ``shape``'s run could never fire.

    Raises:
        PipecompileError: naming the fault, why it cannot fire, and what would.
    """
    for fault in faults:
        why = _never(fault, shape)
        if why is not None:
            raise PipecompileError(f"{FAULT_ENV} {fault} could never fire: {why}")


def _never(fault: Fault, shape: RunShape) -> str | None:
    if fault.where == "turn":
        return "turn faults fail a rank of `pipecompile generate --nproc N`, not of a run"
    ranks = shape.ranks or 1
    if fault.rank >= ranks:
        have = f"ranks 0 to {ranks - 1}" if ranks > 1 else "one process (rank 0)"
        return f"this run has {have}"
    if fault.step is not None:
        late = _outside_steps(fault.step, shape)
        if late is not None:
            return late
    if fault.where == "save":
        return _no_save(fault.step, shape)
    if shape.ranks is None:
        return (
            f"faults at instructions fire on the ranks of --nproc N, and this run is one "
            f"process; add --nproc, or set {replace(fault, where='save')} "
            "for a save"
        )
    return _no_instruction(fault, shape)


def _outside_steps(step: int, shape: RunShape) -> str | None:
    if shape.resumed is not None and step <= shape.resumed:
        return (
            f"the run resumes after step {shape.resumed}, so its first step is {shape.resumed + 1}"
        )
    if shape.steps is not None and step > shape.steps:
        return f"the run ends at step {shape.steps} (--steps {shape.steps})"
    return None


def _no_save(step: int | None, shape: RunShape) -> str | None:
    if not shape.saves:
        return "this run saves nothing; add --save DIR (and --save-every N)"
    if step is None:
        return None
    at_end = shape.steps is None or step == shape.steps
    if (shape.save_every and step % shape.save_every == 0) or at_end:
        return None
    every = f"every {shape.save_every} steps" if shape.save_every else "only after its last step"
    return f"the run saves {every} (--save-every), never after step {step}"


def _no_instruction(fault: Fault, shape: RunShape) -> str | None:
    width = shape.placement.world
    device, _ = shape.placement.copy(fault.rank // width).role(fault.rank)
    mine = [str(instr) for instr in shape.program.devices[device]]
    if fault.where in mine:
        return None
    shown = " ".join(mine[:8]) + (" ..." if len(mine) > 8 else "")
    return (
        f"rank {fault.rank} runs device {device}, whose program has no instruction "
        f"{fault.where} (it runs {shown}; program.txt lists every device's)"
    )
