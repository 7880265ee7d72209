"""Interleaved 1F1B: each device holds v stages ("virtual stages") spaced p apart, so a
micro-batch visits every device v times and the bubble shrinks v-fold."""

from __future__ import annotations

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.schedules.record import Schedule

__all__ = ["SCHEDULE", "interleaved", "looped_bubble", "looped_devices"]


def interleaved(stages: int, microbatches: int, virtual_stages: int = 2) -> Program:
    """Compute-only interleaved program: stage j on device j mod p, p = stages / v. For 4
    stages on 2 devices (v = 2) and 2 micro-batches, F = 1 clock, B = 2 clocks::

        clock     0   1   2   3   4   5   6   7   8   9   10  11  12  13  14
        device 0 F0  F1  F0' F1' .   .   B0' B0' .   B1' B1' B0  B0  B1  B1
        device 1 .   F0  F1  F0' B0' B0' F1' B1' B1' B0  B0  B1  B1  .   .

    (unprimed: the device's first stage, primed: its second). Device d runs its m*v forwards
    in groups of p micro-batches per stage: warm-up ``2(p-d-1) + (v-1)p`` forwards, then one
    forward one backward, then the remaining backwards (backwards visit the stages in reverse).
    Bubble (p-1)/(v*m+p-1). Needs m to be a multiple of p.
    """
    v = virtual_stages
    p = looped_devices("interleaved", stages, v)
    if microbatches % p:
        raise ProgramError(
            f"interleaved: --microbatches {microbatches} is not a multiple of the {p} devices; "
            f"use --microbatches {p * max(1, round(microbatches / p))}"
        )
    devices = []
    for d in range(p):
        total = microbatches * v
        warmup = min(2 * (p - d - 1) + (v - 1) * p, total)
        forward = [_slot(k, d, p, v, backward=False) for k in range(total)]
        backward = [_slot(k, d, p, v, backward=True) for k in range(total)]
        order = forward[:warmup]
        for k in range(total - warmup):
            order += [forward[warmup + k], backward[k]]
        order += backward[total - warmup :]
        steps = [Instr(Op.STEP, j) for j in range(d, stages, p)]
        devices.append(tuple(order + steps))
    return Program("interleaved", microbatches, tuple(j % p for j in range(stages)), tuple(devices))


def looped_devices(name: str, stages: int, virtual_stages: int) -> int:
    """The p = stages / v devices of a looped schedule ``name`` (stage j on device j mod p).

    Raises:
        ProgramError: v is below 2, or does not divide the stages.
    """
    v = virtual_stages
    if v < 2:
        raise ProgramError(f"{name} needs --virtual-stages of at least 2, got {v}")
    if stages % v:
        raise ProgramError(
            f"{name}: --stages {stages} is not a multiple of --virtual-stages {v}; "
            f"each of the p = stages / v devices holds v stages"
        )
    return stages // v


def _slot(k: int, d: int, p: int, v: int, *, backward: bool) -> Instr:
    """The k-th forward (or backward) of device d: micro-batches go p at a time per stage."""
    group, r = divmod(k, p * v)
    chunk = r // p
    if backward:
        chunk = v - 1 - chunk
    return Instr(Op.B if backward else "F", chunk * p + d, group * p + r % p)


def looped_bubble(p: int, m: int, v: int) -> float | None:
    """Interleaved 1F1B's: (p - 1) / (vm + p - 1), v stages a device."""
    return (p - 1) / (v * m + p - 1)


SCHEDULE = Schedule(
    "interleaved",
    interleaved,
    synchronous=True,
    placement="looped",
    split_backward=False,
    replicable=False,
    bubble=looped_bubble,
    takes=("virtual_stages",),
)
