"""PipeDream: asynchronous 1F1B. Every stage updates its weights after each micro-batch's
backward; weight stashing makes that backward use exactly the weights its forward used."""

from __future__ import annotations

from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.schedules.one_f_one_b import order_1f1b
from pipecompile.schedules.record import Schedule, fill_drain

__all__ = ["SCHEDULE", "pipedream"]


def pipedream(stages: int, microbatches: int, vertical_sync: bool = False) -> Program:
    """Compute-only PipeDream program, stage j on device j. For 3 stages and 4 micro-batches
    (F = 1 clock, B = 2 clocks; S = STASH, U = UPDATE, both free)::

        clock     0   1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17
        device 0 F0  F1  F2  .   .   .   .   B0  B0  F3  B1  B1  .   B2  B2  .   B3  B3
        device 1 .   F0  F1  .   .   B0  B0  F2  B1  B1  F3  B2  B2  .   B3  B3  .   .
        device 2 .   .   F0  B0  B0  F1  B1  B1  F2  B2  B2  F3  B3  B3  .   .   .   .

    The order is 1F1B's; each ``jF i`` is preceded by ``jSTASH i`` (keep the current weights
    as micro-batch i's version) and each ``jB i`` followed by ``jUPDATE i`` (apply micro-batch
    i's gradient). Stage j's forward of micro-batch i thus sees the updates of micro-batches
    0 .. i-p+j: the later the stage, the fresher its weights.

    Each STASH copies the weights once per version (micro-batches stashed between two
    UPDATEs share the copy), so stage j keeps at most min(p-j, m) copies, one per micro-batch
    in flight. With ``vertical_sync`` every stage uses the version stage 0 used (updates
    0 .. i-p), so a micro-batch sees one consistent model: ``jSTASH i`` moves up to just after
    ``jUPDATE (i-p)``, and every stage keeps up to min(p, m) copies.
    """
    devices = []
    for j in range(stages):
        instrs: list[Instr] = []
        if vertical_sync:
            instrs += [Instr(Op.STASH, j, i) for i in range(min(stages, microbatches))]
        for op, i in order_1f1b(j, stages, microbatches):
            if op == Op.F:
                instrs += (
                    [Instr(Op.F, j, i)]
                    if vertical_sync
                    else [Instr(Op.STASH, j, i), Instr(Op.F, j, i)]
                )
            else:
                instrs += [Instr(Op.B, j, i), Instr(Op.UPDATE, j, i)]
                if vertical_sync and i + stages < microbatches:
                    instrs.append(Instr(Op.STASH, j, i + stages))
        devices.append(tuple(instrs))
    name = "pipedream-vsync" if vertical_sync else "pipedream"
    return Program(name, microbatches, tuple(range(stages)), tuple(devices))


SCHEDULE = Schedule(
    "pipedream",
    pipedream,
    synchronous=False,
    placement="one",
    split_backward=False,
    replicable=False,
    bubble=fill_drain,
    takes=("vertical_sync",),
    aliases=("pipedream-vsync",),
    weight_versions="stage",
)
