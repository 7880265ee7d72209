"""Instructions and programs: text forms round-trip, bad text is rejected with the line."""

from __future__ import annotations

import pytest

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import OPS, Instr, Op
from pipecompile.ir.programs.program import Program
from pipecompile.schedules import compute_program

GPIPE_3x4 = """\
# pipecompile program: schedule gpipe, 3 stages, 4 micro-batches
# stage -> device: 0 1 2
device 0
  0F0
  0F1
  0F2
  0F3
  0B3
  0B2
  0B1
  0B0
  0STEP
device 1
  1F0
  1F1
  1F2
  1F3
  1B3
  1B2
  1B1
  1B0
  1STEP
device 2
  2F0
  2F1
  2F2
  2F3
  2B3
  2B2
  2B1
  2B0
  2STEP
"""


@pytest.mark.parametrize(
    "text",
    [
        "1F0",
        "0B12",
        "3SEND_F2",
        "2RECV_B0",
        "0STEP",
        "11ALLREDUCE_TIED",
        "2FC3",
        "1I0",
        "1W7",
        "0STASH4",
        "3UPDATE1",
    ],
)
def test_instr_round_trips(text):
    assert str(Instr.parse(text)) == text
    assert Instr.parse(str(Instr.parse(text))) == Instr.parse(text)


@pytest.mark.parametrize(
    "text, message",
    [("F0", "cannot parse"), ("1X0", "unknown instruction op 'X'"), ("1F", "needs a micro-batch"),
     ("0STEP3", "takes no micro-batch")],
)  # fmt: skip
def test_bad_instr_is_rejected(text, message):
    with pytest.raises(ProgramError, match=message):
        Instr.parse(text)


def test_every_op_is_described_prints_as_its_name_and_has_a_handler():
    from pipecompile.runtime.executor import StepExecutor

    assert set(OPS) == set(Op) and all(op.description for op in Op)
    assert [f"{op}" for op in Op] == [str(op) for op in Op] == [op.value for op in Op]
    assert Instr("F", 0, 1).op is Op.F  # an op given as text is the enum from then on
    assert set(StepExecutor.handlers(StepExecutor.__new__(StepExecutor))) == set(Op)


def test_gpipe_golden_table():
    program = compute_program("gpipe", 3, 4)
    assert str(program) == GPIPE_3x4
    assert Program.parse(GPIPE_3x4) == program


def test_program_parse_names_the_line():
    with pytest.raises(ProgramError, match="line 5: cannot parse instruction 'oops'"):
        Program.parse(GPIPE_3x4.replace("  0F1", "  oops"))
    with pytest.raises(ProgramError, match="expected 'device 1'"):
        Program.parse(GPIPE_3x4.replace("device 1", "device 7"))
    with pytest.raises(ProgramError, match="lacks its header"):
        Program.parse("device 0\n  0F0\n")


def test_unknown_schedule():
    with pytest.raises(ProgramError, match="unknown schedule 'zigzag'; available: gpipe"):
        compute_program("zigzag", 2, 2)
