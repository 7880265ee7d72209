"""The simulator: closed-form bubbles with uniform costs, in-flight peaks, deadlocks."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import Instr
from pipecompile.ir.programs.memory_model import peak_inflight, peak_stored_bytes
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.simulate import Costs, simulate
from pipecompile.ir.programs.topology import Topology
from pipecompile.passes import insert_communication
from pipecompile.reports.timeline_text import timeline_text
from pipecompile.schedules import compute_program
from pipecompile.schedules.closed_forms import uniform_bubble

SHAPES = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 8, 32)]


def run(name: str, stages: int, m: int, **options: object):
    program = compute_program(name, stages, m, **options)  # type: ignore[arg-type]
    return simulate(program, Topology.chain(stages), Costs.uniform(stages))


def exact(value: float) -> Fraction:
    return Fraction(value).limit_denominator(10_000)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "pipedream"])
@pytest.mark.parametrize("p, m", SHAPES)
def test_bubble_is_exactly_p_minus_1_over_m_plus_p_minus_1(name, p, m):
    timeline = run(name, p, m)
    assert timeline.makespan == 3 * (m + p - 1)
    assert exact(timeline.bubble_fraction) == Fraction(p - 1, m + p - 1)


@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("p, m", [(p, m) for p, m in SHAPES if m % p == 0])
def test_interleaved_bubble_is_exactly_p_minus_1_over_vm_plus_p_minus_1(p, m, v):
    timeline = run("interleaved", p * v, m, virtual_stages=v)
    assert exact(timeline.bubble_fraction) == Fraction(p - 1, v * m + p - 1)


@pytest.mark.parametrize("p, m", [(p, m) for p, m in SHAPES if m >= p])
def test_zero_bubble_idles_a_third_of_1f1b(p, m):
    zb, base = run("zb1p", p, m), run("1f1b", p, m)
    idle = zb.makespan - 3 * m  # every device works 3m clocks
    assert idle == p - 1  # (p-1)(F + I - W)
    assert 3 * idle <= base.makespan - 3 * m
    assert exact(zb.bubble_fraction) == Fraction(p - 1, 3 * m + p - 1)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 8])
def test_zb2p_reaches_the_flushed_step_bound(p):
    """ZB-H2 idles only the fill, (p-1)/(3m+p-1): no synchronous step does better (the last
    device starts after p-1 forwards), and it holds min(2p-1-j, m) on stage j."""
    for m in range(p, 4 * p + 1):
        timeline = run("zb2p", p, m)
        assert timeline.makespan == 3 * m + p - 1, m
        assert exact(timeline.bubble_fraction) == Fraction(p - 1, 3 * m + p - 1)
        assert timeline.peak_inflight == tuple(min(2 * p - 1 - j, m) for j in range(p)), m


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("p, m", [(p, m) for p, m in SHAPES if m >= p])
def test_looped_bfs_bubble_is_interleaveds(p, m, v):
    timeline = run("looped_bfs", p * v, m, virtual_stages=v)
    assert timeline.makespan == 3 * (v * m + p - 1)
    assert exact(timeline.bubble_fraction) == Fraction(p - 1, v * m + p - 1)
    assert timeline.peak_inflight == (v * m,) * p  # every stage-micro-batch at the turn


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 8])
def test_zbv_idles_only_the_fill(p):
    for m in [p, *range(2 * p, 4 * p + 1)]:
        timeline = run("zbv", 2 * p, m)
        assert timeline.makespan == 6 * m + p - 1, m  # 2 stages x m x (F + I + W) per device
        assert exact(timeline.bubble_fraction) == Fraction(p - 1, 6 * m + p - 1)
    for m in range(p + 1, 2 * p):  # between, a few clocks more from p = 5 on
        assert run("zbv", 2 * p, m).makespan - 6 * m <= (p - 1) + max(0, p - 4), m


@pytest.mark.parametrize("name, memory", [("v_half", lambda p: (p + 2) // 2),
                                          ("v_min", lambda p: (p + 4) // 3)])  # fmt: skip
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 8])
def test_controllable_memory_schedules_hold_their_papers_fraction(p, name, memory):
    """V-Half and V-Min hold the activations of (p+2)//2 and (p+4)//3 micro-batches (2 half
    stages each) where 1F1B holds p, and idle a constant number of clocks from m = p on:
    the closed form ``uniform_bubble`` states (the papers' "about p/2m" and "2p/3m")."""
    for m in range(1, 3 * p + 1):
        timeline = run(name, 2 * p, m)
        assert max(timeline.peak_inflight) == min(2 * memory(p), 2 * m), m
        if m >= p:
            closed = uniform_bubble(compute_program(name, 2 * p, m))
            assert timeline.bubble_fraction == pytest.approx(closed, abs=1e-12), m
    idle = run(name, 2 * p, 2 * p).makespan - 12 * p
    assert idle <= {"v_half": 3.5 * p, "v_min": 4 * p}[name]  # within the papers' estimates


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 8])
def test_dualpipev_idles_only_the_fill_and_holds_2p_plus_1(p):
    for m in range(2 * p, 4 * p + 1):
        timeline = run("dualpipev", 2 * p, m)
        assert timeline.makespan == 6 * m + p - 1, m
        assert timeline.peak_inflight == (2 * p + 1,) * p, m  # DualPipe's PP + 1, PP = 2p


@pytest.mark.parametrize("p, m", SHAPES)
def test_peak_inflight(p, m):
    assert run("gpipe", p, m).peak_inflight == (m,) * p
    assert run("1f1b", p, m).peak_inflight == tuple(min(p - j, m) for j in range(p))
    assert run("pipedream", p, m).peak_inflight == tuple(min(p - j, m) for j in range(p))
    assert run("zb1p", p, m).peak_inflight == (min(p, m),) * p
    # 2p half stages: p micro-batches of activations, 1F1B's first device
    assert run("zbv", 2 * p, m).peak_inflight == (min(2 * p, 2 * m),) * p


def test_communication_costs_nothing_and_changes_nothing():
    program = compute_program("1f1b", 4, 8)
    full = insert_communication(program, topology=Topology.chain(4))
    a = simulate(program, Topology.chain(4), Costs.uniform(4))
    b = simulate(full, Topology.chain(4), Costs.uniform(4))
    assert a.makespan == b.makespan and a.peak_inflight == b.peak_inflight


def test_costs_scale_the_timeline():
    program = compute_program("gpipe", 2, 2)
    timeline = simulate(program, Topology.chain(2), Costs((1.0, 3.0), (2.0, 6.0)))
    # stage 1 is three times slower: F0 F1 on device 1 take 3 each, then B1 B0 take 6 each
    assert timeline.makespan == 1 + 3 + 3 + 6 + 6 + 2


def test_checkpointed_backward_pays_for_the_recomputation():
    program = compute_program("gpipe", 1, 1)
    checkpointed = Program(
        "gpipe", 1, (0,), ((Instr("FC", 0, 0), Instr("B", 0, 0), Instr("STEP", 0)),)
    )
    plain = simulate(program, Topology.chain(1), Costs.uniform(1)).makespan
    assert simulate(checkpointed, Topology.chain(1), Costs.uniform(1)).makespan == plain + 1


def test_deadlock_shows_where_each_device_is_stuck():
    program = compute_program("gpipe", 2, 1)
    swapped = Program(
        "gpipe",
        1,
        (0, 1),
        (program.devices[0], (Instr("B", 1, 0), Instr("F", 1, 0), Instr("STEP", 1))),
    )
    with pytest.raises(ProgramError, match=r"deadlocks(.|\n)*>> \[0\] 1B0"):
        simulate(swapped, Topology.chain(2), Costs.uniform(2))


def test_timeline_text_draws_the_1f1b_table():
    text = timeline_text(run("1f1b", 2, 2))
    assert text.splitlines()[1:] == [
        "device 0 F0  F1  .   .   B0  B0  .   B1  B1",
        "device 1 .   F0  B0  B0  F1  B1  B1  .   .",
    ]


def test_stored_bytes_follow_forward_checkpoint_and_recompute():
    saved, inputs = [100, 40], [10, 4]
    plain = compute_program("gpipe", 2, 3)
    assert peak_stored_bytes(plain, saved, inputs) == (300, 120)
    devices = tuple(
        tuple(Instr("FC", x.stage, x.microbatch) if x.op == "F" else x for x in d)
        for d in plain.devices
    )
    checkpointed = Program("gpipe", 3, (0, 1), devices)
    # three stored inputs, then one micro-batch recomputed in full while the others wait
    assert peak_stored_bytes(checkpointed, saved, inputs) == (100 + 2 * 10, 40 + 2 * 4)
    assert peak_inflight(checkpointed) == (3, 3)
