"""The machine's calibration: measured once and kept per machine, every figure a finite
positive rate or cost, applied to the cost model as documented, and --tune's ratio folded in."""

from __future__ import annotations

import json
import math

import pytest

from pipecompile.ir.cost_model import CostModel
from pipecompile.planner import calibrate
from pipecompile.planner.calibrate import calibrated, record_path, remember_scale
from pipecompile.runtime.threads import cores, fair_share


@pytest.fixture
def on(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("PIPECOMPILE_CALIBRATION")


def test_measured_once_and_applied(on, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    model, key = calibrated(CostModel(), 2)
    entry = json.loads(record_path().read_text())[key]
    for field in ("flops_rate", "elementwise_rate", "optimizer_rate", "instr_overhead"):
        assert math.isfinite(entry[field]) and entry[field] > 0, field
    assert entry["op_overhead"] >= 0 and entry["half_work"] >= 0
    ranks = entry["ranks"]["2"]
    assert ranks["message_latency"] > 0 and ranks["bandwidth"] > 0
    # applied: the measured rates, and the cores shared when 2 ranks need more than there are
    assert model.flops_rate == pytest.approx(entry["flops_rate"] / _scale(entry, 2))
    assert model.message_latency > 0 and model.bandwidth != CostModel().bandwidth
    assert (model.concurrency > 0) == (2 * fair_share(2) > cores())
    # kept: a second call measures nothing
    monkeypatch.setattr(calibrate, "measure", lambda threads: pytest.fail("measured again"))
    monkeypatch.setattr(calibrate, "_rank_figures", lambda *a: pytest.fail("measured again"))
    again, _ = calibrated(CostModel(), 2)
    assert again == model
    # a --flops-rate the user gave is theirs; a --bandwidth too
    given, _ = calibrated(CostModel(flops_rate=3e9, bandwidth=1e9), 2)
    assert given.flops_rate == pytest.approx(3e9 / _scale(entry, 2)) and given.bandwidth == 1e9


def test_tune_ratios_fold_into_the_kept_scale(on) -> None:  # type: ignore[no-untyped-def]
    model, key = calibrated(CostModel(), 2)
    before = _scale(json.loads(record_path().read_text())[key], 2)
    remember_scale(2, 2.0)
    remember_scale(2, 1.5)
    after = _scale(json.loads(record_path().read_text())[key], 2)
    assert after == pytest.approx(before * 3.0, rel=1e-3)
    scaled, _ = calibrated(CostModel(), 2)
    assert scaled.flops_rate == pytest.approx(model.flops_rate / 3.0, rel=1e-3)
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
    assert machine == CostModel() and record["cost_model"]["calibration"] is None
