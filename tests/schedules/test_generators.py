"""Every schedule generator against a golden table, and its errors for impossible requests."""

from __future__ import annotations

import pytest

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.program import Program
from pipecompile.schedules import SCHEDULES, compute_program


def table(program: Program) -> tuple[str, ...]:
    return tuple(" ".join(str(x) for x in instrs) for instrs in program.devices)


GOLDEN = {
    ("1f1b", 3, 4, ()): (
        "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3 0STEP",
        "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3 1STEP",
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2STEP",
    ),
    ("pipedream", 3, 4, ()): (
        "0STASH0 0F0 0STASH1 0F1 0STASH2 0F2 0B0 0UPDATE0 "
        "0STASH3 0F3 0B1 0UPDATE1 0B2 0UPDATE2 0B3 0UPDATE3",
        "1STASH0 1F0 1STASH1 1F1 1B0 1UPDATE0 1STASH2 1F2 "
        "1B1 1UPDATE1 1STASH3 1F3 1B2 1UPDATE2 1B3 1UPDATE3",
        "2STASH0 2F0 2B0 2UPDATE0 2STASH1 2F1 2B1 2UPDATE1 "
        "2STASH2 2F2 2B2 2UPDATE2 2STASH3 2F3 2B3 2UPDATE3",
    ),
    ("pipedream", 3, 4, (("vertical_sync", True),)): (
        "0STASH0 0STASH1 0STASH2 0F0 0F1 0F2 0B0 0UPDATE0 "
        "0STASH3 0F3 0B1 0UPDATE1 0B2 0UPDATE2 0B3 0UPDATE3",
        "1STASH0 1STASH1 1STASH2 1F0 1F1 1B0 1UPDATE0 1STASH3 "
        "1F2 1B1 1UPDATE1 1F3 1B2 1UPDATE2 1B3 1UPDATE3",
        "2STASH0 2STASH1 2STASH2 2F0 2B0 2UPDATE0 2STASH3 2F1 "
        "2B1 2UPDATE1 2F2 2B2 2UPDATE2 2F3 2B3 2UPDATE3",
    ),
    ("pipedream_2bw", 2, 6, ()): (  # windows of 2: window k stashed after window k-2's update
        "0STASH0 0STASH1 0STASH2 0STASH3 0F0 0F1 0B0 0F2 0B1 0UPDATE1 0STASH4 0STASH5 0F3 0B2 "
        "0F4 0B3 0UPDATE3 0F5 0B4 0B5 0UPDATE5",
        "1STASH0 1STASH1 1STASH2 1STASH3 1F0 1B0 1F1 1B1 1UPDATE1 1STASH4 1STASH5 1F2 1B2 1F3 "
        "1B3 1UPDATE3 1F4 1B4 1F5 1B5 1UPDATE5",
    ),
    ("zb1p", 3, 4, ()): (
        "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3 0STEP",
        "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3 1STEP",
        "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3 2STEP",
    ),
    ("zb2p", 3, 4, ()): (  # stage j holds up to min(2p-1-j, m): 4, 4, 3
        "0F0 0F1 0F2 0F3 0I0 0W0 0I1 0W1 0I2 0W2 0I3 0W3 0STEP",
        "1F0 1F1 1F2 1I0 1F3 1I1 1W0 1I2 1W1 1W2 1I3 1W3 1STEP",
        "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3 2STEP",
    ),
    ("zbv", 4, 3, ()): (  # stages 0 and 3 on device 0, 1 and 2 on device 1
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 0I0 3I1 0W0 3W1 0I1 0W1 3F2 3I2 3W2 0I2 0W2 0STEP 3STEP",
        "1F0 2F0 1F1 2F1 2I0 1I0 2W0 1F2 2I1 1I1 1W0 2F2 2W1 1W1 2I2 1I2 2W2 1W2 1STEP 2STEP",
    ),
    ("v_half", 4, 3, ()): (  # device 1 holds at most 4 = 2 x (p+2)//2 half stages
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 0I0 0W0 3W1 3F2 3I2 3W2 0I1 0W1 0I2 0W2 0STEP 3STEP",
        "1F0 2F0 1F1 2F1 2I0 2W0 1I0 1W0 1F2 2F2 2I1 2W1 1I1 1W1 2I2 2W2 1I2 1W2 1STEP 2STEP",
    ),
    ("v_min", 4, 3, ()): (  # device 0 holds at most 2 half stages, device 1 four
        "0F0 3F0 3I0 3W0 0F1 0I0 0W0 3F1 3I1 3W1 0F2 0I1 0W1 3F2 3I2 3W2 0I2 0W2 0STEP 3STEP",
        "1F0 2F0 2I0 1I0 1F1 2F1 2W0 1W0 2I1 1I1 1F2 2F2 2W1 1W1 2I2 1I2 2W2 1W2 1STEP 2STEP",
    ),
    ("dualpipev", 4, 4, ()): (  # pairs (F, B) of the two stages in the middle; B's, then I/W
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3 0STEP 3STEP",
        "1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3 1STEP 2STEP",
    ),
    ("looped_bfs", 4, 2, (("virtual_stages", 2),)): (
        "0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1 0STEP 2STEP",
        "1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1 1STEP 3STEP",
    ),
    ("interleaved", 4, 4, (("virtual_stages", 2),)): (
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3 0STEP 2STEP",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3 1STEP 3STEP",
    ),
}


@pytest.mark.parametrize("key", list(GOLDEN), ids=lambda k: f"{k[0]}-{k[1]}x{k[2]}")
def test_golden_table(key):
    name, stages, microbatches, options = key
    assert table(compute_program(name, stages, microbatches, **dict(options))) == GOLDEN[key]


def test_zbv_places_the_stages_in_a_v_and_looped_bfs_as_interleaved():
    assert compute_program("zbv", 8, 4).stage_device == (0, 1, 2, 3, 3, 2, 1, 0)
    assert compute_program("looped_bfs", 6, 3, virtual_stages=3).stage_device == (0, 1, 0, 1, 0, 1)


def test_interleaved_places_stage_j_on_device_j_mod_p():
    program = compute_program("interleaved", 6, 3, virtual_stages=2)
    assert program.stage_device == (0, 1, 2, 0, 1, 2)
    assert len(program.devices) == 3


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_schedule_round_trips_as_text(name):
    options = {"virtual_stages": 2} if name in ("interleaved", "looped_bfs") else {}
    program = compute_program(name, 4, 4, **options)
    assert Program.parse(str(program)) == program


_make = compute_program  # the refusals' table fits its lines


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: _make("interleaved", 4, 3), "--microbatches 3 is not a multiple of the 2"),
        (lambda: _make("interleaved", 5, 4), "--stages 5 is not a multiple of --virtual-st"),
        (lambda: _make("interleaved", 4, 4, virtual_stages=1), "at least 2, got 1"),
        (lambda: _make("1f1b", 4, 4, virtual_stages=2), "--virtual-stages applies to the"),
        (lambda: _make("zbv", 4, 4, virtual_stages=2), "--virtual-stages applies to the"),
        (lambda: _make("zbv", 3, 4), "--stages 3 must be even"),
        (lambda: _make("v_half", 5, 4), "v_half places two stages on each device in a V"),
        (lambda: _make("v_min", 1, 4), "--stages 1 must be even"),
        (lambda: _make("dualpipev", 6, 5), "at least 2 x devices = 6 micro-batches"),
        (lambda: _make("looped_bfs", 6, 4, virtual_stages=4), "--stages 6 is not a multiple"),
        (lambda: _make("looped_bfs", 4, 4, virtual_stages=1), "at least 2, got 1"),
        (lambda: _make("gpipe", 4, 4, vertical_sync=True), "--vertical-sync applies to the"),
        (lambda: _make("zb1p", 4, 0), "--microbatches must be at least 1"),
        (lambda: _make("1f1b", 0, 2), "--stages must be at least 1"),
        (lambda: _make("zigzag", 2, 2), "unknown schedule 'zigzag'; available: gpipe, 1f1b"),
    ],
)  # fmt: skip
def test_impossible_requests_are_clear_errors(call, message):
    with pytest.raises(ProgramError, match=message):
        call()
