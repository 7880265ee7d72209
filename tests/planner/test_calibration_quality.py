"""The calibration's trust decisions on made-up readings: others' load from two readings, the
bounds on load and spread, when a kept calibration is measured again, and the tries."""

from __future__ import annotations

import math

import pytest

from pipecompile.planner import calibration_quality as quality
from pipecompile.planner.calibration_quality import (
    AGAIN_AFTER_S,
    LOAD_BOUND,
    SPREAD_BOUND,
    TRIES,
    Quality,
    Reading,
    doubt,
    others_load,
    until_trusted,
    watched,
    why_measure,
)
from pipecompile.planner.calibration_timing import spread

QUIET = Quality(0.02, {"op_overhead": 0.1, "instr_overhead": 0.2}, 1_000_000.0)
BUSY = Quality(0.6, {"op_overhead": 0.1}, 1_000_000.0)
NOISY = Quality(0.0, {"op_overhead": 0.1, "elementwise_rate": 4.3}, 1_000_000.0)


def test_others_load_is_the_cores_busy_time_less_ours() -> None:
    before = Reading(at=10.0, busy=100.0, ours=5.0, load_average=0.9)
    # 2 s on 2 cores: the cores were busy 3 core-seconds, 0.5 of them ours
    after = Reading(at=12.0, busy=103.0, ours=5.5, load_average=1.0)
    assert others_load(before, after, 2) == pytest.approx(2.5 / 4)
    # all of it ours: others kept nothing busy (never below 0)
    mine = Reading(at=12.0, busy=103.0, ours=8.5, load_average=1.0)
    assert others_load(before, mine, 2) == 0.0


def test_without_proc_stat_the_load_average_before_counts() -> None:
    before = Reading(at=10.0, busy=None, ours=5.0, load_average=0.4)
    after = Reading(at=12.0, busy=None, ours=7.0, load_average=1.5)  # raised by ours
    assert others_load(before, after, 2) == 0.4


def test_spread_is_how_far_the_median_repeat_is_from_the_best() -> None:
    assert spread([1.0, 1.0, 2.0]) == 0.0
    assert spread([1.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert spread([0.5]) == 0.0


def test_doubt_names_each_bound_passed_with_its_figures() -> None:
    assert doubt(LOAD_BOUND, {"op_overhead": SPREAD_BOUND}, 2) is None  # at the bounds: fine
    busy = doubt(0.6, {"op_overhead": 0.1}, 2)
    assert busy == "other programs kept 60% of the 2 cores busy (bound 25%)"
    noisy = doubt(0.0, {"op_overhead": 0.1, "elementwise_rate": 4.3}, 4)
    assert noisy == "its timings' repeats spread 430% (elementwise_rate; bound 100%)"
    both = doubt(0.3, {"flops_rate": 1.2}, 8)
    assert both is not None and "30% of the 8 cores" in both and "flops_rate" in both
    assert doubt(0.0, {"op_overhead": math.nan}, 2) is not None  # a NaN is no figure to trust
    assert doubt(0.0, {}, 2) is None  # the message figures keep no spread


def _unasked() -> float:
    raise AssertionError("the machine's load now was read though the decision needed none")


def test_a_kept_calibration_is_measured_again_only_when_it_can_do_better() -> None:
    old = QUIET.taken + AGAIN_AFTER_S + 1
    young = QUIET.taken + AGAIN_AFTER_S - 1
    assert why_measure(None, old, _unasked, 2) == "the one kept records no load or spread"
    assert why_measure(QUIET, old, _unasked, 2) is None  # trusted: kept however old
    assert why_measure(BUSY, young, _unasked, 2) is None  # in doubt, but measured just now
    assert why_measure(BUSY, old, lambda: 0.9, 2) is None  # the machine is still busy
    again = why_measure(BUSY, old, lambda: 0.05, 2)
    assert again is not None and "60% of the 2 cores" in again and "quiet now" in again
    assert why_measure(NOISY, old, lambda: 0.05, 2) is not None


def _tries(*qualities: Quality) -> tuple[list[str], list[str], object]:
    said: list[str] = []
    calls: list[str] = []
    left = list(qualities)

    def once() -> tuple[str, Quality]:
        calls.append("measured")
        return f"figures {len(calls)}", left.pop(0)

    return said, calls, until_trusted(once, "calibrating the cost model", said.append, 2)


def test_a_calibration_beyond_a_bound_is_measured_again_once() -> None:
    assert TRIES == 2
    said, calls, found = _tries(QUIET)
    assert found == ("figures 1", QUIET) and len(calls) == 1 and said == []
    said, calls, found = _tries(BUSY, QUIET)  # a busy spell passed
    assert found == ("figures 2", QUIET) and len(calls) == 2
    assert said == [
        "calibrating the cost model again (try 2 of 2): other programs kept 60% of the 2 "
        "cores busy (bound 25%)"
    ]
    said, calls, found = _tries(BUSY, NOISY)  # still beyond: the last figures, in doubt
    assert found == ("figures 2", NOISY) and len(calls) == 2 and len(said) == 1


def test_watched_reads_the_machine_around_the_measuring(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(quality, "cores", lambda: 2)
    readings = iter([Reading(0.0, 50.0, 1.0, 0.0), Reading(4.0, 56.0, 3.0, 0.0)])
    found, measured = watched(
        lambda: ("figures", {"op_overhead": 0.2}), read=lambda: next(readings), clock=lambda: 7.9
    )
    assert found == "figures"
    assert measured == Quality(load=0.5, spread={"op_overhead": 0.2}, taken=7.0)


def test_quality_round_trips_through_its_record() -> None:
    kept = Quality(0.1234, {"op_overhead": 0.05, "flops_rate": 0.12}, 1_764_000_000.0)
    record = kept.as_json()
    assert record["taken"] == "2025-11-24T16:00:00+00:00"
    assert Quality.from_json(record) == kept
    assert Quality.from_json({"flops_rate": 1.0}) is None  # an older record keeps none
    assert Quality.from_json({**record, "taken": "yesterday"}) is None
