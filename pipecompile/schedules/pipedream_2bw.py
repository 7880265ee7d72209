"""PipeDream-2BW: 1F1B without a flush between windows of p micro-batches; each window's
gradients are accumulated and applied once, and every micro-batch of window k runs on the
weights of window k-1's start on every stage (two buffered versions)."""

from __future__ import annotations

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.schedules.one_f_one_b import order_1f1b
from pipecompile.schedules.record import Schedule, fill_drain

__all__ = ["SCHEDULE", "pipedream_2bw"]


def pipedream_2bw(stages: int, microbatches: int) -> Program:
    """Compute-only PipeDream-2BW program, stage j on device j, windows of w = p
    micro-batches. For 2 stages and 6 micro-batches (three windows; S = STASH, U = UPDATE)::

        device 0  S0 S1 S2 S3 F0 F1 B0 F2 B1 U1 S4 S5 F3 B2 F4 B3 U3 F5 B4 B5 U5
        device 1  S0 S1 S2 S3 F0 B0 F1 B1 U1 S4 S5 F2 B2 F3 B3 U3 F4 B4 F5 B5 U5

    The order is 1F1B's. ``jUPDATE i`` follows the backward of each window's last micro-batch
    and applies the window's summed gradient (each micro-batch's loss scaled by 1/w: the
    window's mean); the step has m/w updates. The micro-batches of window k are stashed
    right after the UPDATE of window k-2 (windows 0 and 1 at the start), so they run on
    V(k-1), the weights before window k-1's update, on every stage:

        V(k+1) = V(k) - lr * mean gradient of window k at V(k-1)      (V(-1) = V(0))

    the update rule of PipeDream-2BW (gradients one version stale). With w >= p the forward
    of window k's first micro-batch comes after window k-2's update on every stage, so each
    stage keeps two stashed versions (V(k-2) for the last of window k-1 in flight, V(k-1)),
    and a micro-batch sees one consistent model: stages tied by a parameter stay equal.
    Bubble and in-flight micro-batches are 1F1B's.
    """
    if microbatches % stages:
        raise ProgramError(
            f"pipedream_2bw accumulates gradients over windows of {stages} micro-batches "
            f"(the stages); --microbatches {microbatches} must be a multiple of {stages}"
        )
    w = stages
    windows = microbatches // w
    devices = []
    for j in range(stages):
        instrs = [Instr(Op.STASH, j, i) for i in range(min(2, windows) * w)]
        for op, i in order_1f1b(j, stages, microbatches):
            instrs.append(Instr(op, j, i))
            if op == Op.B and (i + 1) % w == 0:
                k = i // w  # window k's update; window k + 2 runs on what it leaves
                instrs.append(Instr(Op.UPDATE, j, i))
                if k + 2 < windows:
                    instrs += [Instr(Op.STASH, j, x) for x in range((k + 2) * w, (k + 3) * w)]
        devices.append(tuple(instrs))
    return Program("pipedream_2bw", microbatches, tuple(range(stages)), tuple(devices))


SCHEDULE = Schedule(
    "pipedream_2bw",
    pipedream_2bw,
    synchronous=False,
    placement="one",
    split_backward=False,
    replicable=False,
    bubble=fill_drain,
    weight_versions="window",
)
