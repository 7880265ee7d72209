"""Fault injection, a documented testing aid: ``PIPECOMPILE_FAULT`` makes a chosen rank fail at a
chosen step and instruction, so the tests (and anyone checking a cluster's recovery) can see a
run survive it.

``PIPECOMPILE_FAULT`` holds one fault or several separated by commas, each
``RANK:STEP:WHERE:KIND``:

- ``RANK``: the global rank that fails;
- ``STEP``: the optimizer step (1 is the first step of a run that starts from scratch), or
  ``*`` for every step;
- ``WHERE``: an instruction as the program names it (``2B1``: device 2's backward of
  micro-batch 1) or ``save`` (this rank's part of the save after ``STEP``, once it is written
  and before ``latest`` moves);
- ``KIND``: ``kill`` (SIGKILL, as an out-of-memory killer would), ``raise`` (an exception),
  ``hang`` (stops making progress: the other ranks' ``--timeout`` ends the run) or ``disk`` (at
  ``save`` only: the write fails as on a full disk).

The older form ``RANK:INSTR:KIND`` means ``RANK:*:INSTR:KIND``.

`pipecompile generate --nproc N` reads it too: ``RANK:TURN:turn:KIND`` fails generation rank
RANK at the TURN-th message it receives (``generation.ranks``).

Every door checks the faults against the job before it starts (``runtime.job.fault_checks``,
``generation.job``): a fault that could never fire (a rank the run does not have, an
instruction its rank never runs, a step the run never reaches or never saves at) is refused,
naming why, so that a recovery test cannot pass by testing nothing.

A fault with a step fires once per ``pipecompile run`` command: the launcher gives the ranks a
directory (``PIPECOMPILE_FAULT_FIRED``) where a fired fault leaves a mark, so the run that
restarts after it (``--max-restarts``) goes past that step. Without that directory (ranks
started by ``torchrun``), and for ``*``, a fault fires every time its rank gets there.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from pipecompile.errors import PipecompileError

__all__ = [
    "Fault",
    "FAULT_ENV",
    "FIRED_ENV",
    "parse_faults",
    "read_faults",
    "fault_at",
    "fail_save",
    "happen",
]

FAULT_ENV = "PIPECOMPILE_FAULT"
FIRED_ENV = "PIPECOMPILE_FAULT_FIRED"
KINDS = ("kill", "raise", "hang", "disk")


@dataclass(frozen=True)
class Fault:
    """One injected failure: ``rank`` fails at ``step`` (None: every step) at ``where``."""

    index: int  # its place in PIPECOMPILE_FAULT, which names its mark
    rank: int
    step: int | None
    where: str
    kind: str

    def __str__(self) -> str:
        """As ``PIPECOMPILE_FAULT`` writes it: ``RANK:STEP:WHERE:KIND`` (STEP ``*``: every)."""
        return f"{self.rank}:{'*' if self.step is None else self.step}:{self.where}:{self.kind}"


def parse_faults(spec: str) -> list[Fault]:
    """The faults of a ``PIPECOMPILE_FAULT`` value; ValueError naming the part it cannot read."""
    faults = []
    for index, part in enumerate(p.strip() for p in spec.split(",") if p.strip()):
        fields = part.split(":")
        if len(fields) == 3:
            fields.insert(1, "*")
        if len(fields) != 4 or fields[3] not in KINDS:
            raise ValueError(
                f"{FAULT_ENV}: cannot read {part!r}: write RANK:STEP:WHERE:KIND with KIND one "
                f"of {', '.join(KINDS)} (e.g. 1:5:1B0:kill, 0:10:save:disk)"
            )
        rank, step, where, kind = fields
        if not rank.isdigit() or not (step == "*" or step.isdigit()):
            raise ValueError(f"{FAULT_ENV}: {part!r}: RANK and STEP are whole numbers (STEP: or *)")
        if kind == "disk" and where != "save":
            raise ValueError(f"{FAULT_ENV}: {part!r}: kind disk fails a save: WHERE is save")
        faults.append(Fault(index, int(rank), None if step == "*" else int(step), where, kind))
    return faults


def read_faults() -> tuple[Fault, ...]:
    """The faults ``PIPECOMPILE_FAULT`` sets for this job, refused where they cannot be read.

    Raises:
        PipecompileError: naming the part that cannot be read and how to write it.
    """
    try:
        return tuple(parse_faults(os.environ.get(FAULT_ENV, "")))
    except ValueError as err:
        raise PipecompileError(str(err)) from None


def fault_at(rank: int, step: int, where: str) -> Fault | None:
    """The fault ``PIPECOMPILE_FAULT`` sets for ``rank`` at ``step`` and ``where``, if any and
    not fired yet in this command (then it is marked fired)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    for fault in parse_faults(spec):
        if fault.rank != rank or fault.where != where or fault.step not in (None, step):
            continue
        if fault.step is not None and not _first_time(fault):
            continue
        return fault
    return None


def _first_time(fault: Fault) -> bool:
    """Whether ``fault`` has not fired before in this command (marking it fired)."""
    fired = os.environ.get(FIRED_ENV)
    if not fired:
        return True
    try:
        os.close(os.open(Path(fired, f"fault{fault.index}"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def fail_save(rank: int, step: int) -> None:
    """At a save: the fault set there for ``rank`` and ``step``, if any, happens."""
    fault = fault_at(rank, step, "save")
    if fault is not None:
        happen(fault, f"while saving step {step}")


def happen(fault: Fault, where: str) -> None:
    """``fault`` happens in this process: SIGKILL, a hang, a full disk, or an error raised
    (``injected failure WHERE``)."""
    if fault.kind == "disk":
        raise OSError(errno.ENOSPC, "No space left on device (injected by PIPECOMPILE_FAULT)")
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.kind == "hang":
        while True:
            time.sleep(1)
    raise RuntimeError(f"injected failure {where}")
