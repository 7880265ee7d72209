"""The program verifier rejects wrong counts, bad placement, unmatched messages and deadlocks."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pipecompile.passes import insert_communication

from pipecompile.errors import ProgramError
from pipecompile.instr import Instr
from pipecompile.program import Program
from pipecompile.schedules import generate
from pipecompile.verify_program import Topology, verify_program

CHAIN = Topology(3, frozenset({(0, 1), (1, 2)}), ())


def _with_communication(stages: int = 3, microbatches: int = 2) -> Program:
    program = generate("gpipe", stages, microbatches)
    devices = []
    for j, instrs in enumerate(program.devices):
        out = []
        for x in instrs:
            if x.op == "F":
                out += [Instr("RECV_F", j, x.microbatch)] * (j > 0) + [x]
                out += [Instr("SEND_F", j, x.microbatch)] * (j < stages - 1)
            elif x.op == "B":
                out += [Instr("RECV_B", j, x.microbatch)] * (j < stages - 1) + [x]
                out += [Instr("SEND_B", j, x.microbatch)] * (j > 0)
            else:
                out.append(x)
        devices.append(tuple(out))
    return replace(program, devices=tuple(devices))


def _edit(program: Program, device: int, instrs: list[Instr]) -> Program:
    devices = list(program.devices)
    devices[device] = tuple(instrs)
    return replace(program, devices=tuple(devices))


def test_good_program_passes():
    verify_program(_with_communication(), CHAIN)


def test_missing_recv_is_an_unmatched_send():
    program = _with_communication()
    instrs = [x for x in program.devices[1] if x != Instr("RECV_F", 1, 0)]
    with pytest.raises(ProgramError, match=r"1RECV_F0 appears 0 times, expected 1"):
        verify_program(_edit(program, 1, instrs), CHAIN)


def test_backward_before_forward_deadlocks_and_shows_context():
    program = _with_communication()
    instrs = list(program.devices[2])
    b = instrs.index(Instr("B", 2, 1))
    instrs.insert(0, instrs.pop(b))
    with pytest.raises(ProgramError, match=r"deadlocks(.|\n)*>> \[0\] 2B1"):
        verify_program(_edit(program, 2, instrs), CHAIN)


def test_forward_before_its_receive_deadlocks():
    program = _with_communication(microbatches=2)
    instrs = list(program.devices[1])
    a, b = instrs.index(Instr("RECV_F", 1, 0)), instrs.index(Instr("RECV_F", 1, 1))
    instrs[a], instrs[b] = instrs[b], instrs[a]  # 1F0 now runs before 1RECV_F0
    with pytest.raises(ProgramError, match=r"deadlocks(.|\n)*>> \[1\] 1F0"):
        verify_program(_edit(program, 1, instrs), CHAIN)


def test_instruction_on_the_wrong_device():
    program = _with_communication()
    instrs = list(program.devices[0]) + [Instr("STEP", 1)]
    with pytest.raises(ProgramError, match="2 times|placed on device 1"):
        verify_program(_edit(program, 0, instrs), CHAIN)


def test_tied_stages_need_allreduce(compiled_gpt_graph):
    program = insert_communication(generate("gpipe", 4, 2), graph=compiled_gpt_graph)
    from pipecompile.compiler import topology

    topo = topology(compiled_gpt_graph)
    verify_program(program, topo)
    instrs = [x for x in program.devices[3] if x.op != "ALLREDUCE_TIED"]
    with pytest.raises(ProgramError, match="3ALLREDUCE_TIED appears 0 times"):
        verify_program(_edit(program, 3, instrs), topo)


@pytest.fixture(scope="module")
def compiled_gpt_graph():
    from pipecompile.compiler import compile_model
    from tests.conftest import example_spec

    spec = example_spec("gpt")
    return compile_model(spec.model, spec.inputs, stages=4, microbatches=2).graph
