"""Pass: insert_communication — add send/recv and tied-gradient instructions to a program.

Requires: a compute-only program and the topology of the stages it runs.
Guarantees: a new program where each forward is preceded by a receive of its cross-device
inputs and followed by a send of its cross-device outputs, each backward (or its input half,
I) is preceded by a receive of its output gradients and followed by a send of its input
gradients, and each stage holding a tied parameter has an ALLREDUCE_TIED before the first STEP
of its device (all of a device's come together, so stages tied on one device never wait for
each other), or, in an asynchronous program, one before each of its UPDATEs (the window's
sum, ``jALLREDUCE_TIEDi``; the verifier accepts that only for PipeDream-2BW).
Stages sharing a device exchange values directly and get no send/recv.
"""

from __future__ import annotations

from dataclasses import replace

from pipecompile.ir.programs.instr import FORWARD_OPS, INPUT_GRADIENT_OPS, Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.topology import Topology

__all__ = ["insert_communication"]


def insert_communication(program: Program, *, topology: Topology) -> Program:
    """Return ``program`` with communication instructions added (see the module docstring)."""
    device = program.stage_device
    remote = {(s, t) for s, t in topology.edges if device[s] != device[t]}
    receives = {t for _, t in remote}
    sends = {s for s, _ in remote}
    tied = {j for group in topology.tie_groups for j in group}
    devices = []
    for instrs in program.devices:
        out: list[Instr] = []
        for instr in instrs:
            j, i = instr.stage, instr.microbatch
            if instr.op in FORWARD_OPS:
                out += [Instr(Op.RECV_F, j, i)] * (j in receives) + [instr]
                out += [Instr(Op.SEND_F, j, i)] * (j in sends)
            elif instr.op in INPUT_GRADIENT_OPS:
                out += [Instr(Op.RECV_B, j, i)] * (j in sends) + [instr]
                out += [Instr(Op.SEND_B, j, i)] * (j in receives)
            elif instr.op == Op.UPDATE and j in tied:  # PipeDream-2BW: each window's sum
                out += [Instr(Op.ALLREDUCE_TIED, j, i), instr]
            elif instr.op == Op.STEP and not any(x.op == Op.STEP for x in out):
                on_device = sorted({x.stage for x in instrs if x.op == Op.STEP} & tied)
                out += [Instr(Op.ALLREDUCE_TIED, s) for s in on_device] + [instr]
            else:
                out.append(instr)
        devices.append(tuple(out))
    return replace(program, devices=tuple(devices))
