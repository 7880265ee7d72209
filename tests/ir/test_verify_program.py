"""The program verifier rejects wrong counts, bad placement, unmatched messages and deadlocks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import Instr
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.topology import Topology
from pipecompile.ir.programs.verify_program import verify_program
from pipecompile.passes import insert_communication
from pipecompile.schedules import compute_program

CHAIN = Topology.chain(3)


def _with_communication(
    stages: int = 3, microbatches: int = 2, schedule: str = "gpipe", **options: object
) -> Program:
    program = compute_program(schedule, stages, microbatches, **options)  # type: ignore[arg-type]
    return insert_communication(program, topology=Topology.chain(stages))


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


def test_backward_before_its_forward_is_named_with_context():
    program = _with_communication()
    instrs = list(program.devices[2])
    b = instrs.index(Instr("B", 2, 1))
    instrs.insert(0, instrs.pop(b))
    with pytest.raises(
        ProgramError, match=r"backward 2B1 comes before the forward(.|\n)*>> \[0\] 2B1"
    ):
        verify_program(_edit(program, 2, instrs), CHAIN)


def test_cross_device_wait_cycle_is_a_deadlock():
    program = _with_communication()
    instrs = list(program.devices[1])
    k = instrs.index(Instr("RECV_B", 1, 1))
    instrs.insert(0, instrs.pop(k))  # device 1 waits for a gradient before any forward
    with pytest.raises(ProgramError, match=r"deadlocks(.|\n)*>> \[0\] 1RECV_B1"):
        verify_program(_edit(program, 1, instrs), CHAIN)


@pytest.mark.parametrize(
    "schedule, options",
    [("gpipe", {}), ("1f1b", {}), ("zb1p", {}), ("pipedream", {}),
     ("pipedream", {"vertical_sync": True})],
)  # fmt: skip
def test_every_generated_schedule_verifies(schedule, options):
    verify_program(_with_communication(3, 5, schedule, **options), CHAIN)


def test_interleaved_verifies_on_its_placement():
    program = insert_communication(
        compute_program("interleaved", 6, 6, virtual_stages=2), topology=Topology.chain(6)
    )
    verify_program(program, Topology.chain(6))


def test_update_without_stash_between_forward_and_backward_is_rejected():
    program = _with_communication(3, 4, "pipedream")
    instrs = [x for x in program.devices[0] if x != Instr("STASH", 0, 3)]
    with pytest.raises(
        ProgramError, match=r"0UPDATE1 changes stage 0's weights between 0F3(.|\n)*add 0STASH3"
    ):
        verify_program(_edit(program, 0, instrs), CHAIN)


def test_step_and_update_cannot_mix():
    program = _with_communication(3, 2, "pipedream")
    instrs = list(program.devices[2]) + [Instr("STEP", 2)]
    with pytest.raises(ProgramError, match="2STEP appears 1 times, expected 0"):
        verify_program(_edit(program, 2, instrs), CHAIN)


def test_weight_half_before_input_half_is_caught():
    program = _with_communication(3, 2, "zb1p")
    instrs = list(program.devices[2])
    a, b = instrs.index(Instr("I", 2, 0)), instrs.index(Instr("W", 2, 0))
    instrs[a], instrs[b] = instrs[b], instrs[a]
    with pytest.raises(ProgramError, match=r"deadlocks(.|\n)*>> \[\d+\] 2W0"):
        verify_program(_edit(program, 2, instrs), CHAIN)


def test_missing_weight_half_is_a_wrong_count():
    program = _with_communication(3, 2, "zb1p")
    instrs = [x for x in program.devices[1] if x != Instr("W", 1, 1)]
    with pytest.raises(ProgramError, match="1W1 appears 0 times, expected 1"):
        verify_program(_edit(program, 1, instrs), CHAIN)


def test_micro_batch_out_of_range():
    program = _with_communication()
    instrs = list(program.devices[0]) + [Instr("F", 0, 7)]
    with pytest.raises(ProgramError, match="micro-batch 7 but the program has 2"):
        verify_program(_edit(program, 0, instrs), CHAIN)


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
    from pipecompile.ir.programs.topology import topology

    topo = topology(compiled_gpt_graph)
    program = insert_communication(compute_program("gpipe", 4, 2), topology=topo)
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


def test_asynchronous_updates_refuse_tied_stages(compiled_gpt_graph):
    from pipecompile.ir.programs.topology import topology

    topo = topology(compiled_gpt_graph)
    program = insert_communication(compute_program("pipedream", 4, 2), topology=topo)
    with pytest.raises(ProgramError, match="stage 0 holds a parameter tied to another stage"):
        verify_program(program, topo)
