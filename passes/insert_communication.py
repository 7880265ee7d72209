"""Pass: insert_communication — add send/recv and tied-gradient instructions to a program.

Requires: a compute-only program (F, B, STEP) and the stage graph it runs.
Guarantees: a new program where each forward is preceded by a receive of its cross-device
inputs and followed by a send of its cross-device outputs, each backward is preceded by a
receive of its output gradients and followed by a send of its input gradients, and each
STEP of a stage holding a tied parameter is preceded by ALLREDUCE_TIED. Stages sharing a
device exchange values directly and get no send/recv.
"""

from __future__ import annotations

from dataclasses import replace

from pipecompile.instr import Instr
from pipecompile.program import Program
from pipecompile.stage_graph import StageGraph
from pipecompile.ties import tied_groups

__all__ = ["insert_communication"]


def insert_communication(program: Program, *, graph: StageGraph) -> Program:
    """Return ``program`` with communication instructions added (see the module docstring)."""
    device = program.stage_device
    remote = {(e.src, e.dst) for e in graph.edges if device[e.src] != device[e.dst]}
    receives = {dst for _, dst in remote}
    sends = {src for src, _ in remote}
    tied = {j for group in tied_groups([s.params for s in graph.stages]) for j in group}
    devices = []
    for instrs in program.devices:
        out: list[Instr] = []
        for instr in instrs:
            j, i = instr.stage, instr.microbatch
            if instr.op == "F":
                out += [Instr("RECV_F", j, i)] * (j in receives) + [instr]
                out += [Instr("SEND_F", j, i)] * (j in sends)
            elif instr.op == "B":
                out += [Instr("RECV_B", j, i)] * (j in sends) + [instr]
                out += [Instr("SEND_B", j, i)] * (j in receives)
            elif instr.op == "STEP":
                out += [Instr("ALLREDUCE_TIED", j)] * (j in tied) + [instr]
            else:
                out.append(instr)
        devices.append(tuple(out))
    return replace(program, devices=tuple(devices))
