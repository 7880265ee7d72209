"""The machine's calibration: measured once and kept per machine, every figure a finite
positive rate or cost, applied to the cost model as documented, and --tune's ratio folded in;
a calibration beyond the bounds on load or spread measured again, then used with a note and
kept in doubt (made-up measurements), and a record of an older pipecompile measured again."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import pytest

from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.planner import calibrate, calibration_messages, calibration_quality
from pipecompile.planner.calibrate import calibrated, record_path, remember_scale
from pipecompile.planner.calibration_quality import AGAIN_AFTER_S, Quality
from pipecompile.planner.calibration_store import (
    METHOD,
    machine_key,
    read_records,
    write_records,
)
from pipecompile.planner.calibration_timing import FIELDS
from pipecompile.runtime.process.threads import cores, fair_share
from tests.planner.conftest import CONSTANTS


@pytest.fixture
def on(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("PIPECOMPILE_CALIBRATION")
    # One try: on a machine other programs keep busy the figures are checked all the same
    # (a second try would double the measuring, the cost of this test).
    monkeypatch.setattr(calibration_quality, "TRIES", 1)


def test_measured_once_and_applied(on, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    model, key = calibrated(CostModel(), 2)
    entry = json.loads(record_path().read_text())[key]
    positive = ("flops_rate", "elementwise_rate", "optimizer_rate", "instr_overhead", "conv_rate")
    for field in positive:
        assert math.isfinite(entry[field]) and entry[field] > 0, field
    for field in ("op_overhead", "half_work", "conv_half_work"):
        assert math.isfinite(entry[field]) and entry[field] >= 0, field
    ranks = entry["ranks"]["2"]
    assert ranks["message_latency"] > 0 and ranks["bandwidth"] > 0
    # with how it was measured: others' load, each constant's spread, when
    measured = Quality.from_json(entry)
    assert measured is not None and measured.load >= 0 and abs(time.time() - measured.taken) < 600
    assert set(measured.spread) == set(FIELDS) - {"half_work", "conv_half_work"}
    assert all(math.isfinite(s) and s >= 0 for s in measured.spread.values()), measured
    assert entry["method"] == METHOD and Quality.from_json(ranks) is not None
    # applied: the measured rates, and the cores shared when 2 ranks need more than there are
    assert model.flops_rate == entry["flops_rate"] and model.conv_rate == entry["conv_rate"]
    assert model.work_scale == pytest.approx(_scale(entry, 2))  # --tune's ratio, if one is kept
    assert model.message_latency > 0 and model.bandwidth != CostModel().bandwidth
    assert (model.concurrency > 0) == (2 * fair_share(2) > cores())
    # kept: a second call measures nothing
    monkeypatch.setattr(calibrate, "measure", lambda threads: pytest.fail("measured again"))

    def measured_again(*args: object) -> None:
        pytest.fail("measured again")

    monkeypatch.setattr(calibration_messages, "rank_figures", measured_again)
    again, _ = calibrated(CostModel(), 2)
    assert again == model
    # a --flops-rate the user gave is theirs; a --bandwidth too
    given, _ = calibrated(CostModel(flops_rate=3e9, bandwidth=1e9), 2)
    assert given.flops_rate == 3e9 and given.bandwidth == 1e9
    assert given.conv_rate == 0  # convolutions priced at the rate given too


def test_tune_ratios_fold_into_the_kept_scale(on) -> None:  # type: ignore[no-untyped-def]
    model, key = calibrated(CostModel(), 2)
    before = _scale(json.loads(record_path().read_text())[key], 2)
    remember_scale(2, 2.0)
    remember_scale(2, 1.5)
    after = _scale(json.loads(record_path().read_text())[key], 2)
    assert after == pytest.approx(before * 3.0, rel=1e-3)
    scaled, _ = calibrated(CostModel(), 2)
    assert scaled.work_scale == pytest.approx(model.work_scale * 3.0, rel=1e-3)
    assert scaled.fixed_scale == pytest.approx(model.fixed_scale * 3.0, rel=1e-3)
    assert scaled.instr_overhead == pytest.approx(model.instr_overhead * 3.0, rel=1e-3)
    remember_scale(2, 1 / 3.0)  # put it back for the other tests of the session


def _scale(entry: dict, devices: int) -> float:
    return float((entry.get("step_scale") or {}).get(str(devices), 1.0))


def test_a_model_without_calibration_keeps_the_flags(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """PIPECOMPILE_CALIBRATION=off: the search's model is the flags' one, no overheads."""
    from pipecompile.planner.choose import choose_plan
    from tests.conftest import example_spec

    spec = example_spec("mlp")
    _, machine, record = choose_plan(
        spec.model, spec.inputs, devices=2, stages=None, microbatches="auto", schedule="auto",
        virtual_stages=None, recompute="never", split_at=(), machine=CostModel(),
        progress=False,
    )  # fmt: skip
    assert machine == CostModel() and record.cost_model["calibration"] is None


MESSAGES = {"message_latency": 1e-4, "bandwidth": 1e9}


def _now() -> float:
    return float(int(time.time()))


QUIET = Quality(0.02, {"op_overhead": 0.1, "instr_overhead": 0.2})
BUSY = Quality(0.6, {"op_overhead": 0.1})


@pytest.fixture
def made_up(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A cache of its own, and measurements that return made-up figures of the qualities a
    test lists (``made_up.append``); measuring more than listed fails."""
    monkeypatch.setenv("PIPECOMPILE_CACHE", str(tmp_path))
    listed: list[Quality] = []

    def measured(threads: int) -> tuple[dict[str, float], Quality]:
        if not listed:
            pytest.fail("measured again")
        return dict(CONSTANTS), replace(listed.pop(0), taken=_now())

    def messages(devices: int, threads: int) -> tuple[dict[str, float], Quality]:
        if not listed:
            pytest.fail("messages measured again")
        return dict(MESSAGES), replace(listed.pop(0), taken=_now())

    monkeypatch.setattr(calibrate, "_measured_constants", measured)
    monkeypatch.setattr(calibration_messages, "_measured_messages", messages)
    monkeypatch.setattr(calibration_messages, "load_now", lambda: pytest.fail("load read"))
    return listed


def test_the_record_keeps_how_it_was_measured(made_up) -> None:  # type: ignore[no-untyped-def]
    made_up += [QUIET, QUIET]
    said: list[str] = []
    model, key = calibrated(CostModel(), 2, said.append)
    assert said == [
        f"calibrating the cost model at {fair_share(2)} threads (once; kept in {record_path()})",
        "calibrating messages between 2 ranks (none kept yet)",
    ]
    entry = read_records()[key]
    assert {f: entry[f] for f in FIELDS} == CONSTANTS and entry["method"] == METHOD
    assert Quality.from_json(entry) == replace(QUIET, taken=Quality.from_json(entry).taken)
    assert Quality.from_json(entry["ranks"]["2"]).load == QUIET.load
    assert model.instr_overhead == CONSTANTS["instr_overhead"]
    assert calibrated(CostModel(), 2) == (model, key)  # kept: nothing measured again


def test_a_record_of_an_older_pipecompile_is_measured_again(made_up) -> None:  # type: ignore[no-untyped-def]
    key = machine_key(fair_share(1))
    write_records({key: {**CONSTANTS, "flops_rate": 1e6, "threads": fair_share(1), "method": 2}})
    made_up.append(QUIET)
    said: list[str] = []
    model, _ = calibrated(CostModel(), 1, said.append)
    assert "(the one kept was measured by an older pipecompile; kept in" in said[0]
    assert model.flops_rate == CONSTANTS["flops_rate"] and not made_up
    assert read_records()[key]["method"] == METHOD


def test_a_busy_calibration_is_measured_again_then_used_with_a_note(
    made_up, capsys, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    made_up += [BUSY, BUSY]
    said: list[str] = []
    model, key = calibrated(CostModel(), 1, said.append)
    assert not made_up and "again (try 2 of 2): other programs kept 60% of the" in said[1]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("pipecompile: note: the cost model's calibration")
    assert "(measured now) is in doubt: other programs kept 60% of the" in err[0]
    assert "predictions may be off" in err[0] and "`pipecompile calibration --clear`" in err[0]
    assert model.flops_rate == CONSTANTS["flops_rate"]  # used all the same
    # kept in doubt: a search within AGAIN_AFTER_S uses it, noting the doubt where it reports
    # progress, and silently where it does not (--tune's rebuilds)
    assert calibrated(CostModel(), 1, said.append)[0] == model
    assert "is in doubt" in capsys.readouterr().err
    calibrated(CostModel(), 1)
    assert capsys.readouterr().err == ""
    # later, on a machine still busy: used; on a quiet one: measured again
    records = read_records()
    records[key]["taken"] = Quality(0.6, {}, _now() - AGAIN_AFTER_S - 1).as_json()["taken"]
    write_records(records)
    monkeypatch.setattr(calibration_messages, "load_now", lambda: 0.9)
    assert calibrated(CostModel(), 1)[0] == model
    monkeypatch.setattr(calibration_messages, "load_now", lambda: 0.0)
    made_up.append(QUIET)
    calibrated(CostModel(), 1, said.append)
    assert not made_up and "the machine is quiet now" in said[-1]
    assert Quality.from_json(read_records()[key]).load == QUIET.load


def test_busy_messages_are_noted_as_such(made_up, capsys) -> None:  # type: ignore[no-untyped-def]
    made_up += [QUIET, BUSY, BUSY]
    calibrated(CostModel(), 2, say=lambda line: None)  # progress on (no -q)
    err = capsys.readouterr().err
    assert "note: the calibration of messages between 2 ranks (measured now) is in doubt" in err
    assert "cost model's calibration" not in err  # the constants were measured quiet
